"""Grounded values: a string schema with ``"x-loraplex-grounded": true`` may only produce a verbatim span of the
request's source text (its user messages' text; a completion's prompt).

How it is enforced. The schema's regex (schema/to_regex.py) holds a placeholder where each grounded string's
content goes; ``template_lark`` turns it into an llguidance Lark grammar where the document is one terminal and
each placeholder a terminal ``GROUNDED_k: SPAN & /content/`` (``& /content/``: the string's other keywords, by
intersection). Per request, ``span_definition`` defines ``SPAN`` as the union, over the source segments, of
llguidance's substring lexeme (``%regex {"substring_chunks": ...}``), one chunk per character in its JSON spelling:
a span starts and ends on whole escapes, so the text written is the escaped span and its unescaped value is the
span. Segments are the messages, split where a character the token automaton's language never writes sits (plane
16: bytes 0xF4; lone surrogates), so a span never crosses from one message into another and never needs a token
that is masked anyway. The template is compiled once per schema (cached); the per-request part is the span
terminal, built by llguidance (a suffix automaton in Rust) off the engine loop (grammar/compiler.py).

Where a value came from is found after the output is complete (``locate``): the grounded leaves of the output, by
JSON pointer, with the message index and character offsets of the first occurrence of their value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from loraplex.grammar.schema.json_text import SPECIALS
from loraplex.grammar.schema.normalize import GROUNDED
from loraplex.grammar.spec import GrammarError

SPAN_TERMINAL = "LORAPLEX_SPAN"
# The most source text one request may ground on (all segments together): llguidance builds the span automaton
# in about 3 ms per 1,000 characters (bench/README.md), so this bounds that build at a few seconds.
MAX_SOURCE_CHARS = 1_000_000
_HEADER = '%llguidance {"no_forcing": true}'  # served token for token as the automaton's language (text.py)
_ESCAPED = {c: json.dumps(c)[1:-1] for c in SPECIALS}  # the canonical spelling (schema/json_text.py)
# characters no output of the automaton's language holds: plane 16 (UTF-8 lead byte 0xF4) and lone surrogates
_BREAKS = re.compile("[\U00100000-\U0010ffff\ud800-\udfff]")


def placeholder(k: int) -> str:
    """The mark for grounded slot ``k`` inside a schema regex (raw NULs: a regex we build never holds one)."""
    return f"\x00{k}\x00"


@dataclass(frozen=True)
class GroundedSlot:
    """One grounded string of a schema: where it is (schema pointer, for messages) and the regexes its JSON content
    must also match (one per other keyword: minLength/maxLength, pattern, format, enum); none: any span will do."""

    pointer: str
    content: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceText:
    """Text a grounded value may copy from: a message's index in the request and its text (or the prompt: 0)."""

    message: int
    text: str


@dataclass(frozen=True)
class GroundedValue:
    """Where one grounded value of an output came from: its JSON pointer, and the span it copies (the first
    occurrence of its value): message index and character (code point) offsets, ``text[start:end] == value``."""

    pointer: str
    message: int
    start: int
    end: int


# ---- the grammar ------------------------------------------------------------------------------------------------
def template_lark(regex: str, slots: Sequence[GroundedSlot]) -> str:
    """The Lark grammar of a schema regex holding placeholders, without the span terminal (``request_lark`` adds it)."""
    return f"{_HEADER}\nstart: DOCUMENT\nDOCUMENT: {_lark_expression(regex)}\n{_slot_lines(slots)}"


def tagged_template_lark(
    regex: str, slots: Sequence[GroundedSlot], open_tag: str, close_tag: str, parallel: bool
) -> str:
    """Tool calls (free text, or text ending in ``open_tag`` and calls) whose arguments hold grounded values."""
    from loraplex.grammar.backend_llguidance.text import tagged_lark

    return (
        tagged_lark("CALL", open_tag, close_tag, parallel) + f"CALL: {_lark_expression(regex)}\n" + _slot_lines(slots)
    )


def _slot_lines(slots: Sequence[GroundedSlot]) -> str:
    lines = []
    for k, slot in enumerate(slots):
        body = " & ".join([SPAN_TERMINAL, *(f"/{_lark_regex(rx)}/" for rx in slot.content)])
        lines.append(f"GROUNDED_{k}: {body}\n")
    return "".join(lines)


def source_pieces(sources: Sequence[SourceText]) -> list[str]:
    """The sources' text split at the characters no output holds: the runs a span may copy from (checked against
    ``MAX_SOURCE_CHARS``)."""
    total = sum(len(s.text) for s in sources)
    if total > MAX_SOURCE_CHARS:
        raise GrammarError(
            f"the source text for x-loraplex-grounded values is {total} characters; at most {MAX_SOURCE_CHARS} "
            "are accepted",
            code="unsupported_schema",
        )
    return [piece for s in sources for piece in _BREAKS.split(s.text) if piece]


