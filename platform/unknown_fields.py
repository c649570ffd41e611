"""Request fields the server does not know: refused by name (the default) or, with the server option
`unknown_fields = "warn"`, removed from the body, logged and named in a response header.

msgspec decides what is unknown: the request structs forbid unknown fields, and each ValidationError
about one names it and where it is (`Object contains unknown field `x` - at `$.messages[0]``). In warn
mode the field is removed and the body converted again, until it converts or fails for another reason
(which the route's own decoding then reports)."""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

import msgspec

from loraplex.platform.errors import ApiError

UnknownFields = Literal["refuse", "warn"]
IGNORED_HEADER = "x-loraplex-ignored-fields"
MAX_IGNORED = 64  # more unknown fields than this in one body is refused even in warn mode
log = logging.getLogger("loraplex.platform")

_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]*)`(?: - at `\$(?P<path>[^`]*)`)?")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def unknown_field(message: str) -> tuple[str, str] | None:
    """(path of the object, field name) of msgspec's unknown-field message, e.g. ("messages[0]", "foo")."""
    m = _UNKNOWN.match(message)
    if m is None:
        return None
    return (m["path"] or "").lstrip("."), m["field"]


def param_name(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def refusal(param: str) -> ApiError:
    return ApiError(
        400,
        f"unknown field {param!r}: this server does not know it and does not ignore fields silently "
        "(docs/requests.md lists the fields it accepts)",
        param=param,
        code="unknown_field",
    )


def _remove(body: Any, path: str, field: str) -> None:
    node = body
    for key, index in _STEP.findall("." + path if path and not path.startswith("[") else path):
        node = node[int(index)] if index else node[key]
    del node[field]


def screen(body: Any, body_type: type, mode: UnknownFields) -> list[str]:
    """The unknown fields of ``body`` for ``body_type`` (dotted paths), removed from ``body`` in warn mode;
    in refuse mode the first one is a 400 naming it."""
    ignored: list[str] = []
    while True:
        try:
            msgspec.convert(body, body_type, strict=False, str_keys=True)
            return ignored
        except msgspec.ValidationError as exc:
            found = unknown_field(str(exc))
            if found is None:
                return ignored  # another problem: the route's decoding reports it
            param = param_name(*found)
            if mode == "refuse":
                raise refusal(param) from None
            if len(ignored) >= MAX_IGNORED:
                raise ApiError(
                    400,
                    f"more than {MAX_IGNORED} unknown fields in one request (the last: {param!r})",
                    param=param,
                    code="unknown_field",
                ) from None
            _remove(body, *found)
            ignored.append(param)


def ignored_header(ignored: list[str], what: str) -> dict[str, str]:
    """The response header naming the fields a warn-mode request carried without effect (and a log line)."""
    if not ignored:
        return {}
    names = [ascii(name)[1:-1].replace(",", "\\x2c") for name in ignored]  # no control characters in a header
    log.warning("%s: ignored unknown request fields: %s", what, ", ".join(names))
    return {IGNORED_HEADER: ",".join(names)}
