"""How requests name a LoRA adapter: by content hash, with where to load it from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdapterRef:
    content_hash: str  # sha256 of the adapter's config and weights (loraplex.adapters)
    path: str  # directory or archive the LoRA manager loads it from on demand
    name: str | None = None  # for logs and metrics only