def source_segments(sources: Sequence[SourceText]) -> list[list[str]]:
    """Each source split at the characters no output holds, as chunk lists (one chunk per character, escaped)."""
    escaped = _ESCAPED
    segments = [[escaped.get(c, c) for c in piece] for piece in source_pieces(sources)]
    return segments or [[]]  # no text: only the empty span


def span_definition(sources: Sequence[SourceText]) -> str:
    """The Lark line defining the span terminal for these sources."""
    alternatives = (
        "%regex " + json.dumps({"substring_chunks": chunks}, ensure_ascii=False) for chunks in source_segments(sources)
    )
    return f"{SPAN_TERMINAL}: " + " | ".join(alternatives) + "\n"


DOCUMENT_TAG = "@m@"  # what a bound grammar's matcher consumes first: the output proper starts after it
_START = re.compile(r"^start:", re.MULTILINE)


def slot_tag(k: int) -> str:
    """The tag before grounded string ``k`` alone (checking whether any span satisfies it)."""
    return f"@{k}@"


def request_lark(template: str, checked: Sequence[int], sources: Sequence[SourceText]) -> str:
    """One request's grammar: the schema's document after ``DOCUMENT_TAG``, or grounded string ``k`` of
    ``checked`` alone after ``slot_tag(k)`` (one llguidance build, one span automaton, serves the request and the
    checks of its strings), with the span terminal of ``sources``."""
    starts = [f'"{DOCUMENT_TAG}" loraplex_document', *(f'"{slot_tag(k)}" GROUNDED_{k}' for k in checked)]
    lark = _START.sub("loraplex_document:", template, count=1)
    return f"{lark}start: {' | '.join(starts)}\n{span_definition(sources)}"


def _lark_regex(regex: str) -> str:
    from llguidance import regex_to_lark

    return str(regex_to_lark(regex, ""))


# ---- regex -> Lark terminal expression ----------------------------------------------------------------------------
# Only the groups that hold a placeholder become Lark syntax; every other run of the regex stays one /.../ atom.
@dataclass
class _Slot:
    k: int


@dataclass
class _Group:
    opening: str  # "(", "(?:", "(?i:", ...
    alternatives: list[list[_Item]]


@dataclass
class _Item:
    atom: str | _Slot | _Group  # str: the atom's regex text
    quantifier: str = ""


class _Parser:
    def __init__(self, regex: str) -> None:
        self.rx = regex
        self.i = 0

    def alternatives(self) -> list[list[_Item]]:
        alts: list[list[_Item]] = [[]]
        rx = self.rx
        while self.i < len(rx):
            c = rx[self.i]
            if c == ")":
                break
            if c == "|":
                self.i += 1
                alts.append([])
                continue
            atom = self._atom()
            alts[-1].append(_Item(atom, self._quantifier()))
        return alts

    def _atom(self) -> str | _Slot | _Group:
        rx, i = self.rx, self.i
        c = rx[i]
        if c == "\x00":
            end = rx.index("\x00", i + 1)
            self.i = end + 1
            return _Slot(int(rx[i + 1 : end]))
        if c == "(":
            opening = "("
            if rx.startswith("(?", i):
                end = i + 2
                while rx[end] not in ":)":
                    end += 1
                if rx[end] == ")":  # (?flags) applies to the rest: never written around our own structure
                    self.i = end + 1
                    return rx[i : end + 1]
                opening = rx[i : end + 1]
            self.i = i + len(opening)
            alts = self.alternatives()
            if self.i >= len(rx) or rx[self.i] != ")":
                raise ValueError(f"unbalanced group in regex at {i}")
            self.i += 1
            return _Group(opening, alts)
        if c == "[":
            self.i = _class_end(rx, i)
            return rx[i : self.i]
        if c == "\\":
            self.i = _escape_end(rx, i)
            return rx[i : self.i]
        self.i = i + 1
        return c

    def _quantifier(self) -> str:
        rx, i = self.rx, self.i
        if i < len(rx) and rx[i] in "*+?":
            end = i + 1
        elif i < len(rx) and rx[i] == "{" and (m := re.match(r"\{\d+(,\d*)?\}", rx[i:])):
            end = i + m.end()
        else:
            return ""
        if end < len(rx) and rx[end] == "?":  # lazy: the same language
            end += 1
        self.i = end
        return rx[i:end]


def _escape_end(rx: str, i: int) -> int:
    c = rx[i + 1]
    if c in "xupP" and i + 2 < len(rx) and rx[i + 2] == "{":
        return rx.index("}", i + 2) + 1
    return i + 2 + {"x": 2, "u": 4, "U": 8}.get(c, 0)


