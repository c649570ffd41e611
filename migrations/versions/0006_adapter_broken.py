"""Broken adapter versions: `adapters.broken_reason` (null), why serving a version last failed on its stored files
(missing from the blob store, or failing verification), shown to its tenant. Existing versions are not broken.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("adapters", sa.Column("broken_reason", sa.String(300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("adapters") as batch:
        batch.drop_column("broken_reason")
