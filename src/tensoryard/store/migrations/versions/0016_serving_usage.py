"""Gateway usage in tokens, stored per hour, team, user and deployment.

Revision ID: 0016_serving_usage
Revises: 0015_attempt_nodes
Create Date: 2026-12-04

Until this revision token usage was a Prometheus counter only (lost with the process, and
per replica). The gateway now adds each request's tokens to ``serving_usage`` rows, one per
(hour, team, user, deployment), by upserting increments.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_serving_usage"
down_revision: str | Sequence[str] | None = "0015_attempt_nodes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "serving_usage",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("user_name", sa.String(128), nullable=False),
        sa.Column("deployment", sa.String(63), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "team", "user_name", "deployment", name="pk_serving_usage"),
    )
    op.create_index("ix_serving_usage_team_hour", "serving_usage", ["team", "hour"])


def downgrade() -> None:
    op.drop_index("ix_serving_usage_team_hour", table_name="serving_usage")
    op.drop_table("serving_usage")
