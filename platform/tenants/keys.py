"""API key format and hashing. A key is `lpx-<prefix>.<secret>`: the prefix is a public lookup id
stored in clear, the database keeps only sha256(key). Keys carry 256 random bits, so a fast hash
is enough (there is nothing to brute-force)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

KEY_PREFIX = "lpx-"


@dataclass(frozen=True)
class NewKey:
    prefix: str
    secret_key: str  # the full key, shown to the caller once
    key_hash: str


def generate_key() -> NewKey:
    prefix = secrets.token_hex(8)
    key = f"{KEY_PREFIX}{prefix}.{secrets.token_urlsafe(32)}"
    return NewKey(prefix, key, hash_key(key))


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def split_key(key: str) -> str | None:
    """The lookup prefix of a well-formed key, else None."""
    if not key.startswith(KEY_PREFIX) or "." not in key:
        return None
    prefix = key[len(KEY_PREFIX) :].split(".", 1)[0]
    return prefix if 0 < len(prefix) <= 32 else None


def matches(key: str, key_hash: str) -> bool:
    return hmac.compare_digest(hash_key(key), key_hash)
