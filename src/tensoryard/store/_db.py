"""Engines, SQLite settings, Alembic migrations and DB-error translation for the store."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    InvalidatePoolError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.pool import StaticPool

from tensoryard.errors import Conflict, StoreError, StoreUnreachable

__all__ = [
    "BEGIN_OPTION",
    "MIGRATIONS_DIR",
    "alembic_config",
    "check_schema",
    "head_revision",
    "make_engine",
    "parse_url",
    "safe_url",
    "translate_errors",
    "upgrade",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
BEGIN_OPTION = "tyard_sqlite_begin"  # execution option: "IMMEDIATE" for write transactions
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10
# A pooled connection idle this long is pinged before use (see _ping_when_idle).
PING_IDLE_S = 1.0
# Any constant works; it only has to be the same for every tensoryard process.
PG_MIGRATION_LOCK_KEY = 0x7479617264  # "tyard"

SUPPORTED_BACKENDS = ("sqlite", "postgresql")
# PostgreSQL: deadlock detected, serialization failure. Both mean "retry".
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})

URL_FIX = (
    "use sqlite:///PATH/tensoryard.db for a local file or "
    "postgresql+psycopg://USER:PASSWORD@HOST:5432/DBNAME for PostgreSQL"
)


def parse_url(url: str) -> URL:
    """Parse a database URL or raise StoreError saying what a valid one looks like.

    A bare ``postgresql://`` means psycopg 3, the one PostgreSQL driver tensoryard ships with
    (SQLAlchemy alone would pick psycopg2).
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        shown = re.sub(r"(//[^/@]*?:)[^/@]*@", r"\1***@", url)  # never echo a password
        raise StoreError(f"cannot read database URL {shown!r} (fix: {URL_FIX})") from exc
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in SUPPORTED_BACKENDS:
        raise StoreError(
            f"tensoryard stores its data in SQLite or PostgreSQL, not "
            f"{parsed.get_backend_name()!r} ({safe_url(parsed)}) (fix: {URL_FIX})"
        )
    return parsed


def safe_url(url: str | URL) -> str:
    """The URL with its password masked, fit for messages and logs."""
    parsed = url if isinstance(url, URL) else parse_url(url)
    return parsed.render_as_string(hide_password=True)


def make_engine(url: str) -> Engine:
    """Create the engine; SQLite gets WAL, a busy timeout, foreign keys and explicit BEGINs."""
    parsed = parse_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_engine(parsed)
        kwargs: dict[str, Any] = {}
        if parsed.get_backend_name() == "postgresql":
            kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
        engine = create_engine(parsed, **kwargs)
        _ping_when_idle(engine)
        return engine
    except (NoSuchModuleError, ImportError) as exc:
        raise StoreError(
            f"no database driver for {safe_url(parsed)}: {exc} (fix: for PostgreSQL install "
            "the extra `pip install 'tensoryard[postgres]'` and write postgresql+psycopg://...)"
        ) from exc
    except ArgumentError as exc:
        raise StoreError(f"bad database URL {safe_url(parsed)}: {exc} (fix: {URL_FIX})") from exc


