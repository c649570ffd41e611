"""The engine's error types. Each carries a ``code``, a short stable tag (as ``AdapterError`` does), so the
HTTP layer maps errors to API responses without reading their messages."""

from __future__ import annotations


class EngineError(ValueError):
    """Base of the engine's refusals; ``str(err)`` names the problem plainly."""

    default_code = "engine_error"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code or self.default_code
        self.field = field  # the request field it is about, where it is one the HTTP API names alike


class RequestError(EngineError):
    """A request that cannot be served as given (``code``: ``invalid_request``, or
    ``context_length_exceeded`` when the prompt does not fit ``max_model_len``)."""

    default_code = "invalid_request"


class ModelLoadError(EngineError):
    """A model directory that cannot be served; the message names what is wrong or missing."""

    default_code = "model_load_error"
