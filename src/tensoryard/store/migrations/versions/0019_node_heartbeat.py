"""A node's agent heartbeat: when the agent of a node last reported.

Revision ID: 0019_node_heartbeat
Revises: 0018_event_writer
Create Date: 2026-12-06

``tyard agent`` reports every health interval, with or without a fault. Where the executor has
no view of its own of a node (the local executor), a node whose agent has reported before and
then falls silent for the heartbeat timeout is taken as lost: the attempts on it end and the
node is left out of placements until its agent reports again. NULL: no agent has reported.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_node_heartbeat"
down_revision: str | Sequence[str] | None = "0018_event_writer"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("heartbeat_at")
