"""Tenants' credentials for import sources, encrypted at rest with Fernet (AES-128-CBC + HMAC-SHA256) under the
server's key: `import_credentials_key` (every replica the same), else a key file made once in the data directory
(mode 0600; one machine). They are decrypted only to sign or send one import's requests and never returned."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import delete, select

from loraplex.platform.db.models import SourceCredential, utcnow
from loraplex.platform.db.session import Database
from loraplex.platform.domain_errors import Failed, Invalid, NotFound

# Per kind: the fields a tenant sets (required ones first) and which are optional.
FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "s3": (("access_key_id", "secret_access_key"), ("session_token", "region")),
    "hf": (("token",), ()),
}


def server_key(configured: str | None, data_dir: Path) -> bytes:
    """The Fernet key: the setting, else `<data_dir>/import-credentials.key` (created 0600 when missing)."""
    if configured:
        key = configured.encode()
    else:
        path = data_dir / "import-credentials.key"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            key = path.read_bytes().strip()
        else:
            key = Fernet.generate_key()
            with os.fdopen(fd, "wb") as f:
                f.write(key)
    try:
        Fernet(key)
    except ValueError:
        raise ValueError("import_credentials_key must be a Fernet key (32 url-safe base64-encoded bytes)") from None
    return key


def check_fields(kind: str, values: dict[str, object]) -> dict[str, str]:
    """The credential's fields as strings, or a 400 naming the missing or unknown one (values never echoed)."""
    check_kind(kind)
    required, optional = FIELDS[kind]
    for name in required:
        if not isinstance(values.get(name), str) or not values[name]:
            raise Invalid(f"{kind} credentials need the string field {name!r}", param=name)
    for name, value in values.items():
        if name not in required + optional:
            raise Invalid(f"{kind} credentials have no field {name!r}", param=name, code="unknown_field")
        if value is not None and (not isinstance(value, str) or len(value) > 4096):
            raise Invalid(f"{name!r} must be a string of at most 4096 characters", param=name)
    return {k: v for k, v in values.items() if isinstance(v, str) and v}


class CredentialStore:
    def __init__(self, db: Database, key: bytes) -> None:
        self.db = db
        self.fernet = Fernet(key)

    async def put(self, tenant_id: str, kind: str, values: dict[str, object]) -> None:
        fields = check_fields(kind, values)
        ciphertext = self.fernet.encrypt(json.dumps(fields).encode()).decode()
        tid = uuid.UUID(tenant_id)
        async with self.db.session() as session:
            row = await session.scalar(
                select(SourceCredential).where(SourceCredential.tenant_id == tid, SourceCredential.kind == kind)
            )
            if row is None:
                session.add(SourceCredential(id=uuid.uuid4(), tenant_id=tid, kind=kind, ciphertext=ciphertext))
            else:
                row.ciphertext, row.updated_at = ciphertext, utcnow()
            await session.commit()

    async def delete(self, tenant_id: str, kind: str) -> bool:
        check_kind(kind)
        async with self.db.session() as session:
            result = await session.execute(
                delete(SourceCredential).where(
                    SourceCredential.tenant_id == uuid.UUID(tenant_id), SourceCredential.kind == kind
                )
            )
            await session.commit()
        return bool(result.rowcount)  # type: ignore[attr-defined]  # (a DELETE's CursorResult)

    def seal(self, text: str) -> str:
        """Ciphertext of a secret that is not a credential kind (an https source's query: a presigned signature)."""
        return self.fernet.encrypt(text.encode()).decode()

    def unseal(self, token: str) -> str:
        try:
            return self.fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise Failed(
                "the import's stored source cannot be decrypted with this server's key (import_credentials_key "
                "differs between replicas?)",
                code="credentials_unreadable",
            ) from None

    async def kinds(self, tenant_id: str) -> list[str]:
        async with self.db.session() as session:
            rows = await session.scalars(
                select(SourceCredential.kind).where(SourceCredential.tenant_id == uuid.UUID(tenant_id))
            )
            return sorted(rows.all())

    async def get(self, tenant_id: str, kind: str) -> dict[str, str] | None:
        """The decrypted credential (for one import's requests), or None when the tenant set none."""
        async with self.db.session() as session:
            row = await session.scalar(
                select(SourceCredential).where(
                    SourceCredential.tenant_id == uuid.UUID(tenant_id), SourceCredential.kind == kind
                )
            )
        if row is None:
            return None
        try:
            return dict(json.loads(self.fernet.decrypt(row.ciphertext.encode())))
        except InvalidToken:
            raise Failed(
                f"the stored {kind} credentials cannot be decrypted with this server's key: set them again",
                code="credentials_unreadable",
            ) from None


def check_kind(kind: str) -> None:
    if kind not in FIELDS:
        raise NotFound(f"no credential kind {kind!r}: use one of {', '.join(FIELDS)}", code="not_found")
