"""JSON request bodies are measured for nesting depth before they are decoded: msgspec (like Python's
json) recurses once per level, so a body nested thousands of levels deep would be a RecursionError (500)
instead of a 400. Litestar decodes every JSON body through ``Request.json()``; the app's request class
checks the raw bytes there first (``loraplex.adapters.json_depth``, linear and without recursion)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from loraplex.adapters.json_depth import exceeds_depth
from loraplex.platform.errors import ApiError


def too_deep(what: str, limit: int, param: str | None = None) -> ApiError:
    return ApiError(
        400,
        f"{what} nests arrays and objects deeper than {limit} levels (the limit max_json_depth)",
        param=param,
        code="json_too_deep",
    )


def depth_limited_request(max_depth: int) -> type[Request[Any, Any, Any]]:
    """The app's request class: ``json()`` refuses a body nested deeper than ``max_depth`` levels."""

    class DepthLimitedRequest(Request[Any, Any, Any]):
        async def json(self) -> Any:
            if exceeds_depth(await self.body(), max_depth):
                raise too_deep("the JSON body", max_depth)
            return await super().json()

    return DepthLimitedRequest
