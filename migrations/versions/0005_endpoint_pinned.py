"""Pinned endpoints: `endpoints.pinned` (default false), so an endpoint can keep its adapter versions in every
replica's host tier. Existing endpoints keep every field and are not pinned.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("pinned")
