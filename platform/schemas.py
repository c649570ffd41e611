"""Request and response bodies of the tenant and adapter routes (msgspec; they drive the OpenAPI document)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from loraplex.platform.openai.schemas import ResponseFormat

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


class AdapterOut(Struct, kw_only=True):
    id: str
    name: str
    model: str  # the globally unique model id `<tenant>/<name>` (the short name works too in `model`)
    version: int
    sha256: str  # content hash of the weights and config (the engine's identity of the adapter)
    rank: int
    alpha: float
    target_modules: list[str]
    size_bytes: int
    created_at: datetime


class AdapterList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[AdapterOut] = msgspec.field(default_factory=list)


class AdapterVersions(Struct, kw_only=True):
    """Every kept version of one adapter name; `current` is the one `name` alone resolves to."""

    object: Literal["list"] = "list"
    name: str
    current: int
    data: list[AdapterOut] = msgspec.field(default_factory=list)


class SetCurrent(Struct, kw_only=True, forbid_unknown_fields=True):
    """The version `name` alone means from now on (a rollback is one call); null: the newest, as by default."""

    version: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None


class ErrorDetail(Struct, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct, kw_only=True):
    """Every error, in OpenAI's format."""

    error: ErrorDetail


class Health(Struct, kw_only=True):
    status: str
    detail: dict[str, str] = msgspec.field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ endpoints

# The request fields an endpoint may let callers override (`overridable`); everything else it sets is fixed.
Overridable = Literal[
    "system_prompt",
    "response_format",
    "temperature",
    "top_p",
    "top_k",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "max_tokens",
]
Fraction = Annotated[float, Meta(gt=0.0, lt=1.0)]


class EndpointDefaults(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """What every call of the endpoint gets unless it may override it (null: the request's own or the
    server's default). `max_tokens` is a cap: a request may ask for fewer, more is a 400 unless overridable."""

    system_prompt: str | None = None
    response_format: ResponseFormat | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=2**63 - 1)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    stop: str | list[str] | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None


class Canary(Struct, kw_only=True, forbid_unknown_fields=True):
    """A second version of the endpoint's adapter, served to `weight` of the callers (sticky per `user` or the
    x-loraplex-sticky-key header)."""

    version: Positive32
    weight: Fraction


class Shadow(Struct, kw_only=True, forbid_unknown_fields=True):
    """Another version of the endpoint's adapter that gets a copy of `fraction` of the calls, to be compared in
    /metrics (role="shadow"); its answers are never returned and never delay or fail the caller's."""

    version: Positive32
    fraction: Annotated[float, Meta(gt=0.0, le=1.0)]


class EndpointCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    # `name@N`, or `name` (its current version now, pinned); null: the base model
    adapter: str | None = None
    canary: Canary | None = None
    shadow: Shadow | None = None
    defaults: EndpointDefaults = msgspec.field(default_factory=EndpointDefaults)
    overridable: list[Overridable] = msgspec.field(default_factory=list)
    pinned: bool = False  # keep its adapter versions in every replica's host tier (counted against a limit)


class EndpointUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields to change (absent: unchanged); every change is a new revision of the endpoint."""

    adapter: str | msgspec.UnsetType | None = msgspec.UNSET
    canary: Canary | msgspec.UnsetType | None = msgspec.UNSET
    shadow: Shadow | msgspec.UnsetType | None = msgspec.UNSET
    defaults: EndpointDefaults | msgspec.UnsetType = msgspec.UNSET
    overridable: list[Overridable] | msgspec.UnsetType = msgspec.UNSET
    pinned: bool | msgspec.UnsetType = msgspec.UNSET


class EndpointOut(Struct, kw_only=True):
    id: str
    name: str
    model: str  # what clients put in `model`
    revision: int  # grows with every change; responses carry it in x-loraplex-endpoint
    adapter: str | None  # `name@N`, or null for the base model
    canary: Canary | None
    shadow: Shadow | None
    defaults: EndpointDefaults
    overridable: list[str]
    pinned: bool
    created_at: datetime
    updated_at: datetime


class EndpointList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EndpointOut] = msgspec.field(default_factory=list)
