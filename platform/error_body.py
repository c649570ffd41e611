"""The body of every error response, in OpenAI's format (msgspec; it drives the OpenAPI document)."""

from __future__ import annotations

from msgspec import Struct


class ErrorDetail(Struct, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct, kw_only=True):
    """Every error, in OpenAI's format."""

    error: ErrorDetail
