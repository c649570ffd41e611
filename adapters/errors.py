"""The one exception every adapter refusal raises."""

from __future__ import annotations


class AdapterError(ValueError):
    """An adapter was refused; ``str(err)`` names the problem plainly.

    ``code`` is a short stable tag (``"wrong_base_model"``, ``"pickled_weights"``, ...) that the
    HTTP layer can put into OpenAI's error body without parsing the message.
    """

    def __init__(self, message: str, *, code: str = "invalid_adapter") -> None:
        super().__init__(message)
        self.code = code
