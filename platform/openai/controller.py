"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Completions and chat completions run the generation service (`generation.service.generate`), which the Batch
API runs too; the routes only turn its result into HTTP (server-sent events or one JSON body).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency, Provide
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, Reference, Schema
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from loraplex.platform.adapters.service import AdapterRecord
from loraplex.platform.auth import provide_principal
from loraplex.platform.container import Services
from loraplex.platform.endpoints.service import EndpointRecord
from loraplex.platform.errors import error_responses
from loraplex.platform.generation.service import Answer, EventStream, generate
from loraplex.platform.json_body import BODY_TYPE, IGNORED_STATE
from loraplex.platform.model_ids import adapter_id
from loraplex.platform.model_resolution import STICKY_HEADER
from loraplex.platform.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from loraplex.platform.tenants.service import Principal

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
OPENAI_ERRORS = error_responses(400, 401, 404, 413, 429, 500)


def sticky_key(data: CompletionRequest | ChatCompletionRequest, request: Request[Any, Any, Any]) -> str | None:
    """The end-user key that keeps a caller on one canary version: `user`, else the sticky-key header."""
    return data.user if data.user is not None else request.headers.get(STICKY_HEADER)


def _sse(result: EventStream) -> Stream:
    # Closing the event generator after the response (also after a client disconnect, which cancels
    # the sending task while the generator may be suspended) aborts the engine requests at once;
    # closing `gen` as well covers a generator that never started (its `finally` would not run).
    async def finish() -> None:
        await result.events.aclose()
        await result.generation.close()

    return Stream(
        result.events,
        media_type="text/event-stream",
        headers={**SSE_HEADERS, **result.headers},
        background=BackgroundTask(finish),
    )


def _respond(result: Answer | EventStream) -> Response[Any]:
    """The HTTP response of a generation call: server-sent events, or one JSON body."""
    if isinstance(result, EventStream):
        return _sse(result)
    return Response(result.body, headers=result.headers)


def ignored_fields(request: Request[Any, Any, Any]) -> list[str]:
    """The unknown fields a request carried without effect (unknown_fields = "warn"; else always empty)."""
    return list(request.state.get(IGNORED_STATE) or [])


def _base_card(services: Services) -> ModelCard:
    engine = services.engine
    return ModelCard(
        id=engine.model_name,
        created=services.started,
        owned_by="loraplex",
        root=engine.model_name,
        max_model_len=engine.max_model_len,
    )


def _adapter_card(record: AdapterRecord, principal: Principal, engine_model: str, max_model_len: int) -> ModelCard:
    return ModelCard(
        id=adapter_id(principal.tenant_name, record.name),
        name=record.name,
        created=int(record.created.timestamp()),
        owned_by=principal.tenant_name,
        root=record.sha256,
        parent=engine_model,
        max_model_len=max_model_len,
    )


def _endpoint_card(endpoint: EndpointRecord, principal: Principal, engine_model: str, max_model_len: int) -> ModelCard:
    """An endpoint as a model: `root` is the adapter version it serves (`name@N`) or the base model."""
    return ModelCard(
        id=adapter_id(principal.tenant_name, endpoint.name),
        name=endpoint.name,
        created=int(datetime.fromisoformat(endpoint.created_at).timestamp()),
        owned_by=principal.tenant_name,
        root=endpoint.adapter or engine_model,
        parent=engine_model,
        max_model_len=max_model_len,
    )


async def _model_card(services: Services, principal: Principal, model: str) -> ModelCard:
    """The card of one of the caller's adapters or endpoints (short name or model id); 404 otherwise."""
    engine = services.engine
    target = await services.models.resolve(principal.tenant_id, principal.tenant_name, model)
    if target.endpoint is not None:
        return _endpoint_card(target.endpoint, principal, engine.model_name, engine.max_model_len)
    assert target.adapter is not None  # the base model is answered before
    return _adapter_card(target.adapter, principal, engine.model_name, engine.max_model_len)


def _streaming_operation(chunk: str) -> type[Operation]:
    """An Operation class that adds the `text/event-stream` alternative (stream: true) to the 200 response."""

    @dataclass
    class StreamingOperation(Operation):
        def __post_init__(self) -> None:
            ok = (self.responses or {}).get("200")
            if ok is not None and not isinstance(ok, Reference) and ok.content is not None:
                ok.content["text/event-stream"] = OpenAPIMediaType(
                    schema=Schema(
                        type=OpenAPIType.STRING,
                        description=f"with stream: true, server-sent events: each `data:` "
                        f"line holds one {chunk}; the stream ends with `data: [DONE]`",
                    )
                )

    return StreamingOperation


class OpenAIController(Controller):
    path = "/v1"
    tags = ["openai"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @get("/models", responses=error_responses(401, 429), summary="The base model and the caller's adapters")
    async def list_models(
        self, principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> ModelList:
        engine = services.engine
        cards = [_base_card(services)] + [
            _adapter_card(r, principal, engine.model_name, engine.max_model_len)
            for r in await services.adapters.list(principal)
        ]
        cards += [
            _endpoint_card(e, principal, engine.model_name, engine.max_model_len)
            for e in await services.endpoints.list(principal)
        ]
        return ModelList(data=cards)

    @get(
        "/models/{model:str}",
        responses=error_responses(400, 401, 404, 429),
        summary="One model (base or one of the caller's adapters)",
    )
    async def get_model(
        self, model: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> ModelCard:
        engine = services.engine
        if model == engine.model_name:
            return _base_card(services)
        return await _model_card(services, principal, model)

    @get(
        "/models/{tenant:str}/{name:str}",
        responses=error_responses(400, 401, 404, 429),
        summary="One of the caller's adapters or endpoints by its model id `<tenant>/<name>`",
    )
    async def get_qualified_model(
        self,
        tenant: FromPath[str],
        name: FromPath[str],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
    ) -> ModelCard:
        model = adapter_id(tenant, name)
        if model == services.engine.model_name:  # a base model served under an `org/name` name
            return _base_card(services)
        return await _model_card(services, principal, model)

    @post(
        "/completions",
        status_code=200,
        summary="Text completion",
        responses=OPENAI_ERRORS,
        opt={BODY_TYPE: CompletionRequest},
        operation_class=_streaming_operation(
            "`text_completion` object with the new text of one choice (the last one of a choice has its finish_reason)"
        ),
    )
    async def completions(
        self,
        data: JSONBody[CompletionRequest],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
        request: Request[Any, Any, Any],
    ) -> Response[Completion]:
        return _respond(
            await generate(data, principal, services, ignored_fields(request), sticky=sticky_key(data, request))
        )

    @post(
        "/chat/completions",
        status_code=200,
        summary="Chat completion",
        responses=OPENAI_ERRORS,
        opt={BODY_TYPE: ChatCompletionRequest},
        operation_class=_streaming_operation(
            "`chat.completion.chunk` object: {id, object, created, model, "
            "choices: [{index, delta: {role, content, tool_calls}, finish_reason, "
            "logprobs}], usage}"
        ),
    )
    async def chat_completions(
        self,
        data: JSONBody[ChatCompletionRequest],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
        request: Request[Any, Any, Any],
    ) -> Response[ChatCompletion]:
        return _respond(
            await generate(data, principal, services, ignored_fields(request), sticky=sticky_key(data, request))
        )
