"""Confidence per field: for each leaf value of a constrained JSON output, the logprobs of the tokens that wrote it.

A leaf is a string, number, true, false, null, or an empty object or array; it is named by its JSON pointer (RFC
6901). Its span is its text in the output (a string's quotes included). A token counts for a leaf when its bytes
overlap the leaf's span, so a token that writes a value and what follows it (`"}`, `5,`) counts for that value, and
one that spans two values (`1,2` in an array) counts for both. The figures are the logprobs the `logprobs` field
reports for those tokens (the distribution each was sampled from: after penalties and the grammar's mask). Every
token of such a
request is sampled: jump-forward does not append forced tokens to it (as for `logprobs`), so a forced token counts
with its own logprob; n-gram drafts the model accepted count as the sampled tokens they equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_WHITESPACE = b" \t\n\r"
_LITERALS = (b"true", b"false", b"null")


@dataclass(frozen=True)
class FieldLogprob:
    logprob: float  # the sum of its tokens' logprobs
    min_logprob: float  # the lowest of them
    tokens: int  # how many tokens wrote it


class _Leaves:
    """The byte spans of a JSON text's leaves, by pointer (the text is valid JSON: the grammar made it)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.spans: dict[str, tuple[int, int]] = {}

    def _skip(self, i: int) -> int:
        while i < len(self.data) and self.data[i] in _WHITESPACE:
            i += 1
        return i

    def value(self, i: int, pointer: str) -> int:
        """Record the value starting at (or after whitespace from) ``i``; the index after it."""
        i = self._skip(i)
        c = self.data[i : i + 1]
        if c == b"{":
            return self._container(i, pointer, b"}", keyed=True)
        if c == b"[":
            return self._container(i, pointer, b"]", keyed=False)
        end = self._string_end(i) if c == b'"' else self._scalar_end(i)
        self.spans[pointer] = (i, end)
        return end

    def _container(self, start: int, pointer: str, close: bytes, keyed: bool) -> int:
        i = self._skip(start + 1)
        if self.data[i : i + 1] == close:
            self.spans[pointer] = (start, i + 1)  # an empty object or array is a leaf
            return i + 1
        index = 0
        while True:
            if keyed:
                key_end = self._string_end(i)
                key = _unescape(self.data[i:key_end])
                i = self._skip(key_end)
                if self.data[i : i + 1] != b":":
                    raise ValueError(f"expected ':' at byte {i}")
                child = pointer + "/" + key.replace("~", "~0").replace("/", "~1")
                i += 1
            else:
                child = f"{pointer}/{index}"
            i = self._skip(self.value(i, child))
            index += 1
            c = self.data[i : i + 1]
            if c == close:
                return i + 1
            if c != b",":
                raise ValueError(f"expected ',' or {close.decode()!r} at byte {i}")
            i = self._skip(i + 1)

    def _string_end(self, i: int) -> int:
        if self.data[i : i + 1] != b'"':
            raise ValueError(f"expected a string at byte {i}")
        j = i + 1
        while j < len(self.data):
            c = self.data[j]
            if c == 0x5C:  # a backslash escapes the next byte
                j += 2
                continue
            if c == 0x22:
                return j + 1
            j += 1
        raise ValueError("unterminated string")

    def _scalar_end(self, i: int) -> int:
        for literal in _LITERALS:
            if self.data.startswith(literal, i):
                return i + len(literal)
        j = i
        while j < len(self.data) and (self.data[j] in b"-+.eE" or 0x30 <= self.data[j] <= 0x39):
            j += 1
        if j == i:
            raise ValueError(f"expected a value at byte {i}")
        return j


def _unescape(quoted: bytes) -> str:
    key: str = json.loads(quoted)
    return key


def leaf_spans(text: bytes) -> dict[str, tuple[int, int]]:
    """Byte spans [start, end) of each leaf of a JSON text, by JSON pointer ("" for a scalar root)."""
    leaves = _Leaves(text)
    end = leaves._skip(leaves.value(0, ""))
    if end != len(text):
        raise ValueError(f"text after the JSON value at byte {end}")
    return leaves.spans


def field_logprobs(token_bytes: list[bytes], logprobs: list[float]) -> dict[str, FieldLogprob]:
    """Per leaf of the JSON text the tokens spell, the sum and lowest of its tokens' logprobs and their count.
    Raises ValueError when the tokens do not spell one JSON value."""
    if len(token_bytes) != len(logprobs):
        raise ValueError(f"{len(token_bytes)} tokens but {len(logprobs)} logprobs")
    starts = []
    pos = 0
    for data in token_bytes:
        starts.append(pos)
        pos += len(data)
    spans = leaf_spans(b"".join(token_bytes))
    out: dict[str, FieldLogprob] = {}
    for pointer, (lo, hi) in spans.items():
        mine = [lp for s, data, lp in zip(starts, token_bytes, logprobs) if s < hi and s + len(data) > lo]
        out[pointer] = FieldLogprob(sum(mine), min(mine), len(mine))
    return out
