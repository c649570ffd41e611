"""Request and response bodies of the endpoint routes (msgspec; they drive the OpenAPI document)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from loraplex.platform.openai.schemas import ResponseFormat
from loraplex.platform.tenants.schemas import Positive32

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
Description = Annotated[str, Meta(max_length=1000)]  # the tenant's own words, shown as text (never as markup)


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
    description: Description | None = None


class EndpointUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields to change (absent: unchanged); every change is a new revision of the endpoint."""

    adapter: str | msgspec.UnsetType | None = msgspec.UNSET
    canary: Canary | msgspec.UnsetType | None = msgspec.UNSET
    shadow: Shadow | msgspec.UnsetType | None = msgspec.UNSET
    defaults: EndpointDefaults | msgspec.UnsetType = msgspec.UNSET
    overridable: list[Overridable] | msgspec.UnsetType = msgspec.UNSET
    pinned: bool | msgspec.UnsetType = msgspec.UNSET
    description: Description | msgspec.UnsetType | None = msgspec.UNSET


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
    description: str | None
    created_at: datetime
    updated_at: datetime


class EndpointList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EndpointOut] = msgspec.field(default_factory=list)


class MetricsPoint(Struct, kw_only=True):
    """One minute of one version's calls (minutes without calls are left out)."""

    minute: datetime  # the minute's start (UTC)
    requests: int
    errors: int  # refused or failed calls
    latency_ms_avg: float
    latency_ms_max: float
    prompt_tokens: int
    completion_tokens: int


class VersionSeries(Struct, kw_only=True):
    adapter_version: int  # 0: the base model
    points: list[MetricsPoint]


class EndpointMetrics(Struct, kw_only=True):
    """Per-minute traffic of an endpoint by the adapter version that answered (the console's plots)."""

    object: Literal["endpoint.metrics"] = "endpoint.metrics"
    endpoint: str
    minutes: int
    start: datetime  # the first minute covered
    series: list[VersionSeries] = msgspec.field(default_factory=list)
