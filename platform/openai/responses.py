"""Build OpenAI response bodies and SSE chunks from engine outputs."""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import msgspec

from loraplex.engine import RequestOutput, TokenLogprob
from loraplex.platform.errors import error_body
from loraplex.platform.openai.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    PromptTokensDetails,
    TopLogprob,
    Usage,
)
from loraplex.platform.openai.tool_output import ToolStreamer, tool_message
from loraplex.platform.openai.tools import ToolMode, tool_mode
from loraplex.platform.services.generation import Generation

_encoder = msgspec.json.Encoder()


def sse(payload: object) -> bytes:
    return b"data: " + _encoder.encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def usage(prompt_lens: Sequence[int], completion_tokens: int, cached: int) -> Usage:
    prompt = sum(prompt_lens)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion_tokens,
        total_tokens=prompt + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


class TokenTexts:
    """Token id -> the text it decodes to (OpenAI reports text, not the vocabulary's byte-level form)."""

    def __init__(self, tokenizer: Any) -> None:
        self._text = functools.lru_cache(maxsize=65536)(
            lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False)
        )

    def __call__(self, token_id: int) -> str:
        return self._text(token_id)  # type: ignore[no-any-return]


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", "replace"))


def chat_logprobs(items: Sequence[TokenLogprob], text: TokenTexts) -> ChatLogprobs:
    content = []
    for lp in items:
        tops = [TopLogprob(token=text(i), logprob=v, bytes=_bytes(text(i))) for i, _, v in lp.top]
        content.append(
            ChatTokenLogprob(
                token=text(lp.token_id), logprob=lp.logprob, bytes=_bytes(text(lp.token_id)), top_logprobs=tops
            )
        )
    return ChatLogprobs(content=content)


def completion_logprobs(items: Sequence[TokenLogprob], offset: int, text: TokenTexts) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for lp in items:
        token = text(lp.token_id)
        out.tokens.append(token)
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append({text(i): v for i, _, v in lp.top})
        out.text_offset.append(offset)
        offset += len(token)
    return out


def _final(outputs: list[RequestOutput]) -> RequestOutput:
    return outputs[-1]


def _all_logprobs(outputs: list[RequestOutput]) -> list[TokenLogprob]:
    return [lp for o in outputs for lp in (o.new_logprobs or [])]


def chat_completion(
    rid: str,
    created: int,
    model: str,
    results: dict[int, list[RequestOutput]],
    want_logprobs: bool,
    text: TokenTexts,
    tools: ToolMode | None = None,
) -> ChatCompletion:
    choices, completion, prompt_len, cached = [], 0, 0, 0
    for index in sorted(results):
        final = _final(results[index])
        completion += len(final.token_ids)
        prompt_len, cached = final.num_prompt_tokens, max(cached, final.num_cached_tokens)
        message, finish_reason = (
            tool_message(final.text, final.finish_reason, tools)
            if tools is not None
            else (AssistantMessage(content=final.text), final.finish_reason)
        )
        choices.append(
            ChatChoice(
                index=index,
                message=message,
                finish_reason=finish_reason,
                logprobs=chat_logprobs(_all_logprobs(results[index]), text) if want_logprobs else None,
            )
        )
    return ChatCompletion(
        id=rid, created=created, model=model, choices=choices, usage=usage([prompt_len], completion, cached)
    )


