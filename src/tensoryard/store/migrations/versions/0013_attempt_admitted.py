"""Attempts record when an external admission engine (Kueue) granted their resources.

Revision ID: 0013_attempt_admitted
Revises: 0012_checkpoint_format
Create Date: 2026-12-03

Under ``--admission kueue`` an attempt is launched as a suspended JobSet and waits in Kueue's
queue; ``admitted_at`` (Kueue's QuotaReserved time) splits that wait, which is queueing, from
the attempt's startup in the goodput breakdown. NULL: admitted at launch (tensoryard's own
scheduler), or admitted before this migration.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_attempt_admitted"
down_revision: str | Sequence[str] | None = "0012_checkpoint_format"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("admitted_at")
