"""Two columns of adapter_imports: accept_failed_check, the tenant's flag that stores the version even if the check
at publish fails (with a warning), as an upload's form field and a merge's body field do; and source_sealed, an
https source with a query (a presigned URL's signature) encrypted at rest, `source` keeping it without the query.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "adapter_imports",
        sa.Column("accept_failed_check", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("adapter_imports", sa.Column("source_sealed", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("adapter_imports", "source_sealed")
    op.drop_column("adapter_imports", "accept_failed_check")
