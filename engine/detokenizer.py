"""Incremental detokenisation with stop strings.

`tokenizers`' DecodeStream turns tokens into text as they arrive without ever splitting a multi-byte
character. Text that could be the beginning of a stop string is held back until it is known not to
be one, so a stop string never leaks into what was already streamed.
"""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    # tokenizer: a transformers tokenizer (its Rust `_tokenizer` is used) or a `tokenizers.Tokenizer`
    def __init__(self, tokenizer: Any, stop: list[str], skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer._tokenizer if hasattr(tokenizer, "_tokenizer") else tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # everything decoded so far (stop string excluded once found)
        self.emitted = 0  # characters of `text` already released
        self.stopped = False

    def add(self, token_id: int) -> None:
        piece = self._stream.step(self._tok, token_id)
        if piece is None or self.stopped:
            return
        start = max(0, len(self.text) - self._hold - 1)
        self.text += piece
        hits = [p for p in (self.text.find(s, start) for s in self.stop) if p != -1]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def release(self, final: bool) -> str:
        """New text safe to show: all of it when finished, else all but a possible stop-string prefix."""
        end = len(self.text) if (final or self.stopped) else max(self.emitted, len(self.text) - self._hold)
        out = self.text[self.emitted : end]
        self.emitted = end
        return out
