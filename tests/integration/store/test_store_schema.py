"""The shipped migrations produce exactly the models' schema, both ways, on both backends."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from tensoryard.store import Store
from tensoryard.store._db import alembic_config, head_revision
from tensoryard.store.models import Base


def schema_diff(store: Store, metadata: sa.MetaData) -> list[object]:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def test_migrating_to_head_gives_exactly_the_models_schema(store: Store) -> None:
    assert schema_diff(store, Base.metadata) == []


def test_the_schema_comparison_would_notice_a_missing_migration(store: Store) -> None:
    # Guard against a vacuous pass: a model change without a migration must show up.
    changed = sa.MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["jobs"].append_column(sa.Column("priority_class", sa.String(16)))
    sa.Index("ix_metrics_ts", changed.tables["metrics"].c.ts)
    diff = schema_diff(store, changed)
    kinds = sorted(str(d[0]) if isinstance(d, tuple) else str(d[0][0]) for d in diff)  # type: ignore[index]
    assert kinds == ["add_column", "add_index"]


def test_migrations_downgrade_to_nothing_and_upgrade_again(store: Store) -> None:
    store.ensure_team("keep-out")
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    tables = set(sa.inspect(store.engine).get_table_names()) - {"alembic_version"}
    assert tables == set()
    reopened = Store.open(store.url)
    try:
        assert schema_diff(reopened, Base.metadata) == []
        with reopened.engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == head_revision()
        assert reopened.list_teams() == []
    finally:
        reopened.close()


@pytest.mark.postgres
def test_a_plain_postgresql_url_uses_psycopg_3(pg_url: str) -> None:
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with Store.open(plain) as store:
        assert store.engine.dialect.driver == "psycopg"
        store.ping()
