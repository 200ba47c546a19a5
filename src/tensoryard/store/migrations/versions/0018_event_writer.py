"""Every event records the control plane replica and the leader epoch that wrote it.

Revision ID: 0018_event_writer
Revises: 0017_registry_redact
Create Date: 2026-12-06

With several replicas on one database a takeover leaves events from two writers interleaved;
``replica`` (the holder name) and ``epoch`` (the leader epoch a control-loop write carried as
its fencing token; NULL for API replicas and for rows written before) let the history be
reconstructed from the store (docs/state-machine.md, "Fencing").
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_event_writer"
down_revision: str | Sequence[str] | None = "0017_registry_redact"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("replica", sa.String(128), nullable=False, server_default=""))
        batch.add_column(sa.Column("epoch", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("epoch")
        batch.drop_column("replica")
