"""Attempts restarted in place name the attempt whose launch they came from.

Revision ID: 0014_attempt_launch
Revises: 0013_attempt_admitted
Create Date: 2026-12-03

With ``restart.in_place`` torchrun restarts a failed gang's workers itself (``--max-restarts``)
instead of the control plane launching a new attempt; the restarted workers report as the next
attempt number, which the store records with ``launch_attempt`` set to the launched attempt
(same executor handle and key). NULL: an attempt the control plane launched.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_attempt_launch"
down_revision: str | Sequence[str] | None = "0013_attempt_admitted"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("launch_attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("launch_attempt")
