"""Crash safety, time accounting, change tracking, leader lease, persisted scheduler state.

Revision ID: 0003_reliability
Revises: 0002_identity
Create Date: 2026-12-02

- attempts.attempt_key: recorded with the intent, before the executor launches anything, so a
  launch can be repeated idempotently and leftovers found by key.
- attempts.running_at: when this attempt's workers were confirmed running (per-attempt time).
- jobs.run_time_s: cumulative run time of the job's finished attempts (max_runtime, fair share).
- jobs.changed_at (indexed): bumped by every write to the row; the control loop reads only
  rows that changed since its last look.
- leases: one row per lease (the controller leader), held until expires_at.
- scheduler_state: JSON blobs the scheduler keeps across restarts (usage history, estimator).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_reliability"
down_revision: str | Sequence[str] | None = "0002_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("attempt_key", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("running_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("run_time_s", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE jobs SET changed_at = updated_at")
    op.create_index("ix_jobs_changed_at", "jobs", ["changed_at"])
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leases"),
    )
    op.create_table(
        "scheduler_state",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_scheduler_state"),
    )


def downgrade() -> None:
    op.drop_table("scheduler_state")
    op.drop_table("leases")
    op.drop_index("ix_jobs_changed_at", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("changed_at")
        batch.drop_column("run_time_s")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("running_at")
        batch.drop_column("attempt_key")
