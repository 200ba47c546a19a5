"""Pooled PostgreSQL connections that the server dropped: pinged and replaced after idling,
and a connection dropped while in use costs one failed transaction, never the next one."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from tensoryard.errors import StoreError
from tensoryard.store import Store, _db

# The shared `store` fixture, on PostgreSQL only (SQLite has no connection to lose).
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("store", ["postgresql"], indirect=True),
]


def _drop_connections(pg_url: str) -> int:
    """Terminate every other session of this test database, as a restart or failover would."""
    url = sa.make_url(pg_url)
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %(db)s AND pid <> pg_backend_pid()",
                    {"db": url.database},
                ).all()
            )
    finally:
        admin.dispose()


def _statements(store: Store) -> list[str]:
    seen: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def test_an_idle_pooled_connection_is_pinged_and_replaced_when_gone(
    store: Store, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_db, "PING_IDLE_S", 0.2)
    store.list_teams()
    assert _drop_connections(pg_url) >= 1
    time.sleep(0.3)
    store.ensure_team("ml", gpu_quota=8)  # not an error: the dead connection was replaced
    assert "ml" in [t.name for t in store.list_teams()]


def test_a_connection_back_from_use_is_not_pinged_and_a_drop_costs_one_transaction(
    store: Store, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_db, "PING_IDLE_S", 3600.0)
    teams = store.list_teams()
    seen = _statements(store)
    store.list_teams()
    assert not any(s.strip() in ("", ";", "SELECT 1") for s in seen), seen  # no ping
    _drop_connections(pg_url)
    with pytest.raises(StoreError):
        store.list_teams()
    assert store.list_teams() == teams  # the pool replaced the connection it saw fail
