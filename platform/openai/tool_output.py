"""Tool calling, response side: generated text -> `message.tool_calls`, whole or as streamed deltas.

The grammar makes the text one of the forms `tools.ToolMode` describes, so `scan` only has to read it:
`{"name":"...","arguments":...}` (required/named; a JSON array of them with parallel calls), or in auto
mode text, or text followed by `<tool_call>{call}</tool_call>` blocks. `scan` also reads a prefix of
those forms, which is what streaming needs: the call's name as soon as its string closes, then its
arguments' JSON text as it grows. Text that is not a complete set of valid calls (a generation aborted
mid-call) is never returned as tool calls: it stays content, with the engine's finish_reason.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from loraplex.platform.openai.schemas import (
    AssistantMessage,
    ChatDelta,
    FunctionCall,
    FunctionDelta,
    ToolCall,
    ToolCallDelta,
)
from loraplex.platform.openai.tools import TOOL_CLOSE, TOOL_OPEN, ToolMode

_WS = " \t\n\r"


@dataclass
class CallText:
    name: str | None = None  # None until its string is closed
    arguments: str = ""  # the arguments' JSON text so far
    complete: bool = False  # the call object is closed


@dataclass
class Scan:
    content: str = ""  # text before the first call (auto mode), safe to show
    calls: list[CallText] = field(default_factory=list)
    valid: bool = True  # the text is (a prefix of) the expected form
    finished: bool = False  # the text is exactly a whole form (only with final=True)


class _Cursor:
    def __init__(self, text: str, pos: int = 0) -> None:
        self.s, self.i = text, pos

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in _WS:
            self.i += 1

    def at_end(self) -> bool:
        return self.i >= len(self.s)

    def lit(self, literal: str) -> bool | None:
        """True: matched and consumed; None: the text ends inside `literal`; False: something else."""
        rest = self.s[self.i : self.i + len(literal)]
        if rest == literal:
            self.i += len(literal)
            return True
        if len(rest) < len(literal) and literal.startswith(rest):
            self.i = len(self.s)
            return None
        return False


def _value_end(s: str, i: int) -> tuple[int, bool]:
    """Where the JSON value starting at `i` ends, and whether it is closed (else: the text ended first)."""
    depth, in_str, esc = 0, False, False
    for j in range(i, len(s)):
        c = s[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
                if depth == 0:
                    return j + 1, True
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            if depth == 0:
                return j, True  # a number or literal ended by the enclosing object's brace
            depth -= 1
            if depth == 0:
                return j + 1, True
        elif depth == 0 and c in "," + _WS:
            return j, True
    return len(s), False


def _call(cur: _Cursor) -> tuple[CallText, str]:
    """One call object at the cursor: (what is known of it, "done" | "more" | "bad")."""
    call = CallText()
    for literal in ("{", '"name"', ":", '"'):
        cur.ws()
        found = cur.lit(literal)
        if found is not True:
            return call, "more" if found is None else "bad"
    end = cur.s.find('"', cur.i)
    if "\\" in cur.s[cur.i : len(cur.s) if end < 0 else end]:
        return call, "bad"  # tool names are [a-zA-Z0-9_-]: never escaped
    if end < 0:
        cur.i = len(cur.s)
        return call, "more"
    call.name, cur.i = cur.s[cur.i : end], end + 1
    for literal in (",", '"arguments"', ":"):
        cur.ws()
        found = cur.lit(literal)
        if found is not True:
            return call, "more" if found is None else "bad"
    cur.ws()
    end, closed = _value_end(cur.s, cur.i)
    call.arguments, cur.i = cur.s[cur.i : end], end
    if not closed:
        return call, "more"
    cur.ws()
    found = cur.lit("}")
    if found is not True:
        return call, "more" if found is None else "bad"
    call.complete = True
    return call, "done"


def _held_back(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could still grow into `tag` (not shown yet)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def scan(text: str, mode: ToolMode, final: bool) -> Scan:
    """What `text` (the whole output so far; `final`: all of it) says in `mode`'s form."""
    out = Scan()
    if mode.kind == "auto":
        start = text.find(TOOL_OPEN)
        if start < 0:
            out.content = text if final else text[: len(text) - _held_back(text, TOOL_OPEN)]
            out.finished = final
            return out
        out.content = text[:start]
        cur = _Cursor(text, start + len(TOOL_OPEN))
        separator, closing = TOOL_OPEN, TOOL_CLOSE
    else:
        cur = _Cursor(text)
        separator, closing = "", ""
        if mode.json_array:
            cur.ws()
            found = cur.lit("[")
            if found is not True:
                out.valid = found is None
                return out
    while True:
        call, state = _call(cur)
        if call.name is not None:
            out.calls.append(call)
        if state != "done":
            out.valid = state == "more"
            return out
        if closing:
            found = cur.lit(closing)
            if found is not True:
                out.valid = found is None
                return out
        else:
            cur.ws()
        if cur.at_end():
            out.finished = final and not mode.json_array  # an array still needs its "]"
            return out
        if mode.json_array:
            if cur.lit("]"):
                cur.ws()
                out.valid = cur.at_end()
                out.finished = final and out.valid
                return out
            found = cur.lit(",")
        else:
            found = cur.lit("\n" + separator) if separator and mode.parallel else False
        if found is not True:
            out.valid = found is None
            return out


