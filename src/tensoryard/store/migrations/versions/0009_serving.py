"""Model serving: deployments and their replica processes.

Revision ID: 0009_serving
Revises: 0008_goodput
Create Date: 2026-12-02

A deployment is the desired state (model, engine, replica count, options, idle timeout); each
replica row is written with its port before its process is spawned, and keeps the pid so that a
restarted control plane can re-attach to it or replace it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_serving"
down_revision: str | Sequence[str] | None = "0008_goodput"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("model_ref", sa.Text(), nullable=False),
        sa.Column("model_path", sa.Text(), nullable=False),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("idle_timeout_s", sa.Float(), nullable=True),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["team"], ["teams.name"], name="fk_deployments_team_teams"),
        sa.PrimaryKeyConstraint("name", name="pk_deployments"),
    )
    op.create_table(
        "deployment_replicas",
        sa.Column("deployment", sa.String(63), nullable=False),
        sa.Column("slot", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("slot >= 0", name="ck_deployment_replicas_slot"),
        sa.ForeignKeyConstraint(
            ["deployment"],
            ["deployments.name"],
            name="fk_deployment_replicas_deployment_deployments",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("deployment", "slot", name="pk_deployment_replicas"),
    )


def downgrade() -> None:
    op.drop_table("deployment_replicas")
    op.drop_table("deployments")