def _class_end(rx: str, i: int) -> int:
    """Index after the character class opening at ``i`` (nested classes and escapes included)."""
    depth, j = 0, i
    while True:
        c = rx[j]
        if c == "\\":
            j = _escape_end(rx, j)
            continue
        if c == "[":
            depth += 1
            j += 1
            if rx[j] == "^":
                j += 1
            if rx[j] == "]":  # a leading ] is a literal
                j += 1
            continue
        j += 1
        if c == "]":
            depth -= 1
            if depth == 0:
                return j


def _has_slot(item: _Item) -> bool:
    atom = item.atom
    if isinstance(atom, _Slot):
        return True
    return isinstance(atom, _Group) and any(_has_slot(x) for alt in atom.alternatives for x in alt)


def _text(item: _Item) -> str:
    atom = item.atom
    assert not isinstance(atom, _Slot)
    if isinstance(atom, str):
        return atom + item.quantifier
    inner = "|".join("".join(_text(x) for x in alt) for alt in atom.alternatives)
    return f"{atom.opening}{inner}){item.quantifier}"


def _lark_sequence(items: list[_Item]) -> str:
    parts: list[str] = []
    run: list[str] = []
    for item in items:
        if not _has_slot(item):
            run.append(_text(item))
            continue
        if run:
            parts.append(f"/{_lark_regex(''.join(run))}/")
            run = []
        atom, quantifier = item.atom, item.quantifier
        if len(quantifier) > 1 and quantifier.endswith("?"):  # lazy: the same language
            quantifier = quantifier[:-1]
        if isinstance(atom, _Slot):
            parts.append(f"GROUNDED_{atom.k}{quantifier}")
            continue
        assert isinstance(atom, _Group)
        if atom.opening not in ("(", "(?:"):
            raise ValueError(f"a grounded value inside a flagged group {atom.opening!r}")
        parts.append("(" + " | ".join(_lark_sequence(alt) for alt in atom.alternatives) + f"){quantifier}")
    if run:
        parts.append(f"/{_lark_regex(''.join(run))}/")
    return " ".join(parts) if parts else '""'


def _lark_expression(regex: str) -> str:
    parser = _Parser(regex)
    alternatives = parser.alternatives()
    if parser.i != len(regex):
        raise ValueError(f"unbalanced ) in regex at {parser.i}")
    return " | ".join(_lark_sequence(alt) for alt in alternatives)


# ---- where values came from ---------------------------------------------------------------------------------------
def locate(schema: Any, output: str, sources: Sequence[SourceText]) -> list[GroundedValue]:
    """The grounded values of a complete output (``schema``: the internal form, local references only), each with
    the first span of the sources it equals. A value found nowhere is left out (only an alternative that is not
    grounded can have written it)."""
    try:
        instance = json.loads(output)
    except json.JSONDecodeError:
        return []
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    found: list[GroundedValue] = []
    seen: set[str] = set()
    for ptr, value in _grounded_leaves(schema, validator, schema, instance, "", 0):
        if ptr in seen:
            continue
        seen.add(ptr)
        for source in sources:
            at = source.text.find(value)
            if at >= 0:
                found.append(GroundedValue(ptr, source.message, at, at + len(value)))
                break
    return found


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref.lstrip("#").split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _grounded_leaves(
    root: Any, validator: Any, node: Any, value: Any, ptr: str, depth: int
) -> Iterator[tuple[str, str]]:
    """(pointer, value) of each string of ``value`` that a grounded schema applying to it covers."""
    if not isinstance(node, dict) or depth > 64:
        return
    if isinstance(value, str) and node.get(GROUNDED) is True:
        yield ptr, value
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        yield from _grounded_leaves(root, validator, _resolve(root, ref), value, ptr, depth + 1)
    for sub in node.get("allOf", []):
        yield from _grounded_leaves(root, validator, sub, value, ptr, depth + 1)
    for key in ("anyOf", "oneOf"):
        for sub in node.get(key, []):
            if validator.evolve(schema=sub).is_valid(value):
                yield from _grounded_leaves(root, validator, sub, value, ptr, depth + 1)
    if "if" in node:
        branch = node.get("then") if validator.evolve(schema=node["if"]).is_valid(value) else node.get("else")
        yield from _grounded_leaves(root, validator, branch, value, ptr, depth + 1)
    if isinstance(value, dict):
        props = node.get("properties", {})
        patterns = node.get("patternProperties", {})
        for key, item in value.items():
            where = f"{ptr}/{key.replace('~', '~0').replace('/', '~1')}"
            matched = [sub for pattern, sub in patterns.items() if _search(pattern, key)]
            subs = ([props[key]] if key in props else []) + matched
            if not subs and "additionalProperties" in node:
                subs = [node["additionalProperties"]]
            for sub in subs:
                yield from _grounded_leaves(root, validator, sub, item, where, depth + 1)
    elif isinstance(value, list):
        prefix = node.get("prefixItems", [])
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else node.get("items")
            yield from _grounded_leaves(root, validator, sub, item, f"{ptr}/{i}", depth + 1)


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False
