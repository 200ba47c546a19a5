"""Stored gateway usage (serving_usage): increments add up, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from tensoryard.store import Store, UsageDelta

H0 = datetime(2026, 12, 3, 22, tzinfo=UTC)
H1 = H0 + timedelta(hours=1)
H2 = H0 + timedelta(hours=2)  # the next day


def _d(hour: datetime, team: str, user: str, dep: str, n: int, p: int, c: int) -> UsageDelta:
    return UsageDelta(hour, team, user, dep, n, p, c)


def test_increments_add_up_and_group_by_any_keys(store: Store) -> None:
    store.add_serving_usage(
        [
            _d(H0, "nlp", "alice", "chat", 2, 100, 10),
            _d(H1, "nlp", "bob", "chat", 1, 50, 5),
            _d(H2, "vision", "carol", "clip", 4, 400, 0),
        ]
    )
    store.add_serving_usage([_d(H0, "nlp", "alice", "chat", 1, 30, 3)])  # the same row again
    by_team = store.serving_usage(by=("team",))
    assert [(r.team, r.requests, r.prompt_tokens, r.completion_tokens) for r in by_team] == [
        ("vision", 4, 400, 0),
        ("nlp", 4, 180, 18),
    ]
    by_user = store.serving_usage(by=("team", "user"), teams=["nlp"])
    assert [(r.user, r.requests, r.total_tokens) for r in by_user] == [
        ("alice", 3, 143),
        ("bob", 1, 55),
    ]
    by_day = store.serving_usage(by=("day",))
    assert [(r.period, r.requests) for r in by_day] == [
        (datetime(2026, 12, 3, tzinfo=UTC), 4),
        (datetime(2026, 12, 4, tzinfo=UTC), 4),
    ]
    by_hour = store.serving_usage(by=("deployment", "hour"), since=H1, until=H2)
    assert [(r.deployment, r.period, r.requests) for r in by_hour] == [("chat", H1, 1)]
    assert store.serving_usage(by=("team",), teams=[]) == []
    with pytest.raises(ValueError, match="cannot group usage"):
        store.serving_usage(by=("hour", "day"))


def test_concurrent_writers_into_one_row_lose_no_count(store: Store) -> None:
    """Control-plane replicas upsert into the same rows at once: every increment stays."""

    def writer() -> None:
        for _ in range(20):
            store.add_serving_usage([_d(H0, "nlp", "alice", "chat", 1, 7, 1)])

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (row,) = store.serving_usage(by=("team", "user", "deployment"))
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (80, 560, 80)
