"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Completions and chat completions share one handler body (`_generate`): only the translation of the
request into engine inputs (`translate.choice_inputs`) and the shape of the response (`responses`) differ.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency, Provide
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, Reference, Schema
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from loraplex.engine import AdapterRef, RequestOutput, Share
from loraplex.platform.adapters.service import AdapterRecord
from loraplex.platform.auth import provide_principal
from loraplex.platform.container import Services
from loraplex.platform.endpoints.defaults import apply_defaults
from loraplex.platform.endpoints.service import EndpointRecord
from loraplex.platform.errors import ApiError, error_responses
from loraplex.platform.generation.run import Generation
from loraplex.platform.json_body import BODY_TYPE, IGNORED_STATE
from loraplex.platform.metrics import EndpointLabels
from loraplex.platform.model_ids import adapter_id
from loraplex.platform.model_resolution import STICKY_HEADER, Target
from loraplex.platform.openai import limits, responses, tools, translate
from loraplex.platform.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from loraplex.platform.tenants.limits import tenant_quota
from loraplex.platform.tenants.service import Principal
from loraplex.platform.unknown_fields import ignored_header

Request_ = CompletionRequest | ChatCompletionRequest
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SCHEMA_HEADER = "x-loraplex-schema"  # "exact" or "narrowed", on every constrained response
NARROWING_HEADER = "x-loraplex-schema-narrowing"  # the narrowings applied, as a JSON list of strings
ENDPOINT_HEADER = "x-loraplex-endpoint"  # endpoint calls: `name@revision` of the endpoint that answered
SERVED_HEADER = "x-loraplex-served-by"  # endpoint calls: the adapter version that answered (`name@N` or base)
log = logging.getLogger("loraplex.platform")
OPENAI_ERRORS = error_responses(400, 401, 404, 413, 429, 500)


async def resolve_adapter(services: Services, principal: Principal, model: str) -> AdapterRef | None:
    """None for the base model, the adapter's ref for one of the caller's adapters or endpoints, else 404
    (another tenant's is indistinguishable from a missing one)."""
    target = await services.models.resolve(principal.tenant_id, principal.tenant_name, model)
    if target.adapter is None:
        return None
    return await services.engine_adapters.ref(target.adapter, principal.tenant_name)


def sticky_key(data: CompletionRequest | ChatCompletionRequest, request: Request[Any, Any, Any]) -> str | None:
    """The end-user key that keeps a caller on one canary version: `user`, else the sticky-key header."""
    return data.user if data.user is not None else request.headers.get(STICKY_HEADER)


def _endpoint_headers(target: Target) -> dict[str, str]:
    """Which endpoint revision and which adapter version answered (endpoint calls only)."""
    if target.endpoint is None:
        return {}
    return {
        ENDPOINT_HEADER: f"{target.endpoint.name}@{target.endpoint.revision}",
        SERVED_HEADER: target.served,
    }


def _metric_model(adapter: AdapterRef | None, model: str) -> str:
    """The `model` label of request counts: the adapter's unique id, or the base model's name."""
    return adapter.name if adapter is not None and adapter.name else model


def _sse(events: AsyncGenerator[bytes, None], headers: dict[str, str], gen: Generation) -> Stream:
    # Closing the event generator after the response (also after a client disconnect, which cancels
    # the sending task while the generator may be suspended) aborts the engine requests at once;
    # closing `gen` as well covers a generator that never started (its `finally` would not run).
    async def finish() -> None:
        await events.aclose()
        await gen.close()

    return Stream(
        events,
        media_type="text/event-stream",
        headers={**SSE_HEADERS, **headers},
        background=BackgroundTask(finish),
    )


def _engine_failure(results: dict[int, list[RequestOutput]]) -> None:
    for outputs in results.values():
        if outputs and outputs[-1].finish_reason == "error":
            raise ApiError(500, outputs[-1].error or "the engine failed this request", code="engine_error")


