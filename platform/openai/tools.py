"""Tool calling, request side: which calls a request allows (`tool_mode`), and the constraint that makes
every call valid (`tool_spec`).

`required` and a named `tool_choice` constrain the whole output to JSON: one call object
{"name": ..., "arguments": ...} (an array of one or more with `parallel_tool_calls`, required only),
whose name is one of the tools and whose arguments validate against that tool's `parameters`.
`auto` lets the model answer in text or call tools as `<tool_call>{call}</tool_call>` (more, newline
separated, with `parallel_tool_calls`); a call, once its tag is written, is held to the same schema. With
`response_format` json_schema (or json_object) beside auto, the answer that is not a call must be that JSON.
Both go through the structured-output pipeline, so the schema rules (draft detection, narrowing,
`schema_narrowing: refuse`, the budget rule) are those of `response_format`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from loraplex.grammar.spec import GrammarError, StructuredSpec
from loraplex.platform.domain_errors import refused
from loraplex.platform.errors import bad_request
from loraplex.platform.openai.schemas import ChatCompletionRequest, FunctionDef, NamedToolChoice

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_ID_BASE = "https://loraplex.invalid/tools/"  # each tool's parameters are their own schema resource


@dataclass(frozen=True)
class ToolMode:
    """What a request's output may be: `auto` (text or tagged calls), `required` or `named` (JSON calls)."""

    kind: Literal["auto", "required", "named"]
    functions: tuple[FunctionDef, ...]  # the callable ones (named: just that one)
    parallel: bool  # auto and required: one or more calls; named is always one call

    @property
    def json_array(self) -> bool:
        """The output is a JSON array of calls (required with parallel calls)."""
        return self.kind == "required" and self.parallel


def tool_mode(req: ChatCompletionRequest) -> ToolMode | None:
    """None when the request cannot call a tool (no tools, or tool_choice none); 400s name the field."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        if req.parallel_tool_calls is not None:  # as OpenAI: a setting that could have no effect is refused
            raise bad_request("parallel_tool_calls is only allowed with tools", param="parallel_tool_calls")
        return None
    seen: set[str] = set()
    for i, tool in enumerate(req.tools):
        if tool.function.name in seen:
            raise bad_request(f"two tools are named {tool.function.name!r}", param=f"tools[{i}].function.name")
        seen.add(tool.function.name)
    if choice == "none":
        return None
    functions = tuple(t.function for t in req.tools)
    parallel = req.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        named = [f for f in functions if f.name == choice.function.name]
        if not named:
            raise bad_request(
                f"tool_choice names {choice.function.name!r}, which is not one of the tools", param="tool_choice"
            )
        return ToolMode("named", (named[0],), False)
    return ToolMode("required" if choice == "required" else "auto", functions, parallel)


def refuse_conflicts(req: ChatCompletionRequest, mode: ToolMode | None, structured: dict[str, Any] | None) -> None:
    """Inputs a tool call cannot honour are refused, never ignored."""
    if mode is None:
        return
    # A JSON response format shapes the answer that is not a call: auto's other branch; with required or named
    # there is no such answer (OpenAI takes both, and so does the Agents SDK with an output type).
    if structured is not None and structured["kind"] not in ("json", "json_object"):
        raise bad_request(
            f"{structured['field']} cannot be combined with tool calls: beside tools, only a JSON schema or "
            "json_object response format shapes the answer that is not a call",
            param=structured["field"],
        )
    if req.stop or req.stop_token_ids:
        param = "stop" if req.stop else "stop_token_ids"
        raise bad_request(f"{param} could cut a tool call short: it cannot be combined with tools", param=param)


def call_schema(mode: ToolMode) -> dict[str, Any]:
    """The JSON schema of the output (required/named) or of one tagged call (auto)."""
    drafts = {f.parameters.get("$schema") for f in mode.functions if f.parameters and "$schema" in f.parameters}
    if len(drafts) > 1:
        raise bad_request(
            "the tools' parameters name different $schema drafts; use one draft for all tools", param="tools"
        )
    draft = next(iter(drafts), None)
    branches = [_call_branch(f, draft) for f in mode.functions]
    one: dict[str, Any] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    schema = {"type": "array", "items": one, "minItems": 1} if mode.json_array else one
    return {"$schema": draft, **schema} if draft else schema


def _call_branch(function: FunctionDef, draft: str | None) -> dict[str, Any]:
    params = dict(function.parameters) if function.parameters is not None else {"type": "object", "properties": {}}
    params.pop("$schema", None)
    id_key = "id" if draft and "draft-04" in draft else "$id"
    if id_key not in params:
        # Its own resource: the tool's "#/$defs/..." references keep pointing into its parameters.
        params[id_key] = _ID_BASE + function.name + ".json"
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_spec(mode: ToolMode, allow_narrowing: bool, answer: dict[str, Any] | None = None) -> StructuredSpec:
    """The constraint of a tool-calling request's output; `answer` (auto only: `structured_request`'s json or
    json_object) constrains the answer that is not a call."""
    schema = call_schema(mode)
    try:
        if mode.kind == "auto":
            tagged = {"schema": schema, "open": TOOL_OPEN, "close": TOOL_CLOSE, "parallel": mode.parallel}
            if answer is not None:  # checked by refuse_conflicts: json or json_object
                tagged["text"] = {"type": "object"} if answer["kind"] == "json_object" else answer["value"]
            return StructuredSpec(tagged_json=tagged, allow_narrowing=allow_narrowing)
        return StructuredSpec(json=schema, allow_narrowing=allow_narrowing)
    except GrammarError as exc:
        raise refused(exc, param="tools") from None
