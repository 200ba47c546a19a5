"""Checkpoint retention: the removals retention decided, kept as intent and tombstone.

Revision ID: 0010_retention
Revises: 0009_serving
Create Date: 2026-12-02

A row is written in the same transaction that deletes the checkpoint's row; ``removed_at`` is
set once its directory is gone. A restarted control plane finishes the rows without it, and a
re-sent runtime report of a removed checkpoint is recognised and not stored again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_retention"
down_revision: str | Sequence[str] | None = "0009_serving"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_removals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("delete_files", sa.Boolean(), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name="fk_checkpoint_removals_job_id_jobs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoint_removals"),
        sa.UniqueConstraint(
            "job_id", "step", "path", name="uq_checkpoint_removals_job_id_step_path"
        ),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_removals")
