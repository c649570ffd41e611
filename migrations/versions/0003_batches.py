"""The Batch API: tenants' batch files, batch jobs, and one row per request line (its result once run).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def _ts(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "batch_files",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("blob", sa.String(length=64), nullable=False),
        _ts("created_at", False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_batch_files_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batch_files")),
    )
    op.create_index(op.f("ix_batch_files_tenant_id"), "batch_files", ["tenant_id"])
    op.create_table(
        "batches",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("input_file_id", sa.Uuid(), nullable=False),
        sa.Column("completion_window", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("output_file_id", sa.Uuid(), nullable=True),
        sa.Column("error_file_id", sa.Uuid(), nullable=True),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        _ts("lease_until"),
        _ts("created_at", False),
        _ts("in_progress_at"),
        _ts("expires_at", False),
        _ts("finalizing_at"),
        _ts("completed_at"),
        _ts("failed_at"),
        _ts("expired_at"),
        _ts("cancelling_at"),
        _ts("cancelled_at"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_batches_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
    )
    op.create_index(op.f("ix_batches_tenant_id"), "batches", ["tenant_id"])
    op.create_index(op.f("ix_batches_status"), "batches", ["status"])
    op.create_table(
        "batch_lines",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("line_no", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(length=512), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        _ts("lease_until"),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("response", sa.JSON(), nullable=True),
        _ts("finished_at"),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name=op.f("fk_batch_lines_batch_id_batches"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batch_lines")),
        sa.UniqueConstraint("batch_id", "line_no", name=op.f("uq_batch_lines_batch_id_line_no")),
    )
    op.create_index("ix_batch_lines_pending", "batch_lines", ["batch_id", "status_code", "line_no"])


def downgrade() -> None:
    op.drop_index("ix_batch_lines_pending", table_name="batch_lines")
    op.drop_table("batch_lines")
    op.drop_index(op.f("ix_batches_status"), table_name="batches")
    op.drop_index(op.f("ix_batches_tenant_id"), table_name="batches")
    op.drop_table("batches")
    op.drop_index(op.f("ix_batch_files_tenant_id"), table_name="batch_files")
    op.drop_table("batch_files")
