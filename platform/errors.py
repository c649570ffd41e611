"""API errors and the exception handlers that render every failure in OpenAI's error body:
`{"error": {"message", "type", "param", "code"}}` with a fitting HTTP status."""

from __future__ import annotations

import logging
import re
from typing import Any

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import ResponseSpec

from loraplex.platform.domain_errors import (
    Conflict,
    DomainError,
    Failed,
    Forbidden,
    Invalid,
    NotFound,
    RateLimited,
    TooLarge,
)
from loraplex.platform.error_codes import ErrorCode

log = logging.getLogger("loraplex.platform")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An error with an HTTP status, rendered in OpenAI's format."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: ErrorCode | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None, code: ErrorCode = "invalid_request") -> ApiError:
    """A 400; every refusal carries a code (``invalid_request`` unless a more precise one is given)."""
    return ApiError(400, message, param=param, code=code)


# The one mapping from a service's refusal to HTTP: each kind of domain error has its status.
_STATUS_OF: dict[type[DomainError], int] = {
    Invalid: 400,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    TooLarge: 413,
    RateLimited: 429,
    Failed: 500,
}


def api_error(exc: DomainError) -> ApiError:
    """The HTTP error of a service's refusal: its status by kind, its message, code and param unchanged."""
    status = next(s for kind, s in _STATUS_OF.items() if isinstance(exc, kind))
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, RateLimited) else None
    return ApiError(status, exc.message, param=exc.param, code=exc.code, headers=headers)


def error_body(status: int, message: str, param: str | None = None, code: ErrorCode | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def _response(
    status: int,
    message: str,
    param: str | None = None,
    code: ErrorCode | None = None,
    headers: dict[str, str] | None = None,
) -> Response[dict[str, Any]]:
    return Response(
        error_body(status, message, param, code), status_code=status, headers=headers, media_type=MediaType.JSON
    )


def _param_of(exc: ValidationException) -> str | None:
    """The field a Litestar/msgspec validation error is about (`$.max_tokens` -> `max_tokens`; an unknown field
    `x` in `$.messages[0]` -> `messages[0].x`)."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    for item in extra:
        if not isinstance(item, dict):
            continue
        unknown = re.match(r"Object contains unknown field `([^`]*)`", str(item.get("message", "")))
        if unknown:
            key = str(item.get("key") or "")
            return f"{key}.{unknown[1]}" if key and key != "data" else unknown[1]
        if item.get("key"):
            return str(item["key"]).replace("[...]", "")  # a dict value's path names the dict
    detail = str(exc.detail)
    if "at `$." in detail:
        return detail.split("at `$.", 1)[1].split("`", 1)[0]
    return None


def _message_of(exc: ValidationException) -> str:
    extra = exc.extra if isinstance(exc.extra, list) else []
    parts = [str(item.get("message")) for item in extra if isinstance(item, dict) and item.get("message")]
    return "; ".join(parts) if parts else str(exc.detail)


_DESCRIPTIONS = {
    400: "Invalid request (the field is named in `param`)",
    401: "Missing, invalid or revoked API key",
    403: "Not allowed (admin key required, or a quota exceeded)",
    404: "Not found (another tenant's objects are indistinguishable from missing ones)",
    409: "Conflict with an existing object",
    413: "Request body over the size limit",
    415: "Wrong content type",
    429: "Rate limit exceeded (see Retry-After)",
    500: "Internal or engine error",
}


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries documenting the error body for `statuses` (replacing Litestar's default 400)."""
    from loraplex.platform.error_body import ErrorResponse

    return {
        status: ResponseSpec(data_container=ErrorResponse, description=_DESCRIPTIONS[status], generate_examples=False)
        for status in statuses
    }


def handle_api_error(_: Request, exc: ApiError) -> Response[dict[str, Any]]:
    return _response(exc.status, exc.message, exc.param, exc.code, exc.headers)


def handle_domain_error(request: Request, exc: DomainError) -> Response[dict[str, Any]]:
    return handle_api_error(request, api_error(exc))


def handle_http_exception(_: Request, exc: HTTPException) -> Response[dict[str, Any]]:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        param = _param_of(exc)
        message = _message_of(exc)
        return _response(400, f"{param}: {message}" if param else message, param, "invalid_request")
    codes: dict[int, ErrorCode] = {
        401: "invalid_api_key",
        404: "not_found",
        405: "method_not_allowed",
        413: "request_too_large",
        429: "rate_limit_exceeded",
    }
    message = str(exc.detail)
    if status == 413 and message == "Request Entity Too Large":
        message = "request body too large"
    elif status == 400:  # Litestar's body decoding errors carry msgspec's terse message
        message = f"invalid request body: {message}"
        codes[400] = "invalid_json"
    return _response(status, message, None, codes.get(status), dict(exc.headers or {}))


def handle_internal_error(request: Request, exc: Exception) -> Response[dict[str, Any]]:
    from loraplex.platform.faults import dependency_error  # (it names this module's ApiError)

    known = dependency_error(exc)
    if known is not None:  # a dependency down: the answer says which, and when to retry
        log.warning("%s %s: %s (%s: %s)", request.method, request.url.path, known.code, type(exc).__name__, exc)
        return handle_api_error(request, known)
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _response(500, f"internal server error ({type(exc).__name__})", None, "internal_error")


EXCEPTION_HANDLERS = {
    ApiError: handle_api_error,
    DomainError: handle_domain_error,
    HTTPException: handle_http_exception,
    Exception: handle_internal_error,
}
