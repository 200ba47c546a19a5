"""Idempotent submission: jobs.submit_key, unique per user.

Revision ID: 0004_submit_key
Revises: 0003_reliability
Create Date: 2026-12-02

A client that lost the answer to a submission (the control plane restarted, the network broke)
sends the same Idempotency-Key again and gets the job stored the first time instead of a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_submit_key"
down_revision: str | Sequence[str] | None = "0003_reliability"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("submit_key", sa.String(128), nullable=True))
    op.create_index("ux_jobs_user_submit_key", "jobs", ["user_name", "submit_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_jobs_user_submit_key", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("submit_key")