def ignored_fields(request: Request[Any, Any, Any]) -> list[str]:
    """The unknown fields a request carried without effect (unknown_fields = "warn"; else always empty)."""
    return list(request.state.get(IGNORED_STATE) or [])


async def _generate(
    data: CompletionRequest | ChatCompletionRequest,
    principal: Principal,
    services: Services,
    ignored: list[str] | None = None,
    *,
    background_priority: int | None = None,
    sticky: str | None = None,
) -> Response[Any]:
    """The body of both generation routes: refuse what we cannot honour, resolve the model, run every choice
    in the engine, then stream server-sent events or answer with one JSON body. The Batch API runs its lines
    here too, with `background_priority`: the least urgent priority class they run in."""
    arrival = time.perf_counter()
    translate.refuse_unsupported(data)
    limits.check_sequences(data, services.settings)
    share = limits.share_for(principal, services.settings, data.priority)
    if background_priority is not None and share.priority < background_priority:
        share = dataclasses.replace(share, priority=background_priority)
    target = await services.models.resolve(principal.tenant_id, principal.tenant_name, data.model, sticky)
    version = _version_labels(services, principal, target)
    try:
        gen, data, headers, echo = await _start(data, principal, services, share, arrival, target, version)
    except Exception:  # refused or failed before generating (after that, Generation counts the outcome)
        if version is not None:
            services.metrics.endpoint_requests.labels(*version, "error").inc()
        raise
    if target.endpoint is not None and background_priority is None and services.shadow.drawn(target.endpoint.shadow):
        try:  # one cached lookup of the shadow version here; everything else runs in the copy's own task
            await _submit_shadow(data, principal, services, share, target.endpoint)
        except Exception as exc:  # a shadow never fails its caller
            log.warning("shadow copy of a call to endpoint %s not started: %s", target.endpoint.name, exc)
    try:
        chat = isinstance(data, ChatCompletionRequest)
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        headers = {
            **_constraint_headers(rid, gen.choices[0].first.narrowing),
            **ignored_header(ignored or [], rid),
            **headers,
        }
        if data.stream:
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            events = responses.stream(gen, rid, created, data, include_usage, services.token_texts, echo)
            return _sse(events, headers, gen)
    except BaseException:
        await gen.close()
        raise
    results = await gen.collect()
    _engine_failure(results)
    return Response(responses.body(rid, created, data, results, services.token_texts, echo), headers=headers)


async def _submit_shadow(
    data: Request_, principal: Principal, services: Services, share: Share, endpoint: EndpointRecord
) -> None:
    """Copy a started endpoint call (as served: defaults applied) to the endpoint's shadow version, in the
    background priority class, outside the tenant's admission (a copy never takes a caller's room). Its
    outcomes, tokens and latency count under role="shadow"; its answer is dropped."""
    shadow = endpoint.shadow
    assert shadow is not None and endpoint.adapter_name is not None
    ref = f"{endpoint.adapter_name}@{shadow.version}"
    record = await services.adapters.resolve(endpoint.tenant_id, ref)
    target = Target(record)
    content = record.sha256 if record is not None else "missing"
    labels = services.metrics.endpoint_labels(
        principal.tenant_name, endpoint.name, endpoint.id, ref, content, role="shadow"
    )
    copy = msgspec.structs.replace(data, stream=False, stream_options=None)
    background = dataclasses.replace(share, priority=max(share.priority, services.settings.batch_priority))

    async def run() -> None:
        if record is None:  # deleted since the endpoint named it
            services.metrics.endpoint_requests.labels(*labels, "error").inc()
            raise ApiError(404, f"shadow version {ref} no longer exists", code="adapter_not_found")
        try:
            gen, *_ = await _start(
                copy, principal, services, background, time.perf_counter(), target, labels, admit=False
            )
        except Exception:
            services.metrics.endpoint_requests.labels(*labels, "error").inc()
            raise
        await gen.collect()  # outcomes, tokens and latency are counted by the generation

    services.shadow.submit(run, labels)


