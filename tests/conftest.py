"""Shared pytest fixtures. Each area keeps its fixtures in its own clearly marked block."""

from __future__ import annotations

# ======================================================================================
# store fixtures (owner: store) -- `sqlite_url`, `pg_url`, `store`, `sqlite_store`,
# `migrated_sqlite_url`
#
# `pg_url` creates a throwaway PostgreSQL database (tyard_test_<random>) once per test
# session on the server named by TYARD_TEST_PG_URL (default: postgres@127.0.0.1:5432) and
# drops it at the end. Unreachable PostgreSQL skips the PG cases, or fails them when the
# environment variable CI is set. `store` runs a test on both backends, each time empty.
# ======================================================================================
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tensoryard.store import Store, default_sqlite_url
from tensoryard.store.models import Base

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _pg_unavailable(message: str) -> None:
    hint = "start it (see .ci/run) or set TYARD_TEST_PG_URL"
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL is required in CI: {message}; {hint}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {message}; {hint}")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a fresh PostgreSQL database for this test session (dropped afterwards)."""
    admin_url = sa.make_url(os.environ.get("TYARD_TEST_PG_URL", PG_ADMIN_URL))
    admin = sa.create_engine(
        admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
    )
    name = f"tyard_test_{secrets.token_hex(6)}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.SQLAlchemyError as exc:
        admin.dispose()
        shown = admin_url.render_as_string(hide_password=True)
        _pg_unavailable(f"cannot create a database on {shown}: {str(exc).splitlines()[0]}")
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a SQLite file in this test's temporary directory."""
    return default_sqlite_url(tmp_path)


def _empty_pg_store(url: str) -> Store:
    store = Store.open(url)
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    return store


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty, migrated Store on SQLite and on PostgreSQL (the test runs once for each)."""
    if request.param == "sqlite":
        opened = Store.open(request.getfixturevalue("migrated_sqlite_url"))
    else:
        opened = _empty_pg_store(request.getfixturevalue("pg_url"))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="session")
def _migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("store-template")
    Store.open(default_sqlite_url(home)).close()
    return home / "tensoryard.db"


@pytest.fixture
def migrated_sqlite_url(tmp_path: Path, _migrated_sqlite_template: Path) -> str:
    """URL of an empty SQLite file already at the newest schema (a copy: cheaper than migrating)."""
    shutil.copyfile(_migrated_sqlite_template, tmp_path / "tensoryard.db")
    return default_sqlite_url(tmp_path)


@pytest.fixture
def sqlite_store(migrated_sqlite_url: str) -> Iterator[Store]:
    """An empty, migrated Store on a SQLite file (for fast unit tests)."""
    opened = Store.open(migrated_sqlite_url)
    try:
        yield opened
    finally:
        opened.close()


# ======================================================================================
# end of store fixtures
# ======================================================================================
