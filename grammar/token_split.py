"""The fewest tokens spelling a byte string: the last step of every budget plan (grammar/search.py's
``CompletionSearch.tokenize``), in C (kernels/csrc/token_split.c) where the C kernels run.

The Python dynamic programme there is the reference (tests/grammar/test_span_greedy.py compares the two on random
strings): it slices and looks up every (position, length) pair, about a millisecond for a plan of 80 bytes, which a
span grammar pays on every request (its plans read the request's source). Here the tokens starting at a position are
found by one walk down a trie of the same byte strings.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES: dict[str, tuple[object, list[Any]]] = {
    "loraplex_split_trie_new": (_P, [_P, _P, _P, _I64]),
    "loraplex_split_trie_free": (None, [_P]),
    "loraplex_fewest_tokens": (_I64, [_P, _I64, _P, _I64, _P]),
}


def _library() -> ctypes.CDLL | None:
    from loraplex.kernels.cpu_build import load

    return load("token_split", _SIGNATURES)


class TokenSplitter:
    """The C trie of ``by_bytes`` (byte string -> the token spelling it), built at the first split."""

    def __init__(self, by_bytes: dict[bytes, int], max_token_bytes: int) -> None:
        self._by_bytes, self.max_token_bytes = by_bytes, max_token_bytes
        self._lib: ctypes.CDLL | None = None
        self._trie: ctypes.c_void_p | None = None
        self._lock = threading.Lock()

    def _built(self) -> ctypes.c_void_p | None:
        with self._lock:
            if self._trie is None:
                lib = _library()
                if lib is None:
                    return None
                keys = list(self._by_bytes)
                data = b"".join(keys)
                offsets = np.zeros(len(keys) + 1, dtype=np.int64)
                np.cumsum([len(k) for k in keys], out=offsets[1:])
                tokens = np.fromiter(self._by_bytes.values(), dtype=np.int32, count=len(keys))
                handle = lib.loraplex_split_trie_new(data, offsets.ctypes.data, tokens.ctypes.data, len(keys))
                if not handle:
                    raise MemoryError("the token split's trie could not be allocated")
                self._lib, self._trie = lib, ctypes.c_void_p(handle)
            return self._trie

    def split(self, data: bytes) -> list[int] | None:
        """The fewest tokens spelling ``data`` (ties as the Python programme breaks them); None where the C kernels
        do not run here, or some byte has no token."""
        trie = self._built()
        if trie is None:
            return None
        out = np.empty(max(1, len(data)), dtype=np.int32)
        n = self._lib.loraplex_fewest_tokens(trie, self.max_token_bytes, data, len(data), out.ctypes.data)  # type: ignore[union-attr]
        return None if n < 0 else out[:n].tolist()

    def __del__(self) -> None:
        if getattr(self, "_trie", None) is not None and self._lib is not None:
            self._lib.loraplex_split_trie_free(self._trie)
            self._trie = None
