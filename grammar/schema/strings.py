"""ECMA-262 patterns built from string sets, for rewrites that must say "any string but these"."""

from __future__ import annotations

from typing import Any

_SYNTAX = set("\\^$.|?*+()[]{}/-")


def _escape(ch: str) -> str:
    if ch in _SYNTAX:
        return "\\" + ch
    if ord(ch) < 0x20 or ch in "\u2028\u2029":
        return f"\\u{ord(ch):04x}"
    return ch


def not_one_of_pattern(words: list[str]) -> str:
    """An anchored pattern matching every string except ``words`` (exactly: the complement of a finite set)."""
    trie: dict[str | None, Any] = {}  # a character -> subtrie; None -> a word ends here
    for word in set(words):
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[None] = True  # a word ends here

    def rest(node: dict[str | None, Any]) -> str:
        """Strings that, read from ``node``, do not complete a word."""
        children = sorted(k for k in node if k is not None)
        alts = [] if None in node else [""]  # stopping here is fine unless a word ends here
        other = "[\\s\\S]" if not children else "[^" + "".join(_escape(c) for c in children) + "]"
        alts.append(other + "[\\s\\S]*")
        alts += [_escape(c) + rest(node[c]) for c in children]
        return "(?:" + "|".join(alts) + ")"

    return "^" + rest(trie) + "$"
