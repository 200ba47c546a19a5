"""Initial schema: teams, jobs, attempts, events, metrics, checkpoints, job tokens.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

A migration is a frozen snapshot: it spells out its types instead of importing the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_STATES = (
    "PENDING",
    "ADMITTED",
    "STARTING",
    "RUNNING",
    "RESTARTING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
)


def _ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _job_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["job_id"], ["jobs.id"], name=f"fk_{table}_job_id_jobs", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("name", sa.String(63), nullable=False),
        _ts("created_at"),
        sa.Column("gpu_quota", sa.Integer(), nullable=True),
        sa.Column("cpu_quota", sa.Float(), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_teams"),
    )
    states = ", ".join(f"'{s}'" for s in JOB_STATES)
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("user_name", sa.String(128), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        _ts("admitted_at", nullable=True),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("pending_reason", sa.Text(), nullable=False),
        _ts("pending_eta", nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=False),
        _ts("last_heartbeat", nullable=True),
        sa.CheckConstraint(f"state IN ({states})", name="ck_jobs_state"),
        sa.ForeignKeyConstraint(["team"], ["teams.name"], name="fk_jobs_team_teams"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sqlite_autoincrement=True,
    )
    for column in ("name", "state", "team", "user_name"):
        op.create_index(f"ix_jobs_{column}", "jobs", [column])

    op.create_table(
        "attempts",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("handle", sa.JSON(), nullable=False),
        _ts("started_at"),
        _ts("finished_at", nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("resumed_from_step", sa.Integer(), nullable=True),
        _ts("last_heartbeat", nullable=True),
        _job_fk("attempts"),
        sa.PrimaryKeyConstraint("job_id", "number", name="pk_attempts"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        _ts("ts"),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        _job_fk("events"),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"])

    op.create_table(
        "metrics",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("metric_values", sa.JSON(), nullable=False),
        _job_fk("metrics"),
        sa.PrimaryKeyConstraint("job_id", "attempt", "step", name="pk_metrics"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        _job_fk("checkpoints"),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
        sa.UniqueConstraint("job_id", "step", "path", name="uq_checkpoints_job_id_step_path"),
    )
    op.create_table(
        "job_tokens",
        sa.Column("job_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        _ts("created_at"),
        _job_fk("job_tokens"),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_tokens"),
    )


def downgrade() -> None:
    for table in ("job_tokens", "checkpoints", "metrics", "events", "attempts", "jobs", "teams"):
        op.drop_table(table)
