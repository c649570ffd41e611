"""JSON request bodies are measured for nesting depth before they are decoded: msgspec (like Python's
json) recurses once per level, so a body nested thousands of levels deep would be a RecursionError (500)
instead of a 400. Litestar decodes every JSON body through ``Request.json()``; the app's request class
checks the raw bytes there first (``loraplex.adapters.json_depth``, linear and without recursion)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from loraplex.adapters.json_depth import deepest_member
from loraplex.platform.errors import ApiError
from loraplex.platform.unknown_fields import UnknownFields, screen

BODY_TYPE = "body_type"  # a route's `opt` key: the struct its JSON body is screened for unknown fields against
IGNORED_STATE = "ignored_fields"  # request.state key: the unknown fields a warn-mode request carried


def too_deep(what: str, limit: int, param: str | None = None) -> ApiError:
    return ApiError(
        400,
        f"{what} nests arrays and objects deeper than {limit} levels (the limit max_json_depth)",
        param=param,
        code="json_too_deep",
    )


def depth_limited_request(max_depth: int, unknown_fields: UnknownFields = "refuse") -> type[Request[Any, Any, Any]]:
    """The app's request class: ``json()`` refuses a body nested deeper than ``max_depth`` levels, and on routes
    whose ``opt`` names a ``body_type``, refuses its unknown fields or (warn) removes them and records them in
    ``request.state.ignored_fields``."""

    class DepthLimitedRequest(Request[Any, Any, Any]):
        async def json(self) -> Any:
            deep, field = deepest_member(await self.body(), max_depth)
            if deep:  # (members are measured below the body's own object: a tool schema may nest max_depth levels)
                raise too_deep("the JSON body" if field is None else f"the body's {field!r}", max_depth, param=field)
            data = await super().json()
            body_type = self.route_handler.opt.get(BODY_TYPE)
            if body_type is not None and isinstance(data, dict) and IGNORED_STATE not in self.state:
                self.state[IGNORED_STATE] = screen(data, body_type, unknown_fields)
            return data

    return DepthLimitedRequest
