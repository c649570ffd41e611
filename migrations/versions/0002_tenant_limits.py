"""Tenants' share of the engine and serving limits: weight, priority class, concurrent sequences, tokens per
minute, queued requests (all nullable: None is the server default from Settings).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

_COLUMNS = (
    ("weight", sa.Float()),
    ("priority", sa.BigInteger()),
    ("max_concurrent_sequences", sa.Integer()),
    ("tokens_per_minute", sa.BigInteger()),
    ("max_queued_requests", sa.Integer()),
)


def upgrade() -> None:
    for name, type_ in _COLUMNS:
        op.add_column("tenants", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35), never a batch table copy: with foreign keys on,
    # dropping the old `tenants` table during a copy would cascade-delete every key and adapter.
    for name, _ in reversed(_COLUMNS):
        op.drop_column("tenants", name)