def _version_labels(services: Services, principal: Principal, target: Target) -> EndpointLabels | None:
    if target.endpoint is None:
        return None
    content = target.adapter.sha256 if target.adapter else "base"
    return services.metrics.endpoint_labels(
        principal.tenant_name, target.endpoint.name, target.endpoint.id, target.served, content
    )


async def _start(
    data: Request_,
    principal: Principal,
    services: Services,
    share: Share,
    arrival: float,
    target: Target,
    version: EndpointLabels | None,
    *,
    admit: bool = True,
) -> tuple[Generation, Request_, dict[str, str], list[str] | None]:
    """From the resolved model to started engine requests: the endpoint's defaults, the translation, the
    tenant's admission (`admit`; shadow copies skip it). Returns the generation, the request as served, its
    endpoint headers and echo texts."""
    if target.endpoint is not None:
        data = apply_defaults(data, target.endpoint)
    adapter = None
    if target.adapter is not None:
        adapter = await services.engine_adapters.ref(target.adapter, principal.tenant_name)
    engine = services.engine
    structured = translate.structured_request(data, services.settings.max_json_depth)
    calls = tools.tool_mode(data) if isinstance(data, ChatCompletionRequest) else None
    allow_narrowing = data.schema_narrowing == "allow"
    if calls is not None:  # every call is held to its tool's parameters schema
        tools.refuse_conflicts(data, calls, structured)  # type: ignore[arg-type]
        spec = tools.tool_spec(calls, allow_narrowing, structured)
        structured = {"field": "tools"}  # compile errors name the tools (a JSON answer's schema is beside them)
    else:
        spec = translate.structured_spec(structured, allow_narrowing=allow_narrowing)
    inputs = translate.choice_inputs(engine.tokenizer, engine.max_model_len, data, spec, engine.base_spec.vocab_size)
    echo = translate.echo_texts(engine.tokenizer, data) if isinstance(data, CompletionRequest) else None
    tokens = limits.check_tokens(data, inputs, services.settings)
    lease = (
        await services.tenant_limits.admit(
            principal.tenant_id,
            principal.tenant_name,
            tenant_quota(principal, services.settings),
            len(inputs),
            tokens,
        )
        if admit
        else None
    )
    try:
        gen = await Generation.start(
            engine,
            inputs,
            adapter,
            salt=principal.tenant_id,
            metrics=services.metrics,
            labels=(principal.tenant_name, _metric_model(adapter, data.model)),
            arrival=arrival,
            structured_param=structured["field"] if structured else None,
            share=share,
            on_close=lease.release if lease else None,  # every way a generation ends goes through Generation.close
            endpoint=version,
            streaming=bool(data.stream) and admit,  # shadow copies (admit=False) are only collected
        )
    except BaseException:
        if lease is not None:
            with anyio.CancelScope(shield=True):
                await lease.release()
        raise
    if version is not None and gen.choices[0].first.narrowing is not None:
        schema = "narrowed" if gen.choices[0].first.narrowing else "exact"
        services.metrics.endpoint_constrained.labels(*version, schema).inc()
    return gen, data, _endpoint_headers(target), echo


def _constraint_headers(rid: str, narrowing: tuple[str, ...] | None) -> dict[str, str]:
    """Every constrained response says whether its schema was enforced exactly or narrowed (and how)."""
    if narrowing is None:
        return {}
    if not narrowing:
        return {SCHEMA_HEADER: "exact"}
    log.info("structured output of %s narrowed: %s", rid, "; ".join(narrowing))
    return {SCHEMA_HEADER: "narrowed", NARROWING_HEADER: json.dumps(list(narrowing), ensure_ascii=True)}


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
        return await _generate(data, principal, services, ignored_fields(request), sticky=sticky_key(data, request))

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
        return await _generate(data, principal, services, ignored_fields(request), sticky=sticky_key(data, request))


generate = _generate  # the Batch API's entry to the routes' code path (platform/batch/execute.py)
