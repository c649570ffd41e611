"""How much one generation request asks for, the server's per-request caps, and the tenant's share of the
engine (weight, priority) it runs under. The tenant's own running limits are in platform/tenants/limits.py."""

from __future__ import annotations

from typing import Any

from loraplex.engine import Share
from loraplex.platform.errors import ApiError, bad_request
from loraplex.platform.generation.run import ChoiceInput
from loraplex.platform.openai.schemas import ChatCompletionRequest, CompletionRequest
from loraplex.platform.settings import Settings
from loraplex.platform.tenants.service import Principal


def prompt_count(prompt: Any) -> int:
    """How many prompts a /v1/completions `prompt` holds (without tokenizing; malformed ones count as one and
    are refused by the translation)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return len(prompt)
    return 1


def check_sequences(req: CompletionRequest | ChatCompletionRequest, settings: Settings) -> None:
    """400 for more sequences (prompts * n) than one request may ask for; checked before any tokenizing."""
    prompts = 1 if isinstance(req, ChatCompletionRequest) else prompt_count(req.prompt)
    sequences = prompts * req.n
    if sequences > settings.max_request_sequences:
        raise ApiError(
            400,
            f"this request asks for {sequences} sequences (prompts * n = {prompts} * {req.n}); "
            f"the limit is {settings.max_request_sequences} (max_request_sequences)",
            param="prompt" if prompts > 1 else "n",
            code="request_too_large",
        )


def requested_tokens(inputs: list[ChoiceInput]) -> int:
    """Prompt tokens + max_tokens (as resolved: the API's default when absent) over every sequence."""
    return sum(len(c.prompt_ids) + c.params.max_tokens for c in inputs)


def check_tokens(req: CompletionRequest | ChatCompletionRequest, inputs: list[ChoiceInput], settings: Settings) -> int:
    """The request's requested tokens; 400 when over the per-request cap."""
    tokens = requested_tokens(inputs)
    if tokens > settings.max_request_tokens:
        param = (
            "max_completion_tokens"
            if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None
            else "max_tokens"
        )
        raise ApiError(
            400,
            f"this request asks for {tokens} tokens (prompt tokens + {param} over its {len(inputs)} sequences); "
            f"the limit is {settings.max_request_tokens} (max_request_tokens)",
            param=param,
            code="request_too_large",
        )
    return tokens


def share_for(principal: Principal, settings: Settings, requested_priority: int | None) -> Share:
    """The engine share of a request: the tenant, its weight, and the request's priority, which defaults to the
    tenant's priority class and may not be more urgent (smaller) than it: a tenant cannot jump the others."""
    weight = settings.default_tenant_weight if principal.weight is None else principal.weight
    floor = settings.default_priority if principal.priority is None else principal.priority
    priority = floor if requested_priority is None else requested_priority
    if priority < floor:
        raise bad_request(
            f"priority {priority} is more urgent than this tenant's priority class {floor}; "
            f"send {floor} or a larger number",
            param="priority",
        )
    return Share(tenant=principal.tenant_id, weight=weight, priority=priority)
