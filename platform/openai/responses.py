"""Build OpenAI response bodies and SSE chunks from engine outputs."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

import msgspec

from loraplex.engine import RequestOutput, TokenLogprob
from loraplex.platform.errors import error_body
from loraplex.platform.generation.run import Generation
from loraplex.platform.generation.token_texts import TokenTexts
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
    FieldLogprobEntry,
    FieldLogprobs,
    GroundedValueEntry,
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    TopLogprob,
    Usage,
)
from loraplex.platform.openai.tool_output import ToolStreamer, tool_message
from loraplex.platform.openai.tools import ToolMode, tool_mode

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


def prompt_logprobs(items: Sequence[TokenLogprob | None] | None, text: TokenTexts) -> PromptLogprobs | None:
    """vLLM's `prompt_logprobs`: per prompt token (None for the first), its own and the top tokens' logprobs."""
    if items is None:
        return None
    out: PromptLogprobs = []
    for lp in items:
        if lp is None:
            out.append(None)
            continue
        entry = {str(i): PromptLogprob(logprob=v, decoded_token=text(i)) for i, _, v in lp.top}
        entry[str(lp.token_id)] = PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=text(lp.token_id))
        out.append(entry)
    return out


def echo_logprobs(
    prompt_ids: Sequence[int], items: Sequence[TokenLogprob | None] | None, text: TokenTexts
) -> CompletionLogprobs:
    """The echoed prompt's part of a completion's logprobs (the first token's are null)."""
    out = CompletionLogprobs()
    offset = 0
    for j, token_id in enumerate(prompt_ids):
        lp = items[j] if items is not None else None
        token = text(token_id)
        out.tokens.append(token)
        out.token_logprobs.append(None if lp is None else lp.logprob)
        out.top_logprobs.append(None if lp is None else {text(i): v for i, _, v in lp.top})
        out.text_offset.append(offset)
        offset += len(token)
    return out


def completion_logprobs(
    items: Sequence[TokenLogprob], offset: int, text: TokenTexts, out: CompletionLogprobs | None = None
) -> CompletionLogprobs:
    out = out if out is not None else CompletionLogprobs()
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


def field_logprobs(out: RequestOutput) -> FieldLogprobs | None:
    """A finished choice's `field_logprobs` (asked for with the request field of that name)."""
    if out.field_logprobs is None:
        return None
    return {
        pointer: FieldLogprobEntry(logprob=f.logprob, min_logprob=f.min_logprob, tokens=f.tokens)
        for pointer, f in out.field_logprobs.items()
    }


def grounded_values(out: RequestOutput, tools: ToolMode | None = None) -> list[GroundedValueEntry] | None:
    """A finished choice's `grounded_values` (its schema has x-loraplex-grounded strings). Tool calls' pointers
    always start with the call's index (``/0/arguments/city``), whichever form the calls were generated in."""
    if out.grounded_values is None:
        return None
    if tools is not None and tools.kind != "auto" and not tools.json_array:  # one call, generated as an object
        return [
            GroundedValueEntry(pointer="/0" + v.pointer, message=v.message, start=v.start, end=v.end)
            for v in out.grounded_values
        ]
    return [
        GroundedValueEntry(pointer=v.pointer, message=v.message, start=v.start, end=v.end) for v in out.grounded_values
    ]


def _all_logprobs(outputs: list[RequestOutput]) -> list[TokenLogprob]:
    return [lp for o in outputs for lp in (o.new_logprobs or [])]


def chat_completion(
    rid: str,
    created: int,
    model: str,
    results: dict[int, list[RequestOutput]],
    want_logprobs: bool,
    text: TokenTexts,
    want_prompt_logprobs: bool = False,
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
        message.reasoning = final.reasoning
        choices.append(
            ChatChoice(
                index=index,
                message=message,
                finish_reason=finish_reason,
                logprobs=chat_logprobs(_all_logprobs(results[index]), text) if want_logprobs else None,
                prompt_logprobs=prompt_logprobs(final.prompt_logprobs, text) if want_prompt_logprobs else None,
                field_logprobs=field_logprobs(final),
                grounded_values=grounded_values(final, tools),
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
    echo: list[str] | None = None,
    want_prompt_logprobs: bool = False,
) -> Completion:
    """``echo``: the prompts' texts, prepended to each of their choices (with their tokens' logprobs)."""
    choices, completion_tokens, prompt_lens, cached = [], 0, {}, 0
    for index in sorted(results):
        final = _final(results[index])
        completion_tokens += len(final.token_ids)
        prompt_lens[index // n] = final.num_prompt_tokens
        cached = max(cached, final.num_cached_tokens)
        head = echo[index // n] if echo is not None else ""
        logprobs = None
        if want_logprobs:
            start = echo_logprobs(final.prompt_token_ids, final.prompt_logprobs, text) if echo is not None else None
            logprobs = completion_logprobs(_all_logprobs(results[index]), len(head), text, start)
        choices.append(
            CompletionChoice(
                index=index,
                text=head + final.text,
                finish_reason=final.finish_reason,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs(final.prompt_logprobs, text) if want_prompt_logprobs else None,
                field_logprobs=field_logprobs(final),
                grounded_values=grounded_values(final),
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
    continuous_usage: bool = False,
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
            if not out.new_text and not out.new_reasoning and not out.finished:
                continue
            logprobs = chat_logprobs(out.new_logprobs or [], text) if want_logprobs else None
            if index in streamers:
                deltas, finish_reason = streamers[index].feed(out.new_text, out.finish_reason)
            else:
                deltas, finish_reason = [ChatDelta(content=out.new_text)], out.finish_reason
            if out.new_reasoning:
                deltas.insert(0, ChatDelta(reasoning=out.new_reasoning))
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
                                field_logprobs=field_logprobs(out) if last else None,
                                grounded_values=grounded_values(out, tools) if last else None,
                            )
                        ],
                        usage=(
                            usage([prompt_len], sum(tokens.values()), cached) if continuous_usage and last else None
                        ),
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
    echo: list[str] | None = None,
    continuous_usage: bool = False,
) -> AsyncGenerator[bytes, None]:
    """SSE events of a streamed completion; with ``echo`` each choice's first event starts with its prompt."""
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
            head, start = "", None
            if echo is not None and index not in offsets:
                head = echo[index // n]
                start = echo_logprobs(out.prompt_token_ids, out.prompt_logprobs, text) if want_logprobs else None
                offsets[index] = len(head)
            elif not out.new_text and not out.finished:
                continue
            logprobs = (
                completion_logprobs(out.new_logprobs or [], offsets.get(index, 0), text, start)
                if want_logprobs
                else None
            )
            offsets[index] = offsets.get(index, 0) + len(out.new_text)
            yield sse(
                Completion(
                    id=rid,
                    created=created,
                    model=model,
                    choices=[
                        CompletionChoice(
                            index=index,
                            text=head + out.new_text,
                            finish_reason=out.finish_reason,
                            logprobs=logprobs,
                            field_logprobs=field_logprobs(out),
                            grounded_values=grounded_values(out),
                        )
                    ],
                    usage=(
                        usage(list(prompt_lens.values()), sum(tokens.values()), cached) if continuous_usage else None
                    ),
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
    echo: list[str] | None = None,
) -> Completion | ChatCompletion:
    """The JSON response of a finished generation request, in the shape of its route."""
    want_prompt = req.prompt_logprobs is not None
    if isinstance(req, ChatCompletionRequest):
        return chat_completion(rid, created, req.model, results, req.logprobs, text, want_prompt, tool_mode(req))
    return completion(rid, created, req.model, results, req.n, req.logprobs is not None, text, echo, want_prompt)


def stream(
    gen: Generation,
    rid: str,
    created: int,
    req: CompletionRequest | ChatCompletionRequest,
    include_usage: bool,
    text: TokenTexts,
    echo: list[str] | None = None,
) -> AsyncGenerator[bytes, None]:
    """The server-sent events of a streamed generation request, in the shape of its route."""
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    if isinstance(req, ChatCompletionRequest):
        return chat_stream(gen, rid, created, req.model, req.logprobs, include_usage, text, continuous, tool_mode(req))
    return completion_stream(
        gen, rid, created, req.model, req.n, req.logprobs is not None, include_usage, text, echo, continuous
    )
