"""The adapter content hash: identical for identical computations, whatever the packaging."""

from __future__ import annotations

import hashlib
import json
from typing import Any

HASH_FORMAT = "loraplex-lora/1"


class ContentHasher:
    """sha256 over a canonical config document, then every tensor in name order.

    The config document holds the resolved per-module rank / alpha / scaling (not the raw JSON), so
    two configs that spell the same adapter differently (a regex vs. a list of names, key order,
    peft_version, base_model_name_or_path) hash the same. Each tensor contributes its canonical name
    (``layers.3.q_proj.lora_A``), safetensors dtype tag, shape, byte count and raw little-endian bytes.
    """

    def __init__(self, config_doc: dict[str, Any]) -> None:
        self._sha = hashlib.sha256()
        self._update_json({"format": HASH_FORMAT, "config": config_doc})
        self._last_name: str | None = None

    def _update_json(self, value: Any) -> None:
        self._sha.update(json.dumps(value, sort_keys=True, separators=(",", ":")).encode() + b"\n")

    def add_tensor(self, name: str, dtype: str, shape: tuple[int, ...], data: bytes | memoryview) -> None:
        """Add one tensor; names must come in strictly increasing order."""
        if self._last_name is not None and name <= self._last_name:
            raise ValueError("tensors must be hashed in increasing name order")
        self._last_name = name
        self._update_json([name, dtype, list(shape), len(data)])
        self._sha.update(data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()
