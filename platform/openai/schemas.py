"""OpenAI-compatible request and response bodies (plus vLLM's extra request fields).

Nothing is ignored silently: every request struct, nested ones included, forbids unknown fields (a 400 naming
the field, or with the server option `unknown_fields = "warn"` a response header naming it: see
`platform/unknown_fields.py`); known fields we cannot honour are refused by name in `translate.py`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

PositiveInt = Annotated[int, Meta(ge=1)]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # integers the engine and torch take (vLLM bounds seed the same)
Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]


REQUEST: dict[str, Any] = {"kw_only": True, "forbid_unknown_fields": True}  # every request struct's options


class StreamOptions(Struct, **REQUEST):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk


class JsonSchemaFormat(Struct, **REQUEST):
    name: str = "response"
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Struct, **REQUEST):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(Struct, **REQUEST):
    """vLLM's `structured_outputs` request field: exactly one of these."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # known and refused by name (translate.refuse_unsupported): never dropped, whatever unknown_fields says
    structural_tag: Any = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None


class SamplingFields(Struct, **REQUEST):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None  # token id (a string) -> bias
    # accepted without effect (listed in docs/requests.md)
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    safety_identifier: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM extensions
    top_k: Annotated[int, Meta(ge=-1, le=INT64_MAX)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=1e6)] | None = None
    prompt_logprobs: TopLogprobs | None = None
    min_tokens: Annotated[int, Meta(ge=0, le=INT64_MAX)] = 0
    stop_token_ids: list[Int64] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM fields known and refused by name unless at their neutral value (translate.refuse_unsupported)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[Int64] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: Int64 | None = None
    logits_processors: list[Any] | None = None
    return_tokens_as_token_ids: bool = False
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    # vLLM's scheduling priority (lower is sooner); None: the tenant's priority class, below which it may not ask
    priority: Annotated[int, Meta(ge=-(2**31), le=2**31)] | None = None
    # loraplex: "refuse" turns a schema that can only be enforced narrowed into a 400 instead
    schema_narrowing: Literal["allow", "refuse"] = "allow"
    # loraplex: per leaf of a JSON constraint's output, its tokens' logprobs (each choice's `field_logprobs`)
    field_logprobs: bool = False


class CompletionRequest(SamplingFields, **REQUEST):
    prompt: str | list[Any]  # a string, a list of strings, a list of token ids, or a list of such lists
    logprobs: TopLogprobs | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Int64 | None = None


ToolName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]  # OpenAI's rule for function names


class FunctionDef(Struct, kw_only=True, forbid_unknown_fields=True):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments ({})
    strict: bool | None = None  # every call is enforced against `parameters` whatever this says


class ToolDef(Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Struct, kw_only=True, forbid_unknown_fields=True):
    name: ToolName


class NamedToolChoice(Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["function"]
    function: NamedFunction


class FunctionCall(Struct, **REQUEST):
    name: str
    arguments: str  # the arguments as JSON text


class ToolCall(Struct, **REQUEST):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(Struct, **REQUEST):
    type: str
    text: str | None = None
    # the other parts' payloads, so that their type is what gets refused (translate.chat_prompt)
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


class ChatMessage(Struct, **REQUEST):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages that called tools
    tool_call_id: str | None = None  # tool messages: the call they answer


class ChatCompletionRequest(SamplingFields, **REQUEST):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: true, as OpenAI
    # vLLM extensions
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


# ---------------------------------------------------------------------------------------- responses


class PromptTokensDetails(Struct, kw_only=True):
    cached_tokens: int = 0


class Usage(Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = msgspec.field(default_factory=list)


class ChatLogprobs(Struct, kw_only=True):
    content: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(Struct, kw_only=True):
    """With echo, the prompt's tokens come first; the first prompt token has null logprobs (nothing predicts it)."""

    tokens: list[str] = msgspec.field(default_factory=list)
    token_logprobs: list[float | None] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = msgspec.field(default_factory=list)
    text_offset: list[int] = msgspec.field(default_factory=list)


class PromptLogprob(Struct, kw_only=True):
    """vLLM's prompt_logprobs entry: one per token id (the prompt's own token and the top ones)."""

    logprob: float
    rank: int | None = None
    decoded_token: str


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class AssistantMessage(Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    # with a reasoning parser (vLLM's name; it was reasoning_content): the text of the <think> block
    reasoning: str | None = None


class FunctionDelta(Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, kw_only=True, omit_defaults=True):
    """A streamed tool call: the first delta of a call has its id, type and name (arguments ""), the
    following ones the next fragment of its arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class FieldLogprobEntry(Struct, kw_only=True):
    """One leaf of a constrained JSON output: the sum and the lowest of its tokens' logprobs, and their count."""

    logprob: float
    min_logprob: float
    tokens: int


# by JSON pointer of each leaf value ("" for a scalar root), with `field_logprobs`
FieldLogprobs = dict[str, FieldLogprobEntry]


class GroundedValueEntry(Struct, kw_only=True):
    """Where an x-loraplex-grounded value of the output came from: its JSON pointer (for tool calls, prefixed by
    the call's index), the index in `messages` of the user message it copies (0 for a completion's prompt), and
    the character offsets of the span (`text[start:end]` is the value; its first occurrence)."""

    pointer: str
    message: int
    start: int
    end: int


class ChatChoice(Struct, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None
    field_logprobs: FieldLogprobs | None = None
    grounded_values: list[GroundedValueEntry] | None = None


class ChatCompletion(Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChatDelta(Struct, kw_only=True, omit_defaults=True):
    role: Literal["assistant"] | None = None
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Struct, kw_only=True):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None
    field_logprobs: FieldLogprobs | None = None  # in the choice's last chunk
    grounded_values: list[GroundedValueEntry] | None = None  # in the choice's last chunk


class ChatCompletionChunk(Struct, kw_only=True):
    """One `data:` event of a streamed chat completion (the stream ends with `data: [DONE]`)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(Struct, kw_only=True):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None
    field_logprobs: FieldLogprobs | None = None
    grounded_values: list[GroundedValueEntry] | None = None


class Completion(Struct, kw_only=True):
    """A completion; streamed, each `data:` event has this shape with the text delta (object
    `text_completion`), and the stream ends with `data: [DONE]`."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(Struct, kw_only=True):
    id: str  # for adapters, the globally unique `<tenant>/<adapter>`
    name: str | None = None  # an adapter's short name (what its tenant calls it; also accepted in `model`)
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard] = msgspec.field(default_factory=list)