def _ping_when_idle(engine: Engine) -> None:
    """A pooled connection idle for PING_IDLE_S or longer is pinged before use and replaced
    when the server has gone away (a restart, a failover, an idle timeout), as SQLAlchemy's
    pre-ping does; one back from use within that time is not. Pre-ping sent a round trip ahead
    of every transaction: a tenth of the round trips of a submit on PostgreSQL."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since")  # none for a new connection: nothing to ping
        if since is None or time.monotonic() - since < PING_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # the pool drops its connections and connects anew
            raise InvalidatePoolError(f"the pooled connection is gone: {exc}") from exc


def _sqlite_engine(url: URL) -> Engine:
    database = url.database or ""
    in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
    if not in_memory:
        try:
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the directory for {database}: {exc.strerror} "
                "(fix: choose a writable path in the sqlite:/// URL)"
            ) from exc
    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    }
    if in_memory:
        # One shared connection, or every checkout would see a different empty database.
        kwargs["poolclass"] = StaticPool
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's own is unreliable).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that reads and then
        # writes can fail with SQLITE_BUSY at once instead of waiting for the busy timeout.
        mode = conn.get_execution_options().get(BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


@contextmanager
def translate_errors(url: str | URL, action: str) -> Iterator[None]:
    """Turn SQLAlchemy/DBAPI errors raised inside into StoreError/Conflict naming the URL."""
    try:
        yield
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) in RETRYABLE_SQLSTATES:
            raise Conflict(
                f"{action}: lost a race with a concurrent change ({exc.orig}); retry"
            ) from exc
        raise _translated(url, action, exc) from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"{action} failed on {safe_url(url)}: {exc}") from exc


def _translated(url: str | URL, action: str, exc: DBAPIError) -> StoreError:
    if isinstance(exc, IntegrityError):
        return Conflict(f"{action}: a concurrent or duplicate change was rejected: {exc.orig}")
    if isinstance(exc, OperationalError):
        message = _operational_message(url, action, exc)
        if message.startswith("cannot reach"):
            return StoreUnreachable(message)
        return StoreError(message)
    return StoreError(f"{action} failed on {safe_url(url)}: {exc.orig}")


def _operational_message(url: str | URL, action: str, exc: OperationalError) -> str:
    detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    if exc.connection_invalidated or _looks_unreachable(detail):
        return (
            f"cannot reach the database at {safe_url(url)} ({detail}) while trying to {action} "
            "(fix: start the database server, or check host, port, user and database name "
            f"in the URL; {URL_FIX})"
        )
    if "locked" in detail or "busy" in detail:
        return (
            f"the database {safe_url(url)} stayed locked for {SQLITE_BUSY_TIMEOUT_MS // 1000}s "
            f"while trying to {action} (fix: retry; for many concurrent writers use PostgreSQL)"
        )
    return f"{action} failed on {safe_url(url)}: {detail}"


def _looks_unreachable(detail: str) -> bool:
    needles = (
        "connection refused",
        "could not connect",
        "connection failed",
        "could not translate host",
        "timeout expired",
        "does not exist",
        "unable to open database",
        "password authentication failed",
        "no password supplied",
        "server closed the connection",
    )
    low = detail.lower()
    return any(n in low for n in needles)


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic config built in code (no alembic.ini needed), bound to a connection or URL."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def _scripts() -> ScriptDirectory:
    # The shipped migrations never change while the process runs; parse them once.
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest migration revision this code ships."""
    head = _scripts().get_current_head()
    if head is None:  # pragma: no cover - the package always ships migrations
        raise StoreError(f"no migrations found in {MIGRATIONS_DIR} (fix: reinstall tensoryard)")
    return head


def upgrade(engine: Engine, url: str) -> None:
    """Migrate to head in one transaction; concurrent openers wait for each other."""
    with translate_errors(url, "migrate the database schema"), engine.connect() as conn:
        conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK_KEY})
            current = MigrationContext.configure(conn).get_current_revision()
            if current == head_revision():
                return
            _check_known(current, url)
            command.upgrade(alembic_config(conn), "head")


def check_schema(engine: Engine, url: str) -> None:
    """Raise StoreError unless the database schema is exactly at this code's head revision."""
    with translate_errors(url, "read the schema version"), engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    head = head_revision()
    if current != head:
        _check_known(current, url)
        raise StoreError(
            f"the database {safe_url(url)} has schema revision {current or 'none'} but this "
            f"tensoryard needs {head} (fix: open it with migrate=True, e.g. start `tyard server` "
            "once, to upgrade the schema)"
        )


def _check_known(current: str | None, url: str) -> None:
    if current is None:
        return
    known = {rev.revision for rev in _scripts().walk_revisions()}
    if current not in known:
        raise StoreError(
            f"the database {safe_url(url)} has schema revision {current}, which this tensoryard "
            "does not know; it was written by a newer version (fix: upgrade tensoryard)"
        )
