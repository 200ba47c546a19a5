"""Checkpoints record their format.

Revision ID: 0012_checkpoint_format
Revises: 0011_webhook_outbox
Create Date: 2026-12-03

``format`` is what the runtime wrote (``state-dict`` for a full state dict, ``dcp`` for a
``torch.distributed.checkpoint`` directory) or what the control plane detected in the reported
path (``megatron-dist``, ``safetensors``, ``hf``, ``files``); NULL for rows from before this
migration and paths the control plane cannot see.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_checkpoint_format"
down_revision: str | Sequence[str] | None = "0011_webhook_outbox"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("format", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("format")
