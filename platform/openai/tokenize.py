"""vLLM's /tokenize and /detokenize: the tokenizer of the base model, which every adapter shares.

`model` is the base model or one of the caller's adapters (404 otherwise, as on the generation routes)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency, Provide
from litestar.params import JSONBody
from msgspec import Meta, Struct

from loraplex.platform.auth import provide_principal
from loraplex.platform.container import Services
from loraplex.platform.errors import bad_request, error_responses
from loraplex.platform.generation.service import resolve_adapter
from loraplex.platform.json_body import BODY_TYPE
from loraplex.platform.openai.controller import ignored_fields
from loraplex.platform.openai.schemas import REQUEST, ChatMessage, Int64
from loraplex.platform.openai.translate import chat_template_ids
from loraplex.platform.tenants.service import Principal
from loraplex.platform.unknown_fields import ignored_header


class TokenizeRequest(Struct, **REQUEST):
    """Exactly one of `prompt` (text) and `messages` (through the chat template)."""

    model: str
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages (vLLM's defaults)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class TokenizeResponse(Struct, kw_only=True, omit_defaults=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Struct, **REQUEST):
    model: str
    tokens: list[Int64]


class DetokenizeResponse(Struct, kw_only=True):
    prompt: str


def _tokenize(tokenizer: Any, data: TokenizeRequest) -> list[int]:
    if (data.prompt is None) == (data.messages is None):
        raise bad_request("send exactly one of prompt and messages", param="prompt" if data.prompt else "messages")
    if data.prompt is not None:
        add = True if data.add_special_tokens is None else data.add_special_tokens
        return list(tokenizer.encode(data.prompt, add_special_tokens=add))
    return chat_template_ids(
        tokenizer,
        data.messages or [],
        data.add_generation_prompt,
        data.continue_final_message,
        data.chat_template_kwargs,
        add_special_tokens=bool(data.add_special_tokens),
    )


class TokenizeController(Controller):
    path = "/"
    tags = ["tokenizer"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @post(
        "/tokenize",
        status_code=200,
        summary="Token ids of a prompt or of chat messages (vLLM's /tokenize)",
        responses=error_responses(400, 401, 404, 429),
        opt={BODY_TYPE: TokenizeRequest},
    )
    async def tokenize(
        self,
        data: JSONBody[TokenizeRequest],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
        request: Request[Any, Any, Any],
    ) -> Response[TokenizeResponse]:
        await resolve_adapter(services, principal, data.model)
        engine = services.engine
        ids = _tokenize(engine.tokenizer, data)
        strs = engine.tokenizer.convert_ids_to_tokens(ids) if data.return_token_strs else None
        body = TokenizeResponse(count=len(ids), max_model_len=engine.max_model_len, tokens=ids, token_strs=strs)
        return Response(body, headers=ignored_header(ignored_fields(request), "tokenize"))

    @post(
        "/detokenize",
        status_code=200,
        summary="The text of token ids (vLLM's /detokenize)",
        responses=error_responses(400, 401, 404, 429),
        opt={BODY_TYPE: DetokenizeRequest},
    )
    async def detokenize(
        self,
        data: JSONBody[DetokenizeRequest],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
        request: Request[Any, Any, Any],
    ) -> Response[DetokenizeResponse]:
        await resolve_adapter(services, principal, data.model)
        engine = services.engine
        vocab = engine.base_spec.vocab_size
        bad = next((t for t in data.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"token id {bad} is outside the vocabulary [0, {vocab})", param="tokens")
        text = engine.tokenizer.decode(data.tokens, skip_special_tokens=False)
        return Response(DetokenizeResponse(prompt=text), headers=ignored_header(ignored_fields(request), "detokenize"))
