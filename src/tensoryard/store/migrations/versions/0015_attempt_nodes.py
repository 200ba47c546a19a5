"""Attempts remember the nodes they were launched on.

Revision ID: 0015_attempt_nodes
Revises: 0014_attempt_launch
Create Date: 2026-12-04

The job's ``placement`` is where its current attempt runs; ``attempts.nodes`` keeps, for every
attempt, the node names of the placement it was launched with, so that the control plane can
exclude from a job's next placement a node where two of its attempts failed. NULL: an attempt
recorded before this revision (no exclusion is derived from it).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_attempt_nodes"
down_revision: str | Sequence[str] | None = "0014_attempt_launch"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("nodes", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("nodes")
