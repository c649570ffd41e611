"""Public ids of batch objects (`file-<hex>`, `batch_<hex>`, `batch_req_<hex>`) and their SQL uuids."""

from __future__ import annotations

import uuid

FILE, BATCH, LINE = "file-", "batch_", "batch_req_"


def public(prefix: str, value: uuid.UUID) -> str:
    return prefix + value.hex


def parse(prefix: str, value: str) -> uuid.UUID | None:
    """The uuid behind a public id; None for anything malformed (answered like a missing object)."""
    if not value.startswith(prefix) or len(value) != len(prefix) + 32:
        return None
    try:
        return uuid.UUID(hex=value[len(prefix) :])
    except ValueError:
        return None
