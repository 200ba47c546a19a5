"""Pipelines: a run of a PipelineSpec and its steps.

Revision ID: 0005_pipelines
Revises: 0004_submit_key
Create Date: 2026-12-02

- pipelines: one row per run (spec, parameters, state, cancel request).
- pipeline_steps: one row per step (state, tries, the current job and every job it submitted,
  input hash for caching, outputs). A step's job is created in the same transaction that moves
  the step to RUNNING, so a crash never leaves a job without its step or the other way round.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_pipelines"
down_revision: str | Sequence[str] | None = "0004_submit_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "pipelines",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("user_name", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "state IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')",
            name="ck_pipelines_state",
        ),
        sa.ForeignKeyConstraint(["team"], ["teams.name"], name="fk_pipelines_team_teams"),
        sa.PrimaryKeyConstraint("id", name="pk_pipelines"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_pipelines_state", "pipelines", ["state"])
    op.create_index("ix_pipelines_team", "pipelines", ["team"])
    op.create_table(
        "pipeline_steps",
        sa.Column("pipeline_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("job_ids", sa.JSON(), nullable=False),
        sa.Column("input_hash", sa.String(64), nullable=False),
        sa.Column("cached_from", sa.String(64), nullable=False),
        sa.Column("outputs", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.CheckConstraint(
            "state IN ('WAITING', 'RUNNING', 'SUCCEEDED', 'CACHED', 'SKIPPED', 'FAILED', "
            "'CANCELLED')",
            name="ck_pipeline_steps_state",
        ),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["pipelines.id"],
            name="fk_pipeline_steps_pipeline_id_pipelines",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_pipeline_steps_job_id_jobs", ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("pipeline_id", "name", name="pk_pipeline_steps"),
    )
    op.create_index("ix_pipeline_steps_input_hash", "pipeline_steps", ["input_hash"])
    op.create_index("ix_pipeline_steps_job_id", "pipeline_steps", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_pipeline_steps_job_id", table_name="pipeline_steps")
    op.drop_index("ix_pipeline_steps_input_hash", table_name="pipeline_steps")
    op.drop_table("pipeline_steps")
    op.drop_index("ix_pipelines_state", table_name="pipelines")
    op.drop_index("ix_pipelines_team", table_name="pipelines")
    op.drop_table("pipelines")
