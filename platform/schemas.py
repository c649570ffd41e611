"""Request and response bodies of the tenant and adapter routes (msgspec; they drive the OpenAPI document)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

NonNegative = Annotated[int, Meta(ge=0)]
NonNegative32 = Annotated[int, Meta(ge=0, le=2**31 - 1)]  # an Integer column
NonNegative64 = Annotated[int, Meta(ge=0, le=2**63 - 1)]  # a BigInteger column


class TenantCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    max_adapters: NonNegative32 | None = None  # None: the server default
    max_adapter_bytes: NonNegative64 | None = None
    rate_limit_per_minute: NonNegative32 | None = None  # 0: unlimited


class TenantOut(Struct, kw_only=True):
    id: str
    name: str
    max_adapters: int | None
    max_adapter_bytes: int | None
    rate_limit_per_minute: int | None
    created_at: datetime


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
    model: str  # what clients put in the `model` field of OpenAI requests
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
