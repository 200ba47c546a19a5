"""`tyard server --db-wait`: a database that cannot be reached yet at start is retried (a
PostgreSQL started beside the server, as on Kubernetes), then its error is raised; any other
database error fails at once."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from tensoryard.errors import StoreError, StoreUnreachable
from tensoryard.server import main
from tensoryard.server.config import ServerConfig
from tensoryard.store import Store

REFUSED = "postgresql+psycopg://u:p@127.0.0.1:1/db"  # port 1: connection refused at once


def test_without_a_wait_an_unreachable_database_fails_at_once(tmp_path: Path) -> None:
    config = ServerConfig(home=tmp_path, db_url=REFUSED)
    started = time.monotonic()
    with pytest.raises(StoreUnreachable, match="cannot reach the database"):
        main._open_store(config)
    assert time.monotonic() - started < 5


def test_with_a_wait_it_retries_then_raises_the_last_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = ServerConfig(home=tmp_path, db_url=REFUSED, db_wait_s=0.5)
    with caplog.at_level(logging.WARNING), pytest.raises(StoreUnreachable):
        main._open_store(config, retry_s=0.1)
    waits = [r.getMessage() for r in caplog.records if "waiting for the database" in r.message]
    assert len(waits) >= 2 and "u:***@127.0.0.1:1" in waits[0]  # no password in the log


def test_a_database_that_comes_up_while_waiting_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real_open = Store.open

    def flaky_open(url: str) -> Store:
        calls.append(url)
        if len(calls) < 3:
            raise StoreUnreachable("cannot reach the database at ... (not up yet)")
        return real_open(url)

    monkeypatch.setattr(main.Store, "open", staticmethod(flaky_open))
    config = ServerConfig(home=tmp_path, db_wait_s=30)
    store = main._open_store(config, retry_s=0.01)
    assert len(calls) == 3
    store.close()


def test_other_database_errors_are_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(url: str) -> Store:
        raise StoreError("the schema is newer than this tensoryard")

    monkeypatch.setattr(main.Store, "open", staticmethod(broken))
    started = time.monotonic()
    with pytest.raises(StoreError, match="newer"):
        main._open_store(ServerConfig(home=tmp_path, db_wait_s=30), retry_s=0.01)
    assert time.monotonic() - started < 1
