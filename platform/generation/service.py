"""The generation orchestration both the OpenAI routes and the Batch API run: from a decoded request to
started engine requests (model resolution, an endpoint's defaults, translation, the tenant's admission,
shadow copies) and then to the answer, streamed or whole. The routes only turn the result into HTTP."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import anyio
import msgspec

from loraplex.engine import AdapterRef, RequestOutput, Share
from loraplex.platform.container import Services
from loraplex.platform.domain_errors import Failed, NotFound
from loraplex.platform.endpoints.defaults import apply_defaults
from loraplex.platform.endpoints.rollups import RollupKey
from loraplex.platform.endpoints.service import EndpointRecord
from loraplex.platform.generation.run import Generation
from loraplex.platform.metrics import EndpointLabels
from loraplex.platform.model_resolution import Target
from loraplex.platform.openai import limits, responses, tools, translate
from loraplex.platform.openai.schemas import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest
from loraplex.platform.tenants.limits import tenant_quota
from loraplex.platform.tenants.service import Principal
from loraplex.platform.unknown_fields import ignored_header

Request_ = CompletionRequest | ChatCompletionRequest
SCHEMA_HEADER = "x-loraplex-schema"  # "exact" or "narrowed", on every constrained response
NARROWING_HEADER = "x-loraplex-schema-narrowing"  # the narrowings applied, as a JSON list of strings
ENDPOINT_HEADER = "x-loraplex-endpoint"  # endpoint calls: `name@revision` of the endpoint that answered
SERVED_HEADER = "x-loraplex-served-by"  # endpoint calls: the adapter version that answered (`name@N` or base)
log = logging.getLogger("loraplex.platform")


@dataclass
class Answer:
    """A finished call: the whole response body and its headers."""

    body: Completion | ChatCompletion
    headers: dict[str, str]


@dataclass
class EventStream:
    """A streamed call: its server-sent events, its headers and the generation to close after the response."""

    events: AsyncGenerator[bytes, None]
    headers: dict[str, str]
    generation: Generation


async def resolve_adapter(services: Services, principal: Principal, model: str) -> AdapterRef | None:
    """None for the base model, the adapter's ref for one of the caller's adapters or endpoints, else 404
    (another tenant's is indistinguishable from a missing one)."""
    target = await services.models.resolve(principal.tenant_id, principal.tenant_name, model)
    if target.adapter is None:
        return None
    return await services.engine_adapters.ref(target.adapter, principal.tenant_name)


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


def _engine_failure(results: dict[int, list[RequestOutput]]) -> None:
    for outputs in results.values():
        if outputs and outputs[-1].finish_reason == "error":
            raise Failed(outputs[-1].error or "the engine failed this request", code="engine_error")


async def generate(
    data: CompletionRequest | ChatCompletionRequest,
    principal: Principal,
    services: Services,
    ignored: list[str] | None = None,
    *,
    background_priority: int | None = None,
    sticky: str | None = None,
) -> Answer | EventStream:
    """One generation call: refuse what we cannot honour, resolve the model, run every choice in the engine,
    then hand back the server-sent events or the whole body. The Batch API runs its lines here too, with
    `background_priority`: the least urgent priority class they run in."""
    arrival = time.perf_counter()
    translate.refuse_unsupported(data)
    limits.check_sequences(data, services.settings)
    share = limits.share_for(principal, services.settings, data.priority)
    if background_priority is not None and share.priority < background_priority:
        share = dataclasses.replace(share, priority=background_priority)
    target = await services.models.resolve(principal.tenant_id, principal.tenant_name, data.model, sticky)
    version = _version_labels(services, principal, target)
    tally = _rollup_tally(services, principal, target)
    try:
        gen, data, headers, echo = await start(data, principal, services, share, arrival, target, version, tally=tally)
    except Exception:  # refused or failed before generating (after that, Generation counts the outcome)
        if version is not None:
            services.metrics.endpoint_requests.labels(*version, "error").inc()
        if tally is not None:
            tally(error=True, latency_s=time.perf_counter() - arrival)
        raise
    if target.endpoint is not None and background_priority is None and services.shadow.drawn(target.endpoint.shadow):
        try:  # one cached lookup of the shadow version here; everything else runs in the copy's own task
            await submit_shadow(data, principal, services, share, target.endpoint)
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
            return EventStream(events, headers, gen)
    except BaseException:
        await gen.close()
        raise
    results = await gen.collect()
    _engine_failure(results)
    return Answer(responses.body(rid, created, data, results, services.token_texts, echo), headers)


async def submit_shadow(
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
            raise NotFound(f"shadow version {ref} no longer exists", code="adapter_not_found")
        try:
            gen, *_ = await start(
                copy, principal, services, background, time.perf_counter(), target, labels, admit=False
            )
        except Exception:
            services.metrics.endpoint_requests.labels(*labels, "error").inc()
            raise
        await gen.collect()  # outcomes, tokens and latency are counted by the generation

    services.shadow.submit(run, labels)


def _rollup_tally(services: Services, principal: Principal, target: Target) -> Callable[..., None] | None:
    """Endpoint calls (not shadow copies): where their outcome is tallied for the per-minute rollups."""
    if target.endpoint is None:
        return None
    version = target.adapter.version if target.adapter is not None else 0
    key = RollupKey(principal.tenant_id, target.endpoint.name, version)
    return functools.partial(services.rollups.record, key)


def _version_labels(services: Services, principal: Principal, target: Target) -> EndpointLabels | None:
    if target.endpoint is None:
        return None
    content = target.adapter.sha256 if target.adapter else "base"
    return services.metrics.endpoint_labels(
        principal.tenant_name, target.endpoint.name, target.endpoint.id, target.served, content
    )


async def start(
    data: Request_,
    principal: Principal,
    services: Services,
    share: Share,
    arrival: float,
    target: Target,
    version: EndpointLabels | None,
    *,
    admit: bool = True,
    tally: Callable[..., None] | None = None,
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
    if calls is not None and isinstance(data, ChatCompletionRequest):  # every call is held to its tool's schema
        tools.refuse_conflicts(data, calls, structured)
        spec = tools.tool_spec(calls, allow_narrowing, structured)
        structured = {"field": "tools"}  # compile errors name the tools (a JSON answer's schema is beside them)
    else:
        spec = translate.structured_spec(structured, allow_narrowing=allow_narrowing)
    reasoning = isinstance(data, ChatCompletionRequest) and engine.args.reasoning_parser is not None
    inputs = translate.choice_inputs(
        engine.tokenizer, engine.max_model_len, data, spec, engine.base_spec.vocab_size, reasoning
    )
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
            tally=tally,
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
