"""How deeply JSON text nests, measured on the raw text without parsing it (and so without recursion).

Python's json module and msgspec both recurse once per level of arrays and objects: JSON nested a few
thousand levels deep raises RecursionError instead of a parse error. ``check_json_depth`` runs before
them on every JSON text loraplex accepts from outside (request bodies, JSON schemas sent as strings,
adapter_config.json, safetensors headers).
"""

from __future__ import annotations

import re

import numpy as np

DEFAULT_MAX_JSON_DEPTH = 64

# A complete JSON string (escapes included): brackets inside strings do not nest.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JsonTooDeep(ValueError):
    """JSON text nests arrays and objects deeper than ``limit`` levels."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nests arrays and objects deeper than {limit} levels")
        self.limit = limit


def exceeds_depth(text: bytes | str, limit: int) -> bool:
    """True if ``text`` nests arrays and objects more than ``limit`` levels deep.

    Strings are cut out (one regex pass), every byte but brackets dropped (``bytes.translate``), and the
    deepest level is the maximum of the running sum of +1 per opener and -1 per closer (numpy), so the
    cost is linear and in C. Text that is not JSON (an unterminated string, unbalanced brackets) is
    measured the same way: its unclosed openers count as levels.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    brackets = _STRING.sub(b"", data).translate(_TO_SQUARE, _NOT_BRACKETS)
    if brackets.count(b"[") <= limit:
        return False
    # "[" is 0x5B and "]" is 0x5D: 0x5C - byte is +1 for an opener and -1 (255 as int8) for a closer
    steps = (np.uint8(0x5C) - np.frombuffer(brackets, dtype=np.uint8)).view(np.int8)
    return int(np.cumsum(steps, dtype=np.int32).max()) > limit


_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1
_KEY = re.compile(rb'\s*"((?:[^"\\]|\\.)*)"\s*:')


def deepest_member(text: bytes | str, limit: int) -> tuple[bool, str | None]:
    """Whether a JSON object's members nest deeper than ``limit`` levels below the object itself (the object, a
    request's envelope, is not counted), and the key of the first member that does (None where it cannot be
    read). Text that is not an object is measured whole, as ``exceeds_depth`` does. Linear, without recursion."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if not data.lstrip().startswith(b"{"):
        return exceeds_depth(data, limit), None
    if not exceeds_depth(data, limit + 1):
        return False, None
    # strings blanked to the same length, so positions still point into `data`
    blanked = _STRING.sub(lambda m: b'"' + b" " * (len(m[0]) - 2) + b'"', data)
    depth = np.cumsum(_STEP[np.frombuffer(blanked, dtype=np.uint8)], dtype=np.int32)
    deepest = int(np.argmax(depth > limit + 1))
    starts = np.flatnonzero((depth[:deepest] == 1) & np.isin(np.frombuffer(blanked[:deepest], np.uint8), list(b"{,")))
    if not len(starts):
        return True, None
    found = _KEY.match(data, int(starts[-1]) + 1)
    if found is None:
        return True, None
    try:
        return True, found[1].decode("utf-8")
    except UnicodeDecodeError:
        return True, None


def check_json_depth(text: bytes | str, limit: int) -> None:
    """Raise JsonTooDeep if ``text`` nests deeper than ``limit`` levels."""
    if exceeds_depth(text, limit):
        raise JsonTooDeep(limit)
