"""Request and response bodies of the adapter routes (msgspec; they drive the OpenAPI document)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct


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
    # "broken": serving it last failed on its stored files (`broken_reason` says how; upload it again)
    status: Literal["ready", "broken"] = "ready"
    broken_reason: str | None = None


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
