"""Forced bytes: the text every continuation a constraint allows from here starts with (byte-level jump-forward).

The walk works on any backend through its token masks: while every allowed token starts with the same byte, that
byte is forced; a scratch copy of the matcher advances by that byte's single-byte token and the walk goes on. A
mask that allows EOS (a complete output may end here) or tokens of two first bytes ends it. Byte-level BPE
vocabularies (SmolLM2, GPT-2, Llama 3) have a token for each of the 256 bytes; where one is missing the walk stops
before that byte.

One mask fill and one AND over the bitmask words per forced byte; the per-vocabulary tables are built once.
llguidance computes forced bytes itself (one call, microseconds), which `forced` uses where the backend has it.
"""

from __future__ import annotations

import numpy as np
import torch

from loraplex.grammar.backend_outlines.node import ByteTables
from loraplex.grammar.backend_types import GrammarMatcher
from loraplex.grammar.vocab import VocabInfo

DEFAULT_LIMIT = 64  # bytes per walk: a forced run longer than this continues after the next step


class ByteTable:
    """Per vocabulary: each token's first byte, the single-byte token of each byte value, and for each byte value
    the bitmask of the tokens that do NOT start with it (special and unused ids included)."""

    def __init__(self, info: VocabInfo) -> None:
        self.words = info.words
        self.tables = ByteTables.of(info)
        self.byte_token = self.tables.byte_token

    def forced(self, matcher: GrammarMatcher, limit: int = DEFAULT_LIMIT) -> tuple[bytes, bool]:
        """The bytes forced from the matcher's state (at most ``limit``), and whether the output is then complete
        with nothing more allowed (the forced text ends it): the backend's own answer where it has one (one call
        instead of a mask per byte), else the mask walk. The matcher itself is not changed."""
        native = matcher.native_forced_bytes()
        if native is None:
            return self.walk(matcher, limit)
        data = native[:limit]
        if not data:
            return data, matcher.is_terminated()
        scratch = matcher.fork()
        for n, b in enumerate(data):
            token = int(self.byte_token[b])
            if token < 0 or not scratch.accept_token(token):
                return data[:n], False
        return data, scratch.is_terminated()

    def walk(self, matcher: GrammarMatcher, limit: int = DEFAULT_LIMIT) -> tuple[bytes, bool]:
        """The mask walk of ``forced``, for any backend."""
        scratch = matcher.fork()
        buf = torch.zeros(self.words, dtype=torch.int32)
        words = buf.numpy().view(np.uint32)
        out = bytearray()
        while len(out) < limit and not scratch.is_terminated():
            scratch.fill_bitmask(buf)
            b = self.tables.forced_byte(words)
            if b is None:
                break  # nothing, EOS or a special token allowed, or tokens of more than one first byte
            token = int(self.byte_token[b])
            if token < 0 or not scratch.accept_token(token):
                break
            out.append(b)
        return bytes(out), scratch.is_terminated()
