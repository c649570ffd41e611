"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from litestar import Controller, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency, Provide
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, Reference, Schema
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from loraplex.engine import AdapterRef
from loraplex.platform.auth import provide_principal
from loraplex.platform.errors import ApiError, error_responses
from loraplex.platform.openai_schemas import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, \
    ModelCard, ModelList
from loraplex.platform.services import openai_requests as reqs
from loraplex.platform.services import openai_responses as resp
from loraplex.platform.services.container import Services
from loraplex.platform.services.generation import ChoiceInput, Generation
from loraplex.platform.services.tenants import Principal

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
OPENAI_ERRORS = error_responses(400, 401, 404, 413, 429, 500)


def _model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


async def resolve_adapter(services: Services, principal: Principal, model: str) -> AdapterRef | None:
    """None for the base model, the adapter's ref for one of the caller's adapters, else 404
    (another tenant's adapter is indistinguishable from a missing one)."""
    if model == services.engine.model_name:
        return None
    record = await services.adapters.resolve(principal.tenant_id, model)
    if record is None:
        raise _model_not_found(model)
    return services.engine_adapters.ref(record)


def _sse(events: AsyncGenerator[bytes, None]) -> Stream:
    # Closing the event generator after the response (also after a client disconnect, which cancels
    # the sending task while the generator may be suspended) aborts the engine requests at once.
    return Stream(events, media_type="text/event-stream", headers=SSE_HEADERS,
                  background=BackgroundTask(events.aclose))


def _engine_failure(results: dict[int, list[Any]]) -> None:
    for outputs in results.values():
        if outputs and outputs[-1].finish_reason == "error":
            raise ApiError(500, outputs[-1].error or "the engine failed this request", code="engine_error")


def _streaming_operation(chunk: str) -> type[Operation]:
    """An Operation class that adds the `text/event-stream` alternative (stream: true) to the 200 response."""

    @dataclass
    class StreamingOperation(Operation):
        def __post_init__(self) -> None:
            ok = (self.responses or {}).get("200")
            if ok is not None and not isinstance(ok, Reference) and ok.content is not None:
                ok.content["text/event-stream"] = OpenAPIMediaType(schema=Schema(
                    type=OpenAPIType.STRING, description=f"with stream: true, server-sent events: each `data:` "
                    f"line holds one {chunk}; the stream ends with `data: [DONE]`"))

    return StreamingOperation


class OpenAIController(Controller):
    path = "/v1"
    tags = ["openai"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @get("/models", responses=error_responses(401, 429), summary="The base model and the caller's adapters")
    async def list_models(self, principal: NamedDependency[Principal],
                          services: NamedDependency[Services]) -> ModelList:
        engine = services.engine
        base = ModelCard(id=engine.model_name, created=services.started, owned_by="loraplex",
                         root=engine.model_name, max_model_len=engine.max_model_len)
        cards = [base] + [ModelCard(id=r.name, created=int(r.created.timestamp()), owned_by=principal.tenant_name,
                                    root=r.sha256, parent=engine.model_name, max_model_len=engine.max_model_len)
                          for r in await services.adapters.list(principal)]
        return ModelList(data=cards)

    @get("/models/{model:str}", responses=error_responses(400, 401, 404, 429),
         summary="One model (base or one of the caller's adapters)")
    async def get_model(self, model: FromPath[str], principal: NamedDependency[Principal],
                        services: NamedDependency[Services]) -> ModelCard:
        engine = services.engine
        if model == engine.model_name:
            return ModelCard(id=model, created=services.started, owned_by="loraplex", root=model,
                             max_model_len=engine.max_model_len)
        record = await services.adapters.resolve(principal.tenant_id, model)
        if record is None:
            raise _model_not_found(model)
        return ModelCard(id=record.name, created=int(record.created.timestamp()), owned_by=principal.tenant_name,
                         root=record.sha256, parent=engine.model_name, max_model_len=engine.max_model_len)

    @post("/completions", status_code=200, summary="Text completion", responses=OPENAI_ERRORS,
          operation_class=_streaming_operation("`text_completion` object with the new text of one choice "
                                               "(the last one of a choice has its finish_reason)"))
    async def completions(self, data: JSONBody[CompletionRequest], principal: NamedDependency[Principal],
                          services: NamedDependency[Services]) -> Response[Completion]:
        arrival = time.perf_counter()
        reqs.refuse_unsupported(data)
        adapter = await resolve_adapter(services, principal, data.model)
        engine = services.engine
        prompts = reqs.completion_prompts(engine.tokenizer, data.prompt)
        structured = reqs.structured_request(data)
        spec = reqs.structured_spec(structured)
        inputs: list[ChoiceInput] = []
        for p, ids in enumerate(prompts):
            max_tokens = reqs.resolve_max_tokens(len(ids), data.max_tokens, reqs.COMPLETIONS_DEFAULT_MAX_TOKENS,
                                                 engine.max_model_len, "max_tokens")
            for i, params in enumerate(reqs.sampling_params(data, max_tokens, data.logprobs, spec)):
                inputs.append(ChoiceInput(p * data.n + i, ids, params))
        gen = await Generation.start(engine, inputs, adapter, salt=principal.tenant_id, metrics=services.metrics,
                                     labels=(principal.tenant_name, data.model), arrival=arrival,
                                     structured_param=structured["field"] if structured else None)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        want_logprobs = data.logprobs is not None
        if data.stream:
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            return _sse(resp.completion_stream(gen, rid, created, data.model, data.n, want_logprobs, include_usage,
                                                  services.token_texts))
        results = await gen.collect()
        _engine_failure(results)
        return Response(resp.completion(rid, created, data.model, results, data.n, want_logprobs,
                                        services.token_texts))

    @post("/chat/completions", status_code=200, summary="Chat completion", responses=OPENAI_ERRORS,
          operation_class=_streaming_operation("`chat.completion.chunk` object: {id, object, created, model, "
                                               "choices: [{index, delta: {role, content}, finish_reason, "
                                               "logprobs}], usage}"))
    async def chat_completions(self, data: JSONBody[ChatCompletionRequest], principal: NamedDependency[Principal],
                               services: NamedDependency[Services]) -> Response[ChatCompletion]:
        arrival = time.perf_counter()
        reqs.refuse_unsupported(data)
        adapter = await resolve_adapter(services, principal, data.model)
        engine = services.engine
        prompt_ids = reqs.chat_prompt(engine.tokenizer, data)
        requested, param = ((data.max_completion_tokens, "max_completion_tokens")
                            if data.max_completion_tokens is not None else (data.max_tokens, "max_tokens"))
        max_tokens = reqs.resolve_max_tokens(len(prompt_ids), requested, None, engine.max_model_len, param)
        structured = reqs.structured_request(data)
        spec = reqs.structured_spec(structured)
        logprobs = (data.top_logprobs or 0) if data.logprobs else None
        inputs = [ChoiceInput(i, prompt_ids, p)
                  for i, p in enumerate(reqs.sampling_params(data, max_tokens, logprobs, spec))]
        gen = await Generation.start(engine, inputs, adapter, salt=principal.tenant_id, metrics=services.metrics,
                                     labels=(principal.tenant_name, data.model), arrival=arrival,
                                     structured_param=structured["field"] if structured else None)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if data.stream:
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            return _sse(resp.chat_stream(gen, rid, created, data.model, data.logprobs, include_usage,
                                            services.token_texts))
        results = await gen.collect()
        _engine_failure(results)
        return Response(resp.chat_completion(rid, created, data.model, results, data.logprobs,
                                             services.token_texts))
