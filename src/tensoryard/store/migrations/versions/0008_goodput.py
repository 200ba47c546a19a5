"""Goodput accounting: checkpoint save and restore time of each attempt.

Revision ID: 0008_goodput
Revises: 0007_node_health
Create Date: 2026-12-02

The in-job runtime reports how long checkpoint saves blocked training and how long the resume
took (cumulative per attempt, so a re-sent report is harmless); the job summary breaks the
allocated time down into productive steps and each kind of badput with them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_goodput"
down_revision: str | Sequence[str] | None = "0007_node_health"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("checkpoint_save_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("checkpoint_restore_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("checkpoint_restore_s")
        batch.drop_column("checkpoint_save_s")
