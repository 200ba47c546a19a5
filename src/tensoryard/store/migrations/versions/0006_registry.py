"""Model registry: models per team, immutable versions with lineage, tags, aliases.

Revision ID: 0006_registry
Revises: 0005_pipelines
Create Date: 2026-12-02

A migration is a frozen snapshot: it spells out its types instead of importing the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_registry"
down_revision: str | Sequence[str] | None = "0005_pipelines"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        _ts("created_at"),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.ForeignKeyConstraint(
            ["team"], ["teams.name"], name="fk_models_team_teams", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
        sa.UniqueConstraint("team", "name", name="uq_models_team_name"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("artifact", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("checkpoint_step", sa.Integer(), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("code_revision", sa.String(128), nullable=False),
        sa.Column("data_manifest", sa.String(128), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        _ts("created_at"),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name="fk_model_versions_model_id_models",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_model_versions_job_id_jobs", ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["parent_id"],
            ["model_versions.id"],
            name="fk_model_versions_parent_id_model_versions",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_model_versions"),
        sa.UniqueConstraint("model_id", "version", name="uq_model_versions_model_id_version"),
        sqlite_autoincrement=True,
    )
    for column in ("artifact", "data_manifest", "job_id", "parent_id"):
        op.create_index(f"ix_model_versions_{column}", "model_versions", [column])
    op.create_table(
        "model_tags",
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(63), nullable=False),
        sa.Column("value", sa.String(256), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["model_versions.id"],
            name="fk_model_tags_version_id_model_versions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("version_id", "key", name="pk_model_tags"),
    )
    op.create_index("ix_model_tags_key", "model_tags", ["key"])
    op.create_table(
        "model_aliases",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.String(63), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        _ts("updated_at"),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name="fk_model_aliases_model_id_models",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["model_versions.id"],
            name="fk_model_aliases_version_id_model_versions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "alias", name="pk_model_aliases"),
    )


def downgrade() -> None:
    op.drop_table("model_aliases")
    op.drop_index("ix_model_tags_key", table_name="model_tags")
    op.drop_table("model_tags")
    for column in ("artifact", "data_manifest", "job_id", "parent_id"):
        op.drop_index(f"ix_model_versions_{column}", table_name="model_versions")
    op.drop_table("model_versions")
    op.drop_table("models")
