"""Translate OpenAI request bodies into engine inputs: prompt token ids, SamplingParams and the
structured-output spec. Every refusal is a 400 naming the offending field."""

from __future__ import annotations

import json
from typing import Any

from loraplex.adapters.json_depth import DEFAULT_MAX_JSON_DEPTH, exceeds_depth
from loraplex.engine import RequestError, SamplingParams
from loraplex.grammar.grounding import SourceText
from loraplex.grammar.spec import GrammarError, StructuredSpec
from loraplex.platform.domain_errors import refused
from loraplex.platform.errors import ApiError, bad_request
from loraplex.platform.generation.run import ChoiceInput
from loraplex.platform.json_body import too_deep
from loraplex.platform.openai import tool_prompt
from loraplex.platform.openai.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
    ToolDef,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


# Known fields refused unless at their neutral value: (field, neutral value, what it asks for)
_REFUSED_UNLESS_NEUTRAL = (
    ("use_beam_search", False, "beam search"),
    ("length_penalty", 1.0, "a beam-search length penalty"),
    ("include_stop_str_in_output", False, "stop strings kept in the output"),
    ("allowed_token_ids", None, "an allow-list of token ids"),
    ("bad_words", None, "banned words"),
    ("truncate_prompt_tokens", None, "prompt truncation"),
    ("logits_processors", None, "custom logits processors"),
    ("return_tokens_as_token_ids", False, "tokens reported as token ids"),
    ("guided_decoding_backend", None, "a choice of structured-output backend"),
    ("guided_whitespace_pattern", None, "a whitespace pattern for JSON output"),
)
_REFUSED_STRUCTURED = (
    ("structural_tag", "structural tags"),
    ("disable_any_whitespace", "a whitespace option"),
    ("disable_additional_properties", "a schema option"),
    ("whitespace_pattern", "a whitespace pattern for JSON output"),
)


def _refused(param: str, what: str) -> ApiError:
    return bad_request(
        f"{param} ({what}) is not supported by this server; leave it out", param=param, code="unsupported_parameter"
    )


