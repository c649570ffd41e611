"""Translate a JSON-schema `pattern` (ECMA-262 syntax) into a regex over JSON string content.

The pattern applies to the decoded string and is not anchored (it must match somewhere), while
our matcher reads JSON text. So each character set becomes "its characters written raw, or the
canonical escapes of its members that JSON must escape", and the pattern is wrapped in
"any units" on the sides that are not anchored. A pattern with look-arounds is first made an
ordinary regex for the whole string (lookaround.py); back-references and word boundaries cannot
be enforced by an automaton and are refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import TypeAlias

from loraplex.grammar.schema.ecma_ast import (
    LINE_TERMINATORS,
    CharSet,
    Node,
    prop_regex,
    space_sets,
    top_alternatives,
)
from loraplex.grammar.schema.json_text import SPECIALS, UNIT, class_escape, rx_escape, special_escape_rx
from loraplex.grammar.schema.lookaround import has_lookaround, whole_string_node
from loraplex.grammar.spec import GrammarError

_SYNTAX = set("^$\\.*+?()[]{}|/")
# a CharSet as a hashable cache key: (ranges, classes, props, negated)
_SetKey: TypeAlias = tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[tuple[str, bool], ...], bool]


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.src = pattern
        self.i = 0

    def fail(self, what: str) -> GrammarError:
        return GrammarError(f"pattern {self.src!r}: {what} at offset {self.i}")

    def peek(self) -> str | None:
        return self.src[self.i] if self.i < len(self.src) else None

    def take(self) -> str:
        ch = self.src[self.i]
        self.i += 1
        return ch

    def parse(self) -> Node:
        node = self.alternation()
        if self.i != len(self.src):
            raise self.fail("unbalanced ')'")
        return node

    def alternation(self) -> Node:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.take()
            alts.append(self.sequence())
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek() not in (None, "|", ")"):
            atom = self.atom()
            atom = self.quantified(atom)
            items.append(atom)
        return ("seq", items)

    def quantified(self, atom: Node) -> Node:
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.take()
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        elif ch == "{" and (brace := self._brace_quantifier()) is not None:
            lo, hi, end = brace
            self.i = end
        else:
            return atom
        if self.peek() == "?":  # lazy: same language
            self.take()
        if atom[0] in ("bol", "eol"):
            raise self.fail("quantified anchor")
        if atom[0] == "look":
            raise self.fail("quantified look-around")
        if hi is not None and lo > hi:
            raise self.fail("quantifier range out of order")
        return ("rep", atom, lo, hi)

    def _brace_quantifier(self) -> tuple[int, int | None, int] | None:
        j = self.src.find("}", self.i)
        if j < 0:
            return None
        body = self.src[self.i + 1 : j]
        lo_s, sep, hi_s = body.partition(",")
        if not lo_s.isdigit() or (hi_s and not hi_s.isdigit()):
            return None
        return int(lo_s), (int(hi_s) if hi_s else (None if sep else int(lo_s))), j + 1

    def atom(self) -> Node:
        ch = self.take()
        if ch == "^":
            return ("bol",)
        if ch == "$":
            return ("eol",)
        if ch == ".":
            return ("set", CharSet(ranges=[(c, c) for c in LINE_TERMINATORS], negated=True))
        if ch == "(":
            return self.group()
        if ch == "[":
            return ("set", self.char_class())
        if ch == "\\":
            return self.escape(in_class=False)
        if ch in "*+?":
            raise self.fail(f"nothing to repeat before '{ch}'")
        if ch == "{" and self._brace_at(self.i - 1):
            raise self.fail("nothing to repeat before '{'")
        return ("lit", ch)

    def _brace_at(self, pos: int) -> bool:
        saved = self.i
        self.i = pos
        ok = self._brace_quantifier() is not None
        self.i = saved
        return ok

    def group(self) -> Node:
        if self.src.startswith("?:", self.i):
            self.i += 2
        elif self.src.startswith("?<", self.i) and not self.src.startswith(("?<=", "?<!"), self.i):
            end = self.src.find(">", self.i)
            if end < 0:
                raise self.fail("unterminated group name")
            self.i = end + 1
        elif self.src.startswith(("?=", "?!", "?<=", "?<!"), self.i):
            behind = self.src.startswith("?<", self.i)
            self.i += 3 if behind else 2
            negated = self.src[self.i - 1] == "!"
            return ("look", not behind, negated, self._group_body())
        elif self.peek() == "?":
            raise self.fail("inline modifiers are not supported")
        return self._group_body()

    def _group_body(self) -> Node:
        node = self.alternation()
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.take()
        return node

    def char_class(self) -> CharSet:
        cs = CharSet()
        if self.peek() == "^":
            self.take()
            cs.negated = True
        while True:
            ch = self.peek()
            if ch is None:
                raise self.fail("unterminated character class")
            if ch == "]":
                self.take()
                return cs
            lo = self.class_atom(cs)
            if lo is None:
                continue
            if self.peek() == "-" and self.i + 1 < len(self.src) and self.src[self.i + 1] != "]":
                self.take()
                hi = self.class_atom(cs)
                if hi is None:
                    raise self.fail("class escape used as a range end")
                if hi < lo:
                    raise self.fail("character class range out of order")
                cs.ranges.append((lo, hi))
            else:
                cs.ranges.append((lo, lo))

    def class_atom(self, cs: CharSet) -> str | None:
        """One character of a class, or None after adding a class escape (\\d, \\p{..}) to cs."""
        ch = self.take()
        if ch != "\\":
            return ch
        node = self.escape(in_class=True)
        if node[0] == "lit":
            lit: str = node[1]
            return lit
        inner: CharSet = node[1]
        cs.classes += inner.classes
        cs.props += inner.props
        return None

    def escape(self, in_class: bool) -> Node:
        if self.peek() is None:
            raise self.fail("pattern ends with '\\'")
        ch = self.take()
        if ch in "dDwWsS":
            return ("set", CharSet(classes=[ch]))
        if ch in "pP" and self.peek() == "{":
            end = self.src.find("}", self.i)
            if end < 0:
                raise self.fail("unterminated \\p{...}")
            name = self.src[self.i + 1 : end]
            self.i = end + 1
            prop_regex(name)
            return ("set", CharSet(props=[(name, ch == "P")]))
        simple = {"t": "\t", "n": "\n", "v": "\x0b", "f": "\x0c", "r": "\r"}
        if ch in simple:
            return ("lit", simple[ch])
        if ch == "b":
            if in_class:
                return ("lit", "\x08")
            raise self.fail("word boundary \\b cannot be enforced")
        if ch == "B":
            raise self.fail("\\B cannot be enforced")
        if ch == "0" and not (self.peek() or "").isdigit():
            return ("lit", "\x00")
        if ch.isdigit() or (ch == "k" and self.peek() == "<"):
            raise self.fail("back-references cannot be enforced")
        if ch == "c" and (self.peek() or "").isalpha():
            return ("lit", chr(ord(self.take()) % 32))
        if ch == "x":
            return ("lit", chr(self._hex(2)))
        if ch == "u":
            return ("lit", self._unicode_escape())
        if ch.isalnum():
            raise self.fail(f"unknown escape '\\{ch}'")
        return ("lit", ch)

    def _hex(self, n: int) -> int:
        digits = self.src[self.i : self.i + n]
        if len(digits) != n or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise self.fail("bad hexadecimal escape")
        self.i += n
        return int(digits, 16)

    def _unicode_escape(self) -> str:
        if self.peek() == "{":
            end = self.src.find("}", self.i)
            if end < 0:
                raise self.fail("unterminated \\u{...}")
            try:
                code = int(self.src[self.i + 1 : end], 16)
                ch = chr(code)
            except ValueError:
                raise self.fail("bad \\u{...} escape") from None
            self.i = end + 1
            return ch
        code = self._hex(4)
        if 0xD800 <= code < 0xDC00 and self.src.startswith("\\u", self.i):
            saved = self.i
            self.i += 2
            low = self._hex(4)
            if 0xDC00 <= low < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
            self.i = saved
        if 0xD800 <= code < 0xE000:
            raise self.fail("lone surrogate escape")
        return chr(code)


def _emit(node: Node, encoded: bool = True, agreeing: bool = False, outside: Ranges = ()) -> str:
    """Rust regex for `node`: over JSON string content (`encoded`), or over the decoded string
    with ECMA's meaning of \\d, \\w, \\s and . spelled out (Rust's own are Unicode-wide); ``agreeing``:
    classes hold only what Python's re puts in them too (CharSet.rust); ``outside``: characters in these
    ranges are matched nowhere (decoded strings only)."""
    kind = node[0]
    if kind == "lit":
        ch = node[1]
        if encoded and ch in SPECIALS:
            return special_escape_rx(ch)
        if _in_ranges(ch, outside):
            return NOTHING
        return rx_escape(ch) if ch.isprintable() else f"\\x{{{ord(ch):X}}}"
    if kind == "set":
        cs: CharSet = node[1]
        if not encoded:
            return f"[{cs.rust(agreeing)}&&[^{ranges_class_body(outside)}]]" if outside else cs.rust(agreeing)
        return _set_content_rx((tuple(cs.ranges), tuple(cs.classes), tuple(cs.props), cs.negated), agreeing)
    if kind == "seq":
        return "".join(_emit(n, encoded, agreeing, outside) for n in node[1])
    if kind == "alt":
        return "(?:" + "|".join(_emit(n, encoded, agreeing, outside) for n in node[1]) + ")"
    if kind == "rep":
        _, inner, lo, hi = node
        q = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((lo, hi))
        if q is None:
            q = f"{{{lo},}}" if hi is None else (f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}")
        return f"(?:{_emit(inner, encoded, agreeing, outside)}){q}"
    if not encoded:
        return "^" if kind == "bol" else "$"
    raise GrammarError(
        "'^' or '$' inside a pattern (not at its start or end) cannot be enforced", code="unsupported_schema"
    )


@lru_cache(maxsize=4096)  # generated patterns repeat the same classes hundreds of times
def _set_content_rx(key: _SetKey, agreeing: bool = False) -> str:
    """A character class over JSON string content: its raw characters, and the escapes of its specials."""
    ranges, classes, props, negated = key
    cs = CharSet(list(ranges), list(classes), list(props), negated)
    raw = f'[{cs.rust(agreeing)}&&[^"\\\\\\x00-\\x1F]]'
    escapes = [special_escape_rx(ch) for ch in sorted(SPECIALS) if cs.contains(ch, agreeing)]
    return "(?:" + "|".join([raw] + escapes) + ")"


@lru_cache(maxsize=1024)  # the same patterns recur across a schema's $defs copies
def pattern_to_rust(pattern: str, agreeing: bool = False) -> str:
    """The pattern in Rust regex syntax with ECMA semantics, still a search (for llguidance,
    which applies `pattern` to the decoded string itself). ``agreeing``: for a string that must match (a
    value's ``pattern``), classes keep only what Python's re (jsonschema's engine) puts in them too; a key's
    pattern (``patternProperties``) also decides which keys do not match, and stays ECMA's."""
    tree = _Parser(pattern).parse()
    if has_lookaround(tree):
        return "^(?:" + _emit(whole_string_node(tree, pattern), encoded=False) + ")$"
    return _emit(tree, encoded=False, agreeing=agreeing)


@lru_cache(maxsize=1024)  # the same patterns recur across a schema's $defs copies
def pattern_to_content_regex(pattern: str, agreeing: bool = False) -> str:
    """Regex (Rust syntax) for the JSON string content of strings that contain a match of `pattern`
    (``agreeing`` as in pattern_to_rust)."""
    tree = _Parser(pattern).parse()
    if has_lookaround(tree):
        return _emit(whole_string_node(tree, pattern))
    branches = []
    for start, items, end in _anchored_alternatives(tree):
        body = "".join(_emit(n, agreeing=agreeing) for n in items)
        branches.append(("" if start else UNIT + "*") + body + ("" if end else UNIT + "*"))
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


def _anchored_alternatives(tree: Node) -> list[tuple[bool, list[Node], bool]]:
    """The pattern's top-level alternatives as (anchored at the start, the items between the anchors, anchored
    at the end): a search pattern's unanchored sides take any text."""
    out = []
    for alt_node in top_alternatives(tree):
        items = list(alt_node[1]) if alt_node[0] == "seq" else [alt_node]
        start = bool(items) and items[0][0] == "bol"
        if start:
            items = items[1:]
        end = bool(items) and items[-1][0] == "eol"
        if end:
            items = items[:-1]
        out.append((start, items, end))
    return out


# ---- patternProperties keys judged alike by ECMA and Python's re --------------------------------------------
Ranges = tuple[tuple[str, str], ...]
NOTHING = "[^\\x00-\\U0010FFFF]"  # a class no character is in


def code_escape(c: str) -> str:
    """A character by its code, in the spelling Rust's regex and Python's regex module both read."""
    n = ord(c)
    return f"\\x{n:02X}" if n < 0x100 else (f"\\u{n:04X}" if n < 0x10000 else f"\\U{n:08X}")


def _in_ranges(ch: str, ranges: Ranges) -> bool:
    return any(lo <= ch <= hi for lo, hi in ranges)


def ranges_class_body(ranges: Ranges) -> str:
    def one(c: str) -> str:
        return class_escape(c) if " " <= c < "\x7f" else code_escape(c)

    return "".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in ranges)


def key_restriction(patterns: Iterable[str], declared: Iterable[str]) -> Ranges:
    """key_disagreements, or nothing where a declared property's name holds such a character: llguidance holds
    declared names to the patterns too, and excluding the characters would exclude that name (a known gap:
    such a name is judged by the translated pattern)."""
    outside = key_disagreements(patterns)
    if outside and any(_in_ranges(ch, outside) for name in declared for ch in name):
        return ()
    return outside


def describe_ranges(ranges: Ranges) -> str:
    return ", ".join(
        ascii(lo) if lo == hi else ("non-ASCII" if (lo, hi) == ("\x80", "\U0010ffff") else f"{lo!a}-{hi!a}")
        for lo, hi in ranges
    )


def key_disagreements(patterns: Iterable[str]) -> Ranges:
    """Characters on which ECMA (the schema's engine, which llguidance follows through our translation) and
    Python's re (jsonschema's) may judge a key differently under these patterns: a trailing newline that
    Python's ``$`` allows, the line terminators Python's ``.`` matches, the spaces only one ``\\s`` has, and
    every non-ASCII character under \\d, \\w or \\b (Python's are Unicode-wide). Keys holding none of them are
    judged alike, so a key generated as matching (or not) a pattern is one to both."""
    found: set[str] = set()
    for pattern in patterns:
        found |= _disagreeing_constructs(pattern)
    chars: set[str] = set()
    if "$" in found:
        chars.add("\n")
    if "." in found:
        chars |= set("\r\u2028\u2029")
    if "s" in found:
        both, either = space_sets()
        chars |= set(either) - set(both)
    wide = "w" in found  # every non-ASCII character
    ranges = [(c, c) for c in sorted(chars) if not (wide and c >= "\x80")]
    return tuple(ranges + [("\x80", "\U0010ffff")] if wide else ranges)


def _disagreeing_constructs(pattern: str) -> set[str]:
    """Which of ``$``, ``.``, \\s (``s``) and \\d/\\w/\\b (``w``) the pattern uses outside escapes."""
    out: set[str] = set()
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            n = pattern[i + 1]
            if n in "dDwWbB":
                out.add("w")
            elif n in "sS":
                out.add("s")
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c in ".$":
            out.add(c)
        i += 1
    return out


@lru_cache(maxsize=1024)
def pattern_to_rust_key(pattern: str, outside: Ranges) -> str:
    """A patternProperties key pattern as an anchored Rust regex over the keys that hold no character in
    ``outside`` and contain a match (the keys ECMA and Python's re judge alike, see key_disagreements)."""
    if not outside:
        return pattern_to_rust(pattern)
    tree = _Parser(pattern).parse()
    if has_lookaround(tree):
        return "^(?:" + _emit(whole_string_node(tree, pattern), encoded=False, outside=outside) + ")$"
    pad = f"[^{ranges_class_body(outside)}]*"
    branches = []
    for start, items, end in _anchored_alternatives(tree):
        body = "".join(_emit(n, encoded=False, outside=outside) for n in items)
        branches.append(("" if start else pad) + body + ("" if end else pad))
    return "^(?:" + "|".join(branches) + ")$"
