"""Adapters as tenants bring them (issue 40): where each version came from and what its publish check found, the
imports by reference (`adapter_imports`, the status resource), and the tenants' stored source credentials
(`source_credentials`, encrypted at rest; never echoed). Existing versions keep null `origin`/`publish_check`
(uploaded before either was recorded).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def _ts(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.add_column("adapters", sa.Column("origin", sa.JSON(), nullable=True))
    op.add_column("adapters", sa.Column("publish_check", sa.JSON(), nullable=True))
    op.create_table(
        "adapter_imports",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=2048), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("bytes_done", sa.BigInteger(), nullable=False),
        sa.Column("bytes_total", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("resolved", sa.String(length=256), nullable=True),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        _ts("lease_until"),
        _ts("created_at", False),
        _ts("updated_at", False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_adapter_imports_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapter_imports")),
    )
    op.create_index(op.f("ix_adapter_imports_tenant_id"), "adapter_imports", ["tenant_id"])
    op.create_index(op.f("ix_adapter_imports_status"), "adapter_imports", ["status"])
    op.create_table(
        "source_credentials",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        _ts("created_at", False),
        _ts("updated_at", False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_source_credentials_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_source_credentials")),
        sa.UniqueConstraint("tenant_id", "kind", name=op.f("uq_source_credentials_tenant_id_kind")),
    )


def downgrade() -> None:
    op.drop_table("source_credentials")
    op.drop_index(op.f("ix_adapter_imports_status"), table_name="adapter_imports")
    op.drop_index(op.f("ix_adapter_imports_tenant_id"), table_name="adapter_imports")
    op.drop_table("adapter_imports")
    with op.batch_alter_table("adapters") as batch:
        batch.drop_column("publish_check")
        batch.drop_column("origin")