def completion(
    rid: str,
    created: int,
    model: str,
    results: dict[int, list[RequestOutput]],
    n: int,
    want_logprobs: bool,
    text: TokenTexts,
) -> Completion:
    choices, completion_tokens, prompt_lens, cached = [], 0, {}, 0
    for index in sorted(results):
        final = _final(results[index])
        completion_tokens += len(final.token_ids)
        prompt_lens[index // n] = final.num_prompt_tokens
        cached = max(cached, final.num_cached_tokens)
        choices.append(
            CompletionChoice(
                index=index,
                text=final.text,
                finish_reason=final.finish_reason,
                logprobs=completion_logprobs(_all_logprobs(results[index]), 0, text) if want_logprobs else None,
            )
        )
    return Completion(
        id=rid,
        created=created,
        model=model,
        choices=choices,
        usage=usage(list(prompt_lens.values()), completion_tokens, cached),
    )


async def chat_stream(
    gen: Generation,
    rid: str,
    created: int,
    model: str,
    want_logprobs: bool,
    include_usage: bool,
    text: TokenTexts,
    tools: ToolMode | None = None,
) -> AsyncGenerator[bytes, None]:
    """SSE events of a streamed chat completion; closing this iterator aborts the generation."""
    streamers = {ch.index: ToolStreamer(tools) for ch in gen.choices} if tools is not None else {}
    tokens: dict[int, int] = {}
    prompt_len = cached = 0
    try:
        for ch in gen.choices:
            yield sse(
                ChatCompletionChunk(
                    id=rid,
                    created=created,
                    model=model,
                    choices=[ChatChunkChoice(index=ch.index, delta=ChatDelta(role="assistant", content=""))],
                )
            )
        async for index, out in gen.outputs():
            if out.finish_reason == "error":
                yield sse(error_body(500, out.error or "engine error", None, "engine_error"))
                return
            tokens[index] = len(out.token_ids)
            prompt_len, cached = out.num_prompt_tokens, max(cached, out.num_cached_tokens)
            if not out.new_text and not out.finished:
                continue
            logprobs = chat_logprobs(out.new_logprobs or [], text) if want_logprobs else None
            if index in streamers:
                deltas, finish_reason = streamers[index].feed(out.new_text, out.finish_reason)
            else:
                deltas, finish_reason = [ChatDelta(content=out.new_text)], out.finish_reason
            if not deltas and (finish_reason is not None or logprobs is not None):
                deltas = [ChatDelta()]
            for k, delta in enumerate(deltas):  # one tool-call delta per chunk, as OpenAI sends them
                last = k == len(deltas) - 1
                yield sse(
                    ChatCompletionChunk(
                        id=rid,
                        created=created,
                        model=model,
                        choices=[
                            ChatChunkChoice(
                                index=index,
                                delta=delta,
                                finish_reason=finish_reason if last else None,
                                logprobs=logprobs if last else None,
                            )
                        ],
                    )
                )
        if include_usage:
            yield sse(
                ChatCompletionChunk(
                    id=rid,
                    created=created,
                    model=model,
                    choices=[],
                    usage=usage([prompt_len], sum(tokens.values()), cached),
                )
            )
        yield SSE_DONE
    finally:
        await gen.close()


async def completion_stream(
    gen: Generation,
    rid: str,
    created: int,
    model: str,
    n: int,
    want_logprobs: bool,
    include_usage: bool,
    text: TokenTexts,
) -> AsyncGenerator[bytes, None]:
    tokens: dict[int, int] = {}
    prompt_lens: dict[int, int] = {}
    offsets: dict[int, int] = {}
    cached = 0
    try:
        async for index, out in gen.outputs():
            if out.finish_reason == "error":
                yield sse(error_body(500, out.error or "engine error", None, "engine_error"))
                return
            tokens[index] = len(out.token_ids)
            prompt_lens[index // n] = out.num_prompt_tokens
            cached = max(cached, out.num_cached_tokens)
            if not out.new_text and not out.finished:
                continue
            logprobs = (
                completion_logprobs(out.new_logprobs or [], offsets.get(index, 0), text) if want_logprobs else None
            )
            offsets[index] = offsets.get(index, 0) + len(out.new_text)
            yield sse(
                Completion(
                    id=rid,
                    created=created,
                    model=model,
                    choices=[
                        CompletionChoice(
                            index=index, text=out.new_text, finish_reason=out.finish_reason, logprobs=logprobs
                        )
                    ],
                )
            )
        if include_usage:
            yield sse(
                Completion(
                    id=rid,
                    created=created,
                    model=model,
                    choices=[],
                    usage=usage(list(prompt_lens.values()), sum(tokens.values()), cached),
                )
            )
        yield SSE_DONE
    finally:
        await gen.close()


def body(
    rid: str,
    created: int,
    req: CompletionRequest | ChatCompletionRequest,
    results: dict[int, list[RequestOutput]],
    text: TokenTexts,
) -> Completion | ChatCompletion:
    """The JSON response of a finished generation request, in the shape of its route."""
    if isinstance(req, ChatCompletionRequest):
        return chat_completion(rid, created, req.model, results, req.logprobs, text, tool_mode(req))
    return completion(rid, created, req.model, results, req.n, req.logprobs is not None, text)


def stream(
    gen: Generation,
    rid: str,
    created: int,
    req: CompletionRequest | ChatCompletionRequest,
    include_usage: bool,
    text: TokenTexts,
) -> AsyncGenerator[bytes, None]:
    """The server-sent events of a streamed generation request, in the shape of its route."""
    if isinstance(req, ChatCompletionRequest):
        return chat_stream(gen, rid, created, req.model, req.logprobs, include_usage, text, tool_mode(req))
    return completion_stream(gen, rid, created, req.model, req.n, req.logprobs is not None, include_usage, text)
