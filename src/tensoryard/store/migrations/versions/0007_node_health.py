"""Node health: nodes with a cordon state and a per-node history.

Revision ID: 0007_node_health
Revises: 0006_registry
Create Date: 2026-12-02

The closed health loop cordons a node (no new placements) or drains it (its running jobs are
requeued from their last checkpoint); `tyard nodes uncordon` gives it back. Every change is a
row of `node_events`, written in the same transaction as the node's new state.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_node_health"
down_revision: str | Sequence[str] | None = "0006_registry"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("state IN ('ready', 'cordoned', 'draining')", name="ck_nodes_state"),
        sa.PrimaryKeyConstraint("name", name="pk_nodes"),
    )
    op.create_table(
        "node_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(192), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node"], ["nodes.name"], name="fk_node_events_node_nodes", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_node_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_node_events_node_id", "node_events", ["node", "id"])


def downgrade() -> None:
    op.drop_index("ix_node_events_node_id", table_name="node_events")
    op.drop_table("node_events")
    op.drop_table("nodes")
