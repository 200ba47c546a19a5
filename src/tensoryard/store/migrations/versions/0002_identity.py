"""Identity and access: users, team memberships with roles, API tokens, the audit log; job
tokens remember the attempt they were issued for.

Revision ID: 0002_identity
Revises: 0001
Create Date: 2026-12-02

A migration is a frozen snapshot: it spells out its types instead of importing the models.
The audit log is append-only: triggers refuse UPDATE and DELETE on both backends.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_identity"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MESSAGE = "audit_log is append-only"

_PG_FUNCTION = f"""
CREATE FUNCTION tyard_audit_log_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '{_MESSAGE}';
END;
$$ LANGUAGE plpgsql
"""


def _ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    with op.batch_alter_table("job_tokens") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=True))

    op.create_table(
        "users",
        sa.Column("name", sa.String(128), nullable=False),
        _ts("created_at"),
        sa.Column("platform_admin", sa.Boolean(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_users"),
    )
    op.create_table(
        "team_members",
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("user_name", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        _ts("created_at"),
        sa.CheckConstraint(
            "role IN ('viewer', 'member', 'team-admin')", name="ck_team_members_role"
        ),
        sa.ForeignKeyConstraint(
            ["team"], ["teams.name"], name="fk_team_members_team_teams", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["user_name"],
            ["users.name"],
            name="fk_team_members_user_name_users",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("team", "user_name", name="pk_team_members"),
    )
    op.create_index("ix_team_members_user_name", "team_members", ["user_name"])

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(126), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        _ts("created_at"),
        _ts("expires_at", nullable=True),
        _ts("revoked_at", nullable=True),
        _ts("last_used_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["user_name"], ["users.name"], name="fk_api_tokens_user_name_users", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
    )
    op.create_index("ix_api_tokens_user_name", "api_tokens", ["user_name"])

    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _ts("ts"),
        sa.Column("actor", sa.String(192), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("object", sa.String(256), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("source_ip", sa.String(64), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
        sqlite_autoincrement=True,
    )
    for column in ("action", "actor", "ts"):
        op.create_index(f"ix_audit_log_{column}", "audit_log", [column])
    _append_only_triggers()


def _append_only_triggers() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION tyard_audit_log_append_only()"
        )
        return
    for verb in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER audit_log_no_{verb.lower()} BEFORE {verb} ON audit_log "
            f"BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END"
        )


def downgrade() -> None:
    for table in ("audit_log", "api_tokens", "team_members", "users"):
        op.drop_table(table)
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS tyard_audit_log_append_only()")
    with op.batch_alter_table("job_tokens") as batch:
        batch.drop_column("attempt")
