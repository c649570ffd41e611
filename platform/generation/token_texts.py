"""Token id -> text, as OpenAI reports tokens in logprobs (text, not the vocabulary's byte-level form)."""

from __future__ import annotations

import functools
from typing import Any


class TokenTexts:
    """Token id -> the text it decodes to (OpenAI reports text, not the vocabulary's byte-level form)."""

    def __init__(self, tokenizer: Any) -> None:
        self._text = functools.lru_cache(maxsize=65536)(
            lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False)
        )

    def __call__(self, token_id: int) -> str:
        return self._text(token_id)  # type: ignore[no-any-return]  # (the tokenizer's decode is untyped)
