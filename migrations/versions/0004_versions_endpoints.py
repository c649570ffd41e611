"""Adapter versions and endpoints: several live versions per adapter name (the one-live-version index goes),
a per-name pointer to the version the tenant marked current (no row: the newest), a per-tenant retention
(how many versions of a name are kept), and endpoints (a name serving an adapter version or the base model with
defaults, optionally a canary version by weight).

Existing adapters keep their rows, version numbers, blobs and keys: each live adapter is the only live version
of its name, so with no pointer row it stays what `name` resolves to.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

_LIVE = sa.text("deleted_at IS NULL")


def upgrade() -> None:
    op.drop_index("uq_adapters_live_name", table_name="adapters")
    op.add_column("tenants", sa.Column("adapter_versions_kept", sa.Integer(), nullable=True))
    op.create_table(
        "adapter_current",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_adapter_current_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "name", name=op.f("pk_adapter_current")),
    )
    op.create_table(
        "endpoints",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("adapter_name", sa.String(length=64), nullable=True),
        sa.Column("adapter_version", sa.Integer(), nullable=True),
        sa.Column("canary_version", sa.Integer(), nullable=True),
        sa.Column("canary_weight", sa.Float(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_endpoints_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoints")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_endpoints_tenant_id_name")),
    )
    op.create_index(op.f("ix_endpoints_tenant_id"), "endpoints", ["tenant_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_endpoints_tenant_id"), table_name="endpoints")
    op.drop_table("endpoints")
    op.drop_table("adapter_current")
    op.drop_column("tenants", "adapter_versions_kept")
    # Only one live version per name may stay: older live versions are marked deleted first.
    op.execute(
        "UPDATE adapters SET deleted_at = created_at WHERE deleted_at IS NULL AND version < "
        "(SELECT MAX(a2.version) FROM adapters a2 WHERE a2.tenant_id = adapters.tenant_id "
        "AND a2.name = adapters.name AND a2.deleted_at IS NULL)"
    )
    op.create_index(
        "uq_adapters_live_name",
        "adapters",
        ["tenant_id", "name"],
        unique=True,
        sqlite_where=_LIVE,
        postgresql_where=_LIVE,
    )
