"""The AST of an ECMA-262 pattern (``Node`` tuples) and its character sets (``CharSet``): what the pattern
translation (ecma_pattern) and the look-around resolution (lookaround) both read, kept apart from either so
neither imports the other's module."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeAlias

from loraplex.grammar.schema.json_text import class_escape
from loraplex.grammar.spec import GrammarError

_ECMA_SPACE = (
    "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
LINE_TERMINATORS = "\n\r\u2028\u2029"


@dataclass
class CharSet:
    """Ranges plus named classes (d, w, s, their negations) and Unicode properties, maybe negated."""

    ranges: list[tuple[str, str]] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    props: list[tuple[str, bool]] = field(default_factory=list)  # (name, negated)
    negated: bool = False

    def contains(self, ch: str, agreeing: bool = False) -> bool:
        """ECMA's verdict; ``agreeing``: True only where Python's ``re`` agrees (see ``rust``)."""
        plain = any(lo <= ch <= hi for lo, hi in self.ranges) or any(
            _prop_has(name, ch) != neg for name, neg in self.props
        )
        if not agreeing:
            return (plain or any(_class_has(c, ch) for c in self.classes)) != self.negated
        if self.negated:  # outside what either engine puts in the classes
            return not (plain or any(_class_has(c, ch) or _py_class_has(c, ch) for c in self.classes))
        return plain or any(_class_has(c, ch) and _py_class_has(c, ch) for c in self.classes)

    def rust(self, agreeing: bool = False) -> str:
        """The set as a Rust class, with ECMA's meaning of \\d, \\w, \\s and their negations; ``agreeing``:
        only the characters ECMA and Python's ``re`` (jsonschema's engine: Unicode-wide \\d and \\w, another
        \\s) both put in it, for a pattern a generated string must match under either."""
        items = []
        for lo, hi in self.ranges:
            items.append(class_escape(lo) if lo == hi else f"{class_escape(lo)}-{class_escape(hi)}")
        for c in self.classes:
            items.append(_agreeing_class_rust(c, widen=self.negated) if agreeing else _class_rust(c))
        for name, neg in self.props:
            items.append(("\\P" if neg else "\\p") + "{" + name + "}")
        if not items:
            return "[^\\x00-\\x{10FFFF}]" if not self.negated else "[\\x00-\\x{10FFFF}]"
        return ("[^" if self.negated else "[") + "".join(items) + "]"


def _class_has(name: str, ch: str) -> bool:
    base = name.lower()
    if base == "d":
        hit = "0" <= ch <= "9"
    elif base == "w":
        hit = ch.isascii() and (ch.isalnum() or ch == "_")
    else:
        hit = ch in _ECMA_SPACE
    return hit if name.islower() else not hit


def class_ranges(name: str) -> list[tuple[str, str]]:
    """\\d, \\w or \\s (lower-case name) as character ranges, with ECMA's meaning."""
    if name == "d":
        return [("0", "9")]
    if name == "w":
        return [("0", "9"), ("A", "Z"), ("_", "_"), ("a", "z")]
    return [(c, c) for c in _ECMA_SPACE]


def _class_rust(name: str) -> str:
    body = {"d": "0-9", "w": "0-9A-Za-z_", "s": "".join(class_escape(c) for c in _ECMA_SPACE)}[name.lower()]
    return body if name.islower() else f"[^{body}]"


@lru_cache(maxsize=1)
def space_sets() -> tuple[list[str], list[str]]:
    """(the spaces ECMA and Python's re both have, those either has): Python's \\s has \\x1c-\\x1f and \\x85
    where ECMA's has \\ufeff (all of either lie in the BMP)."""
    python = {chr(c) for c in range(0x10000) if _py_class_has("s", chr(c))}
    return sorted(python & set(_ECMA_SPACE)), sorted(python | set(_ECMA_SPACE))


@lru_cache(maxsize=1)
def _python_spaces() -> tuple[str, str]:
    """space_sets as class bodies."""
    both, either = space_sets()
    return "".join(class_escape(c) for c in both), "".join(class_escape(c) for c in either)


def _agreeing_class_rust(name: str, widen: bool) -> str:
    """A class escape as the characters both engines put in it, or (``widen``, inside a negated class) as
    those either puts in it. Python's \\d is every Nd digit and its \\w every str.isalnum() character (letters and
    numbers) and "_": \\p{Nd} and WORD hold those (of Python's Unicode version or older; llguidance's own \\w
    is not Unicode's, so the properties are named)."""
    both, either = _python_spaces()
    narrow = {"d": "0-9", "w": "0-9A-Za-z_", "s": both, "D": "\\P{Nd}", "W": f"[^{WORD}]", "S": f"[^{either}]"}
    wide = {"d": "0-9\\p{Nd}", "w": f"0-9A-Za-z_{WORD}", "s": either, "D": "[^0-9]", "W": "[^0-9A-Za-z_]"}
    wide["S"] = f"[^{both}]"
    return (wide if widen else narrow)[name]


def _py_class_has(name: str, ch: str) -> bool:
    """Python re's verdict (jsonschema's engine) for \\d, \\w, \\s or a negation, on one character."""
    return _PY_CLASSES[name].fullmatch(ch) is not None


WORD = "\\p{L}\\p{N}\\p{M}\\p{Pc}"  # a superset of Python's \\w (str.isalnum() and "_"), as Unicode properties
_PY_CLASSES = {name: re.compile("\\" + name) for name in "dDwWsS"}


@lru_cache(maxsize=256)
def prop_regex(name: str) -> Any:  # a compiled pattern of `regex` (which has no type information)
    import regex

    try:
        return regex.compile(r"\p{" + name + "}")
    except regex.error:
        raise GrammarError(f"unknown Unicode property \\p{{{name}}} in pattern") from None


def _prop_has(name: str, ch: str) -> bool:
    return prop_regex(name).fullmatch(ch) is not None


# AST: ("lit", ch) ("set", CharSet) ("seq", [..]) ("alt", [..]) ("rep", node, lo, hi) ("bol",) ("eol",)
# ("look", ahead: bool, negated: bool, node)
Node: TypeAlias = tuple[Any, ...]


def top_alternatives(node: Node) -> list[Node]:
    """The pattern's top-level alternatives, looking through a group that is the whole pattern."""
    if node[0] == "alt":
        out: list[Node] = []
        for n in node[1]:
            out += top_alternatives(n)
        return out
    if node[0] == "seq" and len(node[1]) == 1 and node[1][0][0] in ("alt", "seq"):
        return top_alternatives(node[1][0])
    return [node]
