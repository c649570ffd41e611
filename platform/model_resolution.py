"""What a request's `model` names, decided in this one place: the base model, one of the caller's endpoints
(with the adapter version its canary split picks for this caller), an adapter version (`name@N`) or an adapter
name (its current version), each by its short name or its model id `<tenant>/<name>`. Anything else, another
tenant's included, is the same 404."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from loraplex.platform.adapters.service import AdapterRecord, AdapterService
from loraplex.platform.domain_errors import NotFound
from loraplex.platform.endpoints.service import EndpointRecord, EndpointService
from loraplex.platform.model_ids import short_name

STICKY_HEADER = "x-loraplex-sticky-key"  # the caller's end-user key for canary stickiness (beside `user`)


@dataclass(frozen=True)
class Target:
    """What serves one request: an adapter version (None: the base model), through an endpoint or not."""

    adapter: AdapterRecord | None
    endpoint: EndpointRecord | None = None
    canary: bool = False  # the endpoint's canary version was picked

    @property
    def served(self) -> str:
        """`name@N` of the adapter version that answers, or "base"."""
        return f"{self.adapter.name}@{self.adapter.version}" if self.adapter else "base"


def model_not_found(model: str) -> NotFound:
    return NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")


def canary_share(endpoint_id: str, sticky_key: str) -> float:
    """Where a caller's key falls in [0, 1): the same key always lands in the same place for one endpoint (and
    independently for different endpoints), so one end-user stays on one version while the weight holds."""
    digest = hashlib.sha256(f"{endpoint_id}\x00{sticky_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class ModelResolver:
    def __init__(self, base_model_name: str, adapters: AdapterService, endpoints: EndpointService) -> None:
        self.base_model_name = base_model_name
        self.adapters = adapters
        self.endpoints = endpoints

    async def resolve(self, tenant_id: str, tenant_name: str, model: str, sticky_key: str | None = None) -> Target:
        if model == self.base_model_name:
            return Target(None)
        name = short_name(model, tenant_name)
        if name is None:  # another tenant's model id
            raise model_not_found(model)
        endpoint = await self.endpoints.resolve(tenant_id, name)
        if endpoint is not None:
            return await self._endpoint_target(endpoint, sticky_key)
        record = await self.adapters.resolve(tenant_id, name)
        if record is None:
            raise model_not_found(model)
        return Target(record)

    async def _endpoint_target(self, endpoint: EndpointRecord, sticky_key: str | None) -> Target:
        if endpoint.adapter_name is None:
            return Target(None, endpoint)
        canary = endpoint.canary
        share = canary_share(endpoint.id, sticky_key) if sticky_key is not None else random.random()
        picked = canary is not None and share < canary.weight
        version = canary.version if picked and canary is not None else endpoint.adapter_version
        record = await self.adapters.resolve(endpoint.tenant_id, f"{endpoint.adapter_name}@{version}")
        if record is None:  # deleted versions are refused while an endpoint serves them; a race is a 404
            raise model_not_found(endpoint.name)
        return Target(record, endpoint, picked)
