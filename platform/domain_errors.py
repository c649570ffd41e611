"""What services refuse, in the domain's words: a small hierarchy of errors, each carrying its `code` (and the
request field it is about, `param`). Services raise these and know nothing of HTTP; `errors.py` is the one
place that maps each kind to a status and renders it in OpenAI's error body."""

from __future__ import annotations

from typing import cast

from loraplex.adapters.errors import AdapterError
from loraplex.engine.errors import EngineError
from loraplex.grammar.spec import GrammarError
from loraplex.platform.error_codes import ErrorCode


class DomainError(Exception):
    """A refusal by a service: `message` for people, `code` for programs, `param` the field it is about."""

    def __init__(self, message: str, *, code: ErrorCode | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class Invalid(DomainError):
    """The request cannot be served as asked (a bad value, a refused constraint or adapter)."""


class Forbidden(DomainError):
    """Allowed in general, not to this tenant now (a quota is used up)."""


class NotFound(DomainError):
    """No such object for this tenant (another tenant's objects are indistinguishable from missing ones)."""


class Conflict(DomainError):
    """The request contradicts the stored state (a name taken, a version in use, nothing to promote)."""


class TooLarge(DomainError):
    """The request is over a size limit."""


class RateLimited(DomainError):
    """Over a running limit: retry after `retry_after_s` seconds."""

    def __init__(self, message: str, *, code: ErrorCode, retry_after_s: int | float, param: str | None = None) -> None:
        super().__init__(message, code=code, param=param)
        self.retry_after_s = retry_after_s


class Failed(DomainError):
    """The server failed the request (the engine failed it, stored weights failed verification)."""


REFUSALS = (EngineError, GrammarError, AdapterError)  # what `refused` maps
_TOO_LARGE_CODES = frozenset({"archive_too_large", "adapter_too_large"})  # adapter refusals about size


def refused(exc: EngineError | GrammarError | AdapterError, param: str | None = None) -> DomainError:
    """The domain error for a refusal by the engine, the grammar compiler or the adapter checks: its kind and
    `code` come from the refusal's own code, never from its message."""
    code = cast(ErrorCode, exc.code)  # the lower layers' codes are strings; each is registered in error_codes
    if isinstance(exc, GrammarError):
        return Invalid(f"invalid structured-output constraint: {exc}", param=param, code=code)
    if isinstance(exc, AdapterError):
        kind = TooLarge if code in _TOO_LARGE_CODES else Invalid
        return kind(f"adapter refused: {exc}", param=param or "file", code=code)
    return Invalid(str(exc), param=param, code=code)
