"""Request and response bodies of the adapter routes (msgspec; they drive the OpenAPI document)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

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
    # how this version came: {"kind": "upload"}, an import's source, or a merge's method and sources
    origin: dict[str, Any] | None = None
    # the check at publish: {passed, max_logit_diff, tokens_equal, tokens, reference_tokens, prompt, seconds,
    # tolerance[, accepted_with_warning]}, or {"skipped": why}; null for versions published without it
    publish_check: dict[str, Any] | None = None


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


class MergeSourceIn(Struct, kw_only=True, forbid_unknown_fields=True):
    model: Annotated[str, Meta(min_length=1, max_length=200)]  # `name` (its current version) or `name@N`
    weight: float = 1.0


class MergeIn(Struct, kw_only=True, forbid_unknown_fields=True):
    """A merge of the caller's adapters into a new version of the adapter named in the path (peft's
    add_weighted_adapter combinations; see loraplex.adapters.merge)."""

    sources: Annotated[list[MergeSourceIn], Meta(min_length=2, max_length=16)]
    method: str
    density: float | None = None  # ties, dare_linear, dare_ties, magnitude_prune: the fraction kept, in (0, 1]
    svd_rank: Annotated[int, Meta(ge=1, le=4096)] | None = None  # svd: the merged rank (default: the largest)
    majority_sign_method: Literal["total", "frequency"] = "total"  # ties, dare_ties
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None  # dare_*: drawn and recorded when not given
    accept_failed_check: bool = False  # store the version even if the check at publish fails (with a warning)
