"""An endpoint's defaults applied to one request: what the request leaves unset takes the endpoint's value; what
it sets where the endpoint has a value is an override, allowed only for the endpoint's `overridable` fields
(otherwise a 400 naming the request's field). `max_tokens` is a cap: fewer is always allowed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypeVar

import msgspec

from loraplex.grammar.spec import GrammarError
from loraplex.platform.domain_errors import DomainError, Invalid, refused
from loraplex.platform.endpoints.schemas import EndpointDefaults
from loraplex.platform.endpoints.service import EndpointRecord
from loraplex.platform.errors import ApiError
from loraplex.platform.openai.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from loraplex.platform.openai.translate import structured_request, structured_spec

if TYPE_CHECKING:
    from loraplex.engine import AsyncEngine

Req = TypeVar("Req", CompletionRequest, ChatCompletionRequest)

_SAMPLING = ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "seed", "stop")
# Every request field that constrains the output: each one overrides the endpoint's response_format.
_STRUCTURED = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


def _forbidden(endpoint: EndpointRecord, param: str, what: str) -> Exception:
    return Invalid(
        f"endpoint {endpoint.name!r} sets {what} and does not let requests override it (overridable: "
        f"{', '.join(sorted(endpoint.overridable)) or 'nothing'})",
        param=param,
        code="override_not_allowed",
    )


def apply_defaults(data: Req, endpoint: EndpointRecord) -> Req:
    defaults = endpoint.defaults
    allowed = endpoint.overridable
    changes: dict[str, object] = {}
    for field in _SAMPLING:
        value = getattr(defaults, field)
        if value is None:
            continue
        if getattr(data, field) is None:
            changes[field] = value
        elif field not in allowed:
            raise _forbidden(endpoint, field, field)
    if defaults.response_format is not None:
        given = [f for f in _STRUCTURED if getattr(data, f) is not None]
        if not given:
            changes["response_format"] = defaults.response_format
        elif "response_format" not in allowed:
            raise _forbidden(endpoint, given[0], "response_format")
    if defaults.max_tokens is not None:
        changes.update(_capped(data, endpoint, defaults.max_tokens))
    if defaults.system_prompt is not None:
        if isinstance(data, CompletionRequest):
            raise Invalid(
                f"endpoint {endpoint.name!r} has a system prompt: call it through /v1/chat/completions",
                param="model",
            )
        if not any(m.role in ("system", "developer") for m in data.messages):
            changes["messages"] = [ChatMessage(role="system", content=defaults.system_prompt), *data.messages]
        elif "system_prompt" not in allowed:
            raise _forbidden(endpoint, "messages", "the system prompt")
    return msgspec.structs.replace(data, **changes) if changes else data


def _capped(data: CompletionRequest | ChatCompletionRequest, endpoint: EndpointRecord, cap: int) -> dict[str, int]:
    param, requested = "max_tokens", data.max_tokens
    if isinstance(data, ChatCompletionRequest) and data.max_completion_tokens is not None:
        param, requested = "max_completion_tokens", data.max_completion_tokens
    if requested is None:
        return {"max_tokens": cap}
    if requested > cap and "max_tokens" not in endpoint.overridable:
        raise Invalid(
            f"endpoint {endpoint.name!r} caps {param} at {cap}; got {requested}",
            param=param,
            code="override_not_allowed",
        )
    return {}


async def compile_defaults(engine: AsyncEngine, defaults: EndpointDefaults, max_json_depth: int) -> None:
    """Compile an endpoint's response_format at publish, as its requests will (a refusal is the 400 here, naming
    `defaults.response_format`); the compiled grammar stays in the engine's compile cache for them."""
    if defaults.response_format is None:
        return
    probe = ChatCompletionRequest(
        model="", messages=[ChatMessage(role="user", content="")], response_format=defaults.response_format
    )
    param = "defaults.response_format"
    try:
        structured = structured_request(probe, max_json_depth)
    except (ApiError, DomainError) as exc:  # the translation's refusal, named after the endpoint's field
        raise Invalid(exc.message, param=param, code=exc.code) from None
    spec = structured_spec(structured) if structured is not None else None
    if spec is None:
        return
    try:
        await asyncio.wrap_future(engine.compile_grammar(spec))
    except GrammarError as exc:
        raise refused(exc, param=param) from None