def refuse_unsupported(req: SamplingFields) -> None:
    """Known fields this server cannot honour: a 400 naming each (the first found), never a silent drop."""
    for field, neutral, what in _REFUSED_UNLESS_NEUTRAL:
        if getattr(req, field) != neutral:
            raise _refused(field, what)
    if req.structured_outputs is not None:
        for field, what in _REFUSED_STRUCTURED:
            if getattr(req.structured_outputs, field) is not None:
                raise _refused(f"structured_outputs.{field}", what)
    if req.prompt_logprobs is not None and req.stream:
        raise bad_request("prompt_logprobs cannot be streamed (send stream: false)", param="prompt_logprobs")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options needs stream: true", param="stream_options")
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    if isinstance(req, CompletionRequest):
        if req.suffix:
            raise bad_request("suffix is not supported by this server", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request("best_of other than n is not supported by this server", param="best_of")


def logit_bias(req: SamplingFields, vocab_size: int) -> dict[int, float] | None:
    """`logit_bias` with token ids as integers, each within the vocabulary (else a 400 naming it)."""
    if not req.logit_bias:
        return None
    bias: dict[int, float] = {}
    for key, value in req.logit_bias.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if not 0 <= token < vocab_size or str(token) != key.strip():
            raise bad_request(
                f"logit_bias key {key!r} is not a token id of this model (integers in [0, {vocab_size}))",
                param="logit_bias",
            )
        bias[token] = value
    return bias


# ------------------------------------------------------------------------------------- prompts


def echo_texts(tokenizer: Any, req: CompletionRequest) -> list[str] | None:
    """With echo, each prompt's text as the response repeats it (token-id prompts decoded); else None."""
    if not req.echo:
        return None
    prompts = req.prompt if isinstance(req.prompt, list) and req.prompt else [req.prompt]
    if all(isinstance(t, int) for t in prompts):  # one prompt of token ids
        prompts = [prompts]
    return [p if isinstance(p, str) else tokenizer.decode(p, skip_special_tokens=False) for p in prompts]


def chat_sources(chat: list[ChatMessage]) -> tuple[SourceText, ...]:
    """What grounded values may copy from in a chat: each user message's text (its text parts joined, as the
    template gets them), with its index in ``messages``."""
    sources = []
    for i, m in enumerate(chat):
        if m.role != "user":
            continue
        if isinstance(m.content, list):
            text = "".join(part.text or "" for part in m.content if part.type == "text")
        else:
            text = m.content or ""
        sources.append(SourceText(i, text))
    return tuple(sources)


def completion_prompts(tokenizer: Any, prompt: Any) -> list[list[int]]:
    """`prompt` as a list of token-id prompts: str, [str, ...], [int, ...] or [[int, ...], ...]."""
    if isinstance(prompt, str):
        return [_encode(tokenizer, prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [_encode(tokenizer, p) for p in prompt]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(
            isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt
        ):
            return [list(p) for p in prompt]
    raise bad_request(
        "prompt must be a non-empty string, a list of strings, a list of token ids, or a list of token-id lists",
        param="prompt",
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    if not text:
        raise bad_request("prompt must not be empty", param="prompt")
    return list(tokenizer.encode(text))


def chat_prompt(tokenizer: Any, req: ChatCompletionRequest) -> list[int]:
    return chat_template_ids(
        tokenizer,
        req.messages,
        req.add_generation_prompt,
        req.continue_final_message,
        req.chat_template_kwargs,
        tools=req.tools,
        show_tools=tool_prompt.show_tools(req),
    )


def chat_template_ids(
    tokenizer: Any,
    chat: list[ChatMessage],
    add_generation_prompt: bool,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    add_special_tokens: bool = False,
    tools: list[ToolDef] | None = None,
    show_tools: bool = False,
) -> list[int]:
    """The messages (with their tool calls and results, and the tools when shown) through the model's chat
    template, as token ids (the template writes special tokens)."""
    contents = []
    for i, m in enumerate(chat):
        if isinstance(m.content, list):
            texts = []
            for part in m.content:
                others = (part.image_url, part.input_audio, part.file, part.refusal)
                if part.type != "text" or part.text is None or any(x is not None for x in others):
                    raise bad_request(
                        f"messages[{i}]: content part type {part.type!r} is not supported (text only)",
                        param=f"messages[{i}].content",
                    )
                texts.append(part.text)
            content = "".join(texts)
        else:
            content = m.content or ""
        contents.append(content)
    messages, template_kwargs = tool_prompt.render_messages(tokenizer, chat, tools, contents, show_tools)
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            **{**template_kwargs, **(chat_template_kwargs or {})},
        )
    except Exception as exc:  # jinja errors from the model's template name the problem
        raise bad_request(f"the chat template rejected the messages: {exc}", param="messages") from None
    ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    if not ids:
        raise bad_request("the chat prompt is empty", param="messages")
    return ids


def resolve_max_tokens(
    prompt_len: int, requested: int | None, default: int | None, max_model_len: int, param: str
) -> int:
    """The generation budget; a prompt or prompt + max_tokens over the context length is a 400."""
    if prompt_len >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens (prompt plus at least one generated token must fit)",
            param="messages" if param == "max_completion_tokens" else "prompt",
            code="context_length_exceeded",
        )
    room = max_model_len - prompt_len
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens: the prompt has "
            f"{prompt_len} tokens and {param} is {requested}, together over the limit by "
            f"{requested - room}",
            param=param,
            code="context_length_exceeded",
        )
    return requested


# ---------------------------------------------------------------------------------- parameters


def sampling_params(
    req: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    structured: StructuredSpec | None,
    bias: dict[int, float] | None = None,
    sources: tuple[SourceText, ...] | None = None,
    reasoning: bool = False,
) -> list[SamplingParams]:
    """One SamplingParams per choice (n); with a seed, choice i uses seed + i so choices differ."""
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    prompt_logprobs = req.prompt_logprobs
    if isinstance(req, CompletionRequest) and req.echo and req.logprobs is not None:
        prompt_logprobs = max(prompt_logprobs or 0, req.logprobs)  # echo with logprobs reports the prompt's too
    params = []
    for i in range(req.n):
        try:
            params.append(
                SamplingParams(
                    max_tokens=max_tokens,
                    temperature=1.0 if req.temperature is None else req.temperature,
                    top_p=1.0 if req.top_p is None else req.top_p,
                    top_k=req.top_k if req.top_k is not None else 0,
                    min_p=req.min_p or 0.0,
                    seed=None if req.seed is None else req.seed + i,
                    stop=stop,
                    stop_token_ids=list(req.stop_token_ids or []),
                    ignore_eos=req.ignore_eos,
                    logprobs=logprobs,
                    min_tokens=req.min_tokens,
                    structured=structured,
                    skip_special_tokens=req.skip_special_tokens,
                    presence_penalty=req.presence_penalty or 0.0,
                    frequency_penalty=req.frequency_penalty or 0.0,
                    repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                    logit_bias=bias,
                    prompt_logprobs=prompt_logprobs,
                    field_logprobs=req.field_logprobs,
                    grounding_sources=sources,
                    reasoning=reasoning,
                )
            )
        except RequestError as exc:
            raise refused(exc, param=exc.field) from None
    return params


def choice_inputs(
    tokenizer: Any,
    max_model_len: int,
    req: CompletionRequest | ChatCompletionRequest,
    spec: StructuredSpec | None,
    vocab_size: int | None = None,
    reasoning: bool = False,
) -> list[ChoiceInput]:
    """One engine input per choice: ``n`` per prompt (a completion request may carry several prompts).
    ``vocab_size``: logit_bias token ids are checked against it here (else by the engine, without `param`)."""
    bias = logit_bias(req, vocab_size if vocab_size is not None else 2**63)
    if isinstance(req, ChatCompletionRequest):
        prompt_ids = chat_prompt(tokenizer, req)
        requested, param = (
            (req.max_completion_tokens, "max_completion_tokens")
            if req.max_completion_tokens is not None
            else (req.max_tokens, "max_tokens")
        )
        max_tokens = resolve_max_tokens(len(prompt_ids), requested, None, max_model_len, param)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = sampling_params(req, max_tokens, logprobs, spec, bias, chat_sources(req.messages), reasoning)
        return [ChoiceInput(i, prompt_ids, p) for i, p in enumerate(params)]
    inputs: list[ChoiceInput] = []
    for p, ids in enumerate(completion_prompts(tokenizer, req.prompt)):
        max_tokens = resolve_max_tokens(
            len(ids), req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, max_model_len, "max_tokens"
        )
        prompt = req.prompt[p] if isinstance(req.prompt, list) and isinstance(req.prompt[p], str) else req.prompt
        text = prompt if isinstance(prompt, str) else tokenizer.decode(ids)
        sources = (SourceText(0, text),)
        for i, params in enumerate(sampling_params(req, max_tokens, req.logprobs, spec, bias, sources)):
            inputs.append(ChoiceInput(p * req.n + i, ids, params))
    return inputs


def structured_request(req: SamplingFields, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH) -> dict[str, Any] | None:
    """The one structured-output constraint of the request, as {kind: value}; several is a 400.

    Kinds: json (a schema dict), json_object (True), regex, choice (list), grammar (text)."""
    found: list[tuple[str, str, Any]] = []  # (field, kind, value)
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        found.append(("response_format", "json_object", True))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema is None:
            raise bad_request("response_format json_schema needs json_schema.schema", param="response_format")
        found.append(("response_format", "json", rf.json_schema.schema))
    so = req.structured_outputs
    if so is not None:
        for kind in ("json", "regex", "choice", "grammar"):
            if getattr(so, kind) is not None:
                found.append((f"structured_outputs.{kind}", kind, getattr(so, kind)))
        if so.json_object:
            found.append(("structured_outputs.json_object", "json_object", True))
    for field, kind in (
        ("guided_json", "json"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ):
        if getattr(req, field) is not None:
            found.append((field, kind, getattr(req, field)))
    if not found:
        return None
    if len(found) > 1:
        raise bad_request(
            "only one structured-output constraint may be given, got " + ", ".join(f for f, _, _ in found),
            param=found[1][0],
        )
    field, kind, value = found[0]
    if kind == "json" and isinstance(value, str):
        if exceeds_depth(value, max_json_depth):  # before json.loads, which recurses per level
            raise too_deep(field, max_json_depth, param=field)
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise bad_request(f"{field} is not valid JSON: {exc}", param=field) from None
    if kind == "json" and not isinstance(value, (dict, bool)):
        raise bad_request(f"{field} must be a JSON schema object", param=field)
    if kind == "choice" and (not value or not all(isinstance(c, str) and c for c in value)):
        raise bad_request(f"{field} must be a non-empty list of non-empty strings", param=field)
    if kind in ("regex", "grammar") and not value:
        raise bad_request(f"{field} must not be empty", param=field)
    return {"field": field, "kind": kind, "value": value}


def structured_spec(structured: dict[str, Any] | None, allow_narrowing: bool = True) -> StructuredSpec | None:
    """The engine's StructuredSpec for `structured_request`'s result (None: unconstrained)."""
    if structured is None:
        return None
    try:
        return StructuredSpec(**{structured["kind"]: structured["value"]}, allow_narrowing=allow_narrowing)
    except GrammarError as exc:
        raise refused(exc, param=structured["field"]) from None
