"""Running one batch line through the generation routes' own code path (`generation.service.generate`): the same
decoding, refusals, adapter resolution, structured output and limits as an HTTP request, at background
priority. A refusal becomes the line's result (its status and OpenAI error body), as the route answers it."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from loraplex.platform.batch.schemas import CHAT
from loraplex.platform.container import Services
from loraplex.platform.db.models import Tenant
from loraplex.platform.domain_errors import DomainError
from loraplex.platform.errors import ApiError, api_error, error_body
from loraplex.platform.generation.service import Answer, generate
from loraplex.platform.openai.schemas import ChatCompletionRequest, CompletionRequest
from loraplex.platform.tenants.service import Principal

log = logging.getLogger("loraplex.platform.batch")
RETRY_S = 1.0  # a line refused by the tenant's running limits (429) waits this long without Retry-After


@dataclass(frozen=True)
class LineResult:
    status_code: int
    request_id: str
    body: dict[str, Any]


def principal_of(tenant: Tenant) -> Principal:
    """The tenant a batch acts for, as an API key would resolve it (with its current limits)."""
    return Principal.of_tenant(tenant, "batch")


def _decode(endpoint: str, body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
    """The body decoded as the route decodes its JSON (msgspec), a 400 naming the field otherwise."""
    kind = ChatCompletionRequest if endpoint == CHAT else CompletionRequest
    try:
        return msgspec.json.decode(msgspec.json.encode(body), type=kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = text.split("at `$.", 1)[1].split("`", 1)[0] if "at `$." in text else None
        raise ApiError(400, f"{param}: {text}" if param else text, param=param, code="invalid_request") from None


async def run_line(services: Services, principal: Principal, endpoint: str, body: dict[str, Any]) -> LineResult:
    """The result of one line; waits and retries while the tenant's running limits say 429."""
    fallback_id = f"req_{uuid.uuid4().hex}"
    while True:
        try:
            data = _decode(endpoint, body)
            result = await generate(data, principal, services, background_priority=services.settings.batch_priority)
            assert isinstance(result, Answer)  # a batch line never streams (jsonl refuses body.stream)
            content = msgspec.to_builtins(result.body)
            return LineResult(200, str(content.get("id", fallback_id)), content)
        except (ApiError, DomainError) as caught:
            exc = api_error(caught) if isinstance(caught, DomainError) else caught  # as the route answers it
            if exc.status == 429:
                await asyncio.sleep(float(exc.headers.get("Retry-After", RETRY_S)))
                continue
            return LineResult(exc.status, fallback_id, error_body(exc.status, exc.message, exc.param, exc.code))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("batch line failed")
            message = f"internal server error ({type(exc).__name__})"
            return LineResult(500, fallback_id, error_body(500, message, None, "internal_error"))
