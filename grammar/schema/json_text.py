"""Regex pieces for compact JSON text (Rust `regex` syntax, as outlines_core and llguidance read it).

Strings are generated in one canonical spelling per character (what `json.dumps(...,
ensure_ascii=False)` writes): `"` and `\\` and control characters escaped, short escapes where
JSON has them, `\\u00xx` (lower-case hex) for the other control characters, everything else raw.
One spelling per character keeps "a key other than these names" expressible as a regex.
"""

from __future__ import annotations

import functools
import json

# Characters that must be escaped inside a JSON string: the quote, the backslash and C0 controls.
SPECIALS = frozenset(['"', "\\"] + [chr(c) for c in range(0x20)])
_META = frozenset("\\.+*?()|[]{}^$#&-~")
_CLASS_META = frozenset("\\[]^-&~")

UNIT = r'(?:[^"\\\x00-\x1F]|\\["\\bfnrt]|\\u00(?:0[0-7]|0b|0e|0f|1[0-9a-f]))'
STRING = f'"{UNIT}*"'
INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
BOOLEAN = "(?:true|false)"
NULL = "null"


def rx_escape(text: str) -> str:
    """Escape regex meta characters so `text` matches literally."""
    return "".join("\\" + c if c in _META else c for c in text)


def class_escape(ch: str) -> str:
    """One character as it may appear inside a [...] class."""
    if ch in _CLASS_META:
        return "\\" + ch
    if ord(ch) < 0x20 or ch == "\x7f":
        return f"\\x{ord(ch):02X}"
    return ch


@functools.lru_cache(maxsize=4096)
def encode_char(ch: str) -> str:
    """The canonical JSON spelling of one character inside a string."""
    return json.dumps(ch, ensure_ascii=False)[1:-1]


def encoded(text: str) -> str:
    """The canonical JSON spelling of a string's content (without quotes)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def string_literal(text: str) -> str:
    """Regex for exactly the JSON string `text` (with quotes)."""
    return '"' + rx_escape(encoded(text)) + '"'


def alt(parts: list[str]) -> str:
    """Non-capturing alternation; a single part is returned as it is."""
    uniq = list(dict.fromkeys(parts))
    return uniq[0] if len(uniq) == 1 else "(?:" + "|".join(uniq) + ")"


@functools.cache  # only the 34 special characters
def special_escape_rx(ch: str) -> str:
    """Regex for the canonical escape of one special character."""
    return rx_escape(encode_char(ch))


def unit_except(excluded: set[str]) -> str:
    """One string unit (raw character or escape) whose spelling is not in `excluded`."""
    return _unit_except(frozenset(excluded))


@functools.lru_cache(maxsize=4096)  # a key trie asks for the same sets at many nodes
def _unit_except(excluded: frozenset[str]) -> str:
    raw_excluded = sorted(u for u in excluded if len(u) == 1)
    parts = []
    raw = '[^"\\\\\\x00-\\x1F' + "".join(class_escape(c) for c in raw_excluded) + "]"
    parts.append(raw)
    for ch in sorted(SPECIALS):
        spelling = encode_char(ch)
        if spelling not in excluded:
            parts.append(rx_escape(spelling))
    return alt(parts)


class _Trie:
    __slots__ = ("children", "terminal")

    def __init__(self) -> None:
        self.children: dict[str, _Trie] = {}
        self.terminal = False


def content_not_in(names: list[str]) -> str:
    """Regex for the content (between quotes) of any string other than `names`."""
    if not names:
        return UNIT + "*"
    root = _Trie()
    for name in names:
        node = root
        for ch in name:
            node = node.children.setdefault(encode_char(ch), _Trie())
        node.terminal = True

    def walk(node: _Trie) -> str:
        parts = [] if node.terminal else [""]
        parts.append(unit_except(set(node.children)) + UNIT + "*")
        for unit, child in node.children.items():
            parts.append(rx_escape(unit) + walk(child))
        return "(?:" + "|".join(parts) + ")"

    return walk(root)
