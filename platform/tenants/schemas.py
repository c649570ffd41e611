"""Request and response bodies of the tenant and key routes (msgspec; they drive the OpenAPI document)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

Weight = Annotated[float, Meta(gt=0, le=1e6)]  # a tenant's share of the engine under fair scheduling
Priority = Annotated[int, Meta(ge=-(2**31), le=2**31)]  # lower is served sooner (vLLM's convention)
NonNegative32 = Annotated[int, Meta(ge=0, le=2**31 - 1)]  # an Integer column
Positive32 = Annotated[int, Meta(ge=1, le=2**31 - 1)]
NonNegative64 = Annotated[int, Meta(ge=0, le=2**63 - 1)]  # a BigInteger column


class TenantCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    max_adapters: NonNegative32 | None = None  # None: the server default
    max_adapter_bytes: NonNegative64 | None = None
    rate_limit_per_minute: NonNegative32 | None = None  # 0: unlimited
    weight: Weight | None = None
    priority: Priority | None = None  # the default of the tenant's requests, and the most urgent they may ask
    max_concurrent_sequences: NonNegative32 | None = None  # 0: unlimited
    tokens_per_minute: NonNegative64 | None = None  # 0: unlimited
    max_queued_requests: NonNegative32 | None = None  # 0: unlimited
    adapter_versions_kept: Positive32 | None = None  # versions kept per adapter name (older ones are retired)


class TenantUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields to change (absent: unchanged; null: back to the server default)."""

    max_adapters: NonNegative32 | msgspec.UnsetType | None = msgspec.UNSET
    max_adapter_bytes: NonNegative64 | msgspec.UnsetType | None = msgspec.UNSET
    rate_limit_per_minute: NonNegative32 | msgspec.UnsetType | None = msgspec.UNSET
    weight: Weight | msgspec.UnsetType | None = msgspec.UNSET
    priority: Priority | msgspec.UnsetType | None = msgspec.UNSET
    max_concurrent_sequences: NonNegative32 | msgspec.UnsetType | None = msgspec.UNSET
    tokens_per_minute: NonNegative64 | msgspec.UnsetType | None = msgspec.UNSET
    max_queued_requests: NonNegative32 | msgspec.UnsetType | None = msgspec.UNSET
    adapter_versions_kept: Positive32 | msgspec.UnsetType | None = msgspec.UNSET


class TenantOut(Struct, kw_only=True):
    """A tenant; a limit that is null uses the server's default."""

    id: str
    name: str
    max_adapters: int | None
    max_adapter_bytes: int | None
    rate_limit_per_minute: int | None
    created_at: datetime
    weight: float | None = None
    priority: int | None = None
    max_concurrent_sequences: int | None = None
    tokens_per_minute: int | None = None
    max_queued_requests: int | None = None
    adapter_versions_kept: int | None = None


class TenantUsage(Struct, kw_only=True):
    """What a tenant holds now against its serving limits (over all replicas, or this one while Redis is down),
    and the limits in force (its own, else the server's defaults; 0: unlimited)."""

    queued_requests: int
    sequences: int
    tokens_this_minute: int
    max_queued_requests: int
    max_concurrent_sequences: int
    tokens_per_minute: int


class ApiKeyOut(Struct, kw_only=True):
    id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None = None


class NewApiKey(Struct, kw_only=True):
    """A freshly created key: `key` is shown only in this response and never stored."""

    id: str
    prefix: str
    key: str
    created_at: datetime


class TenantCreated(Struct, kw_only=True):
    tenant: TenantOut
    api_key: NewApiKey


class ApiKeyList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ApiKeyOut] = msgspec.field(default_factory=list)


class TenantList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[TenantOut] = msgspec.field(default_factory=list)
