"""Opening a store: URLs, SQLite settings, migrations and errors a user can act on."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from tensoryard.errors import StoreError
from tensoryard.store import Store, _db, default_sqlite_url
from tensoryard.store._db import head_revision
from tensoryard.store.models import Base


def test_default_sqlite_url_points_at_tensoryard_db_in_home(tmp_path: Path) -> None:
    assert default_sqlite_url(tmp_path) == f"sqlite:///{tmp_path}/tensoryard.db"


def test_open_creates_missing_directories_and_migrates_to_head(tmp_path: Path) -> None:
    url = default_sqlite_url(tmp_path / "a" / "b")
    with Store.open(url) as store:
        tables = set(sa.inspect(store.engine).get_table_names())
    assert {t.name for t in Base.metadata.sorted_tables} | {"alembic_version"} == tables
    with sqlite3.connect(tmp_path / "a" / "b" / "tensoryard.db") as raw:
        assert raw.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (head_revision(),)
        ]


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(sqlite_store: Store) -> None:
    with sqlite_store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() >= 10_000


def test_reopening_keeps_data_and_does_not_migrate_twice(sqlite_url: str) -> None:
    with Store.open(sqlite_url) as store:
        store.ensure_team("vision")
    with Store.open(sqlite_url) as store:
        assert [t.name for t in store.list_teams()] == ["vision"]
    with Store.open(sqlite_url, migrate=False) as store:
        assert store.get_team("vision").name == "vision"


def test_open_without_migrating_an_empty_database_says_how_to_upgrade(sqlite_url: str) -> None:
    with pytest.raises(StoreError, match=r"schema revision none.*migrate=True"):
        Store.open(sqlite_url, migrate=False)


def test_a_database_from_a_newer_version_is_refused_with_the_fix(
    sqlite_url: str, tmp_path: Path
) -> None:
    Store.open(sqlite_url).close()
    with sqlite3.connect(tmp_path / "tensoryard.db") as raw:
        raw.execute("UPDATE alembic_version SET version_num = '9999_future'")
    for migrate in (True, False):
        with pytest.raises(StoreError, match=r"9999_future.*newer version.*upgrade tensoryard"):
            Store.open(sqlite_url, migrate=migrate)


def test_an_unreachable_postgres_names_the_url_without_password_and_the_fix() -> None:
    url = "postgresql+psycopg://alice:s3cret@127.0.0.1:1/jobs"
    with pytest.raises(StoreError) as info:
        Store.open(url)
    message = str(info.value)
    assert "cannot reach the database at postgresql+psycopg://alice:***@127.0.0.1:1/jobs" in message
    assert "s3cret" not in message
    assert "fix:" in message


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("not a url", "cannot read database URL"),
        ("postgres ql://u:p@localhost/db", "cannot read database URL 'postgres ql://u:\\*\\*\\*@"),
        ("mysql://u:p@localhost/db", "SQLite or PostgreSQL, not 'mysql'"),
        ("postgresql+psycopg2://u:p@localhost/db", "no database driver"),
    ],
    ids=[
        "a malformed url is explained",
        "a malformed url with a password is shown masked",
        "an unsupported database is explained",
        "a url without an installed driver is explained",
    ],
)
def test_bad_urls_raise_store_errors_with_the_accepted_forms(url: str, needle: str) -> None:
    with pytest.raises(StoreError, match=needle) as info:
        Store.open(url)
    assert "postgresql+psycopg://" in str(info.value)
    assert ":p@" not in str(info.value)


def test_an_in_memory_sqlite_store_works_for_quick_experiments() -> None:
    with Store.open("sqlite://") as store:
        store.ensure_team("ml")
        assert store.get_team("ml").name == "ml"
        store.ping()


def test_a_sqlite_file_locked_too_long_raises_a_store_error_that_suggests_postgres(
    migrated_sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_db, "SQLITE_BUSY_TIMEOUT_MS", 200)
    with Store.open(migrated_sqlite_url) as store:
        raw = sqlite3.connect(tmp_path / "tensoryard.db", isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match=r"stayed locked.*use PostgreSQL"):
                store.ensure_team("late")
            assert store.list_teams() == []  # readers are not blocked by a writer (WAL)
        finally:
            raw.execute("ROLLBACK")
            raw.close()
        assert store.ensure_team("late").name == "late"


def test_migrations_can_be_printed_as_sql_for_a_dba() -> None:
    out = io.StringIO()
    cfg = _db.alembic_config(url="postgresql+psycopg://dba@db.example/tyard")
    cfg.output_buffer = out
    command.upgrade(cfg, "head", sql=True)
    sql = out.getvalue()
    assert "CREATE TABLE jobs" in sql and "CREATE TABLE alembic_version" in sql
    assert "TIMESTAMP WITH TIME ZONE" in sql
