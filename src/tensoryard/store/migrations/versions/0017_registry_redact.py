"""Model versions keep no secrets: env values in their stored job spec are redacted.

Revision ID: 0017_registry_redact
Revises: 0016_serving_usage
Create Date: 2026-12-06

Until this revision promoting a checkpoint copied the job's whole spec, env values included,
into ``model_versions.spec``, where every viewer of the team could read them. New versions store
the spec through ``tensoryard.spec.redact.redact_spec``; this revision scrubs the rows written
before. There is no way back (the values are gone), so the downgrade leaves the rows as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tensoryard.spec.redact import redact_spec

revision: str = "0017_registry_redact"
down_revision: str | Sequence[str] | None = "0016_serving_usage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_versions = sa.table(
    "model_versions",
    sa.column("id", sa.Integer),
    sa.column("spec", sa.JSON),
)


def upgrade() -> None:
    if op.get_context().as_sql:  # SQL printed for a DBA: a data fix has no fixed statement
        op.execute("-- 0017: redact env values in model_versions.spec (run online)")
        return
    bind = op.get_bind()
    rows = bind.execute(sa.select(_versions.c.id, _versions.c.spec)).all()
    for row_id, spec in rows:
        if spec is None:
            continue
        clean = redact_spec(spec)
        if clean != spec:
            bind.execute(_versions.update().where(_versions.c.id == row_id).values(spec=clean))


def downgrade() -> None:
    """Nothing to undo: redacted values cannot be restored."""
