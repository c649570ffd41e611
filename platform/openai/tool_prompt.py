"""Tool calling, prompt side: tools, assistant `tool_calls` and `tool` messages through the chat template.

A template that uses the `tools` variable gets them as `apply_chat_template(..., tools=...)` and the
messages in Hugging Face's tool format (arguments as objects). A template that does not (SmolLM2's)
gets the Hermes/Qwen-style fallback: a system-prompt section listing the tools as JSON schemas and
asking for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, earlier calls written back in that
form, and tool results as user turns inside `<tool_response>` tags.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jinja2
import jinja2.meta
import msgspec

from loraplex.platform.errors import bad_request
from loraplex.platform.openai.schemas import ChatCompletionRequest, ChatMessage, ToolDef
from loraplex.platform.openai.tools import TOOL_CLOSE, TOOL_OPEN

FALLBACK_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query. The functions are listed "
    "in <tools></tools>, one JSON object per line:\n<tools>\n{tools}\n</tools>\n\nTo call a function, answer "
    'with its name and arguments as one JSON object inside tags: <tool_call>{{"name": <function-name>, '
    '"arguments": <args-json-object>}}</tool_call>'
)


@functools.lru_cache(maxsize=16)
def _uses_tools(template: str) -> bool:
    env = jinja2.Environment()
    return "tools" in jinja2.meta.find_undeclared_variables(env.parse(template))


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders a `tools` argument."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one is used
        template = template.get("default")
    return isinstance(template, str) and _uses_tools(template)


def _arguments(i: int, j: int, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"messages[{i}].tool_calls[{j}].function.arguments is not JSON: {exc}",
            param=f"messages[{i}].tool_calls[{j}].function.arguments",
        ) from None


def check_tool_messages(messages: list[ChatMessage]) -> None:
    """`tool_calls` only on assistant messages; every tool message answers an earlier call by its id."""
    call_ids: set[str] = set()
    for i, m in enumerate(messages):
        if m.tool_calls is not None and m.role != "assistant":
            raise bad_request("only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls")
        for j, call in enumerate(m.tool_calls or []):
            _arguments(i, j, call.function.arguments)
            call_ids.add(call.id)
        if m.role == "tool":
            if m.tool_call_id is None:
                raise bad_request("a tool message needs tool_call_id", param=f"messages[{i}].tool_call_id")
            if m.tool_call_id not in call_ids:
                raise bad_request(
                    f"tool_call_id {m.tool_call_id!r} answers no earlier assistant tool call",
                    param=f"messages[{i}].tool_call_id",
                )
        elif m.tool_call_id is not None:
            raise bad_request("only tool messages carry tool_call_id", param=f"messages[{i}].tool_call_id")


def render_messages(
    tokenizer: Any,
    chat: list[ChatMessage],
    tool_defs: list[ToolDef] | None,
    contents: list[str],
    show_tools: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The template's messages and extra keyword arguments ({"tools": [...]} or {}).

    `contents` are the messages' texts (parts joined); `show_tools` is false with tool_choice none."""
    check_tool_messages(chat)
    native = template_takes_tools(tokenizer)
    tools = [_tool_dict(t) for t in tool_defs or []] if show_tools else []
    messages = [_native(m, text) if native else _fallback(m, text) for m, text in zip(chat, contents)]
    if native:
        return messages, ({"tools": tools} if tools else {})
    if tools:
        section = FALLBACK_INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{section}".lstrip()}
        else:
            messages.insert(0, {"role": "system", "content": section})
    return messages, {}


def _tool_dict(tool: ToolDef) -> dict[str, Any]:
    """A tool as OpenAI writes it, without the fields left out."""
    function = {k: v for k, v in msgspec.structs.asdict(tool.function).items() if v is not None}
    return {"type": "function", "function": function}


def _role(m: ChatMessage) -> str:
    return "system" if m.role == "developer" else m.role


def _native(m: ChatMessage, text: str) -> dict[str, Any]:
    out: dict[str, Any] = {"role": _role(m), "content": text}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": json.loads(c.function.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _fallback(m: ChatMessage, text: str) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}
    if m.tool_calls:
        calls = "\n".join(
            f'{TOOL_OPEN}{{"name":{json.dumps(c.function.name)},"arguments":{c.function.arguments}}}{TOOL_CLOSE}'
            for c in m.tool_calls
        )
        text = f"{text}{calls}" if text else calls
    return {"role": _role(m), "content": text}


def show_tools(req: ChatCompletionRequest) -> bool:
    """Tools are shown to the model unless tool_choice is none."""
    return bool(req.tools) and req.tool_choice != "none"
