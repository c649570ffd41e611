"""Per-minute traffic rollups per endpoint and adapter version (the web console's plots without Prometheus):
requests, errors, latency sum and maximum, tokens. Rows older than the retention are deleted by the server.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "endpoint_rollups",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("adapter_version", sa.Integer(), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("latency_ms_sum", sa.Float(), nullable=False),
        sa.Column("latency_ms_max", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_endpoint_rollups_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "endpoint", "adapter_version", "minute", name=op.f("pk_endpoint_rollups")),
    )
    op.create_index(op.f("ix_endpoint_rollups_minute"), "endpoint_rollups", ["minute"])


def downgrade() -> None:
    op.drop_index(op.f("ix_endpoint_rollups_minute"), table_name="endpoint_rollups")
    op.drop_table("endpoint_rollups")