def valid_calls(text: str, mode: ToolMode) -> list[CallText] | None:
    """The calls of a finished output, or None when it is not a whole set of valid calls."""
    found = scan(text, mode, final=True)
    if not (found.valid and found.finished and found.calls):
        return None
    names = {f.name for f in mode.functions}
    for call in found.calls:
        if not call.complete or call.name not in names:
            return None
        try:
            json.loads(call.arguments)
        except json.JSONDecodeError:
            return None
    return found.calls


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_message(text: str, finish_reason: str | None, mode: ToolMode) -> tuple[AssistantMessage, str | None]:
    """The assistant message of a finished choice and its finish_reason ("tool_calls" when it called)."""
    calls = valid_calls(text, mode)
    if calls is None:
        return AssistantMessage(content=text), finish_reason
    content = scan(text, mode, final=True).content
    tool_calls = [
        # (a complete call has its name: CallText keeps it None only until the name's string is closed)
        ToolCall(id=call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))  # type: ignore[arg-type]
        for c in calls
    ]
    return AssistantMessage(content=content if content.strip() else None, tool_calls=tool_calls), "tool_calls"


class ToolStreamer:
    """One choice's streamed tool calls: feed it each text delta, send the deltas it returns."""

    def __init__(self, mode: ToolMode) -> None:
        self.mode = mode
        self.text = ""
        self.content_sent = 0
        self.ids: list[str] = []
        self.args_sent: list[int] = []

    def feed(self, new_text: str, finish_reason: str | None) -> tuple[list[ChatDelta], str | None]:
        """The deltas for `new_text` (one per chunk), and the finish_reason to send with the last one."""
        self.text += new_text
        final = finish_reason is not None
        found = scan(self.text, self.mode, final)
        deltas: list[ChatDelta] = []
        if found.valid and len(found.content) > self.content_sent:
            deltas.append(ChatDelta(content=found.content[self.content_sent :]))
            self.content_sent = len(found.content)
        for k, call in enumerate(found.calls if found.valid else []):
            if k == len(self.ids):
                self.ids.append(call_id())
                self.args_sent.append(0)
                head = FunctionDelta(name=call.name, arguments="")
                first = ToolCallDelta(index=k, id=self.ids[k], type="function", function=head)
                deltas.append(ChatDelta(tool_calls=[first]))
            if len(call.arguments) > self.args_sent[k]:
                fragment = FunctionDelta(arguments=call.arguments[self.args_sent[k] :])
                deltas.append(ChatDelta(tool_calls=[ToolCallDelta(index=k, function=fragment)]))
                self.args_sent[k] = len(call.arguments)
        if not final:
            return deltas, None
        if valid_calls(self.text, self.mode) is not None:
            return deltas, "tool_calls"
        if not self.ids and len(self.text) > self.content_sent:  # not calls after all: the text is content
            deltas.append(ChatDelta(content=self.text[self.content_sent :]))
        return deltas, finish_reason
