"""An endpoint's description: free text its tenant writes (shown, escaped, by the web console and the CLI).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("description", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("endpoints", "description")
