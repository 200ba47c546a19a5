"""The gateway's usage recorder: batched, and nothing lost when the database is down."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from tensoryard.serving.usage import UsageRecorder
from tensoryard.store import UsageDelta


class _FlakyStore:
    def __init__(self) -> None:
        self.down = False
        self.rows: dict[tuple[Any, ...], list[int]] = {}
        self.writes = 0

    def add_serving_usage(self, deltas: list[UsageDelta]) -> None:
        if self.down:
            raise OSError("database is locked")
        self.writes += 1
        for d in deltas:
            acc = self.rows.setdefault((d.hour, d.team, d.user, d.deployment), [0, 0, 0])
            acc[0] += d.requests
            acc[1] += d.prompt_tokens
            acc[2] += d.completion_tokens


def test_counts_are_batched_per_hour_and_kept_through_a_failed_flush() -> None:
    store = _FlakyStore()
    usage = UsageRecorder(store, flush_s=3600)  # type: ignore[arg-type]
    at = datetime(2026, 12, 4, 15, 42, 7, tzinfo=UTC)
    usage.add("chat", "nlp", "alice", 100, 10, at=at)
    usage.add("chat", "nlp", "alice", 20, 2, at=at)
    usage.add("chat", "nlp", "alice", 5, 0, requests=0, at=at)  # a stream's prompt, counted late
    store.down = True
    assert usage.flush() == 0 and usage.failures == 1
    usage.add("chat", "nlp", "alice", 1, 1, at=at)
    store.down = False
    usage.stop()  # flushes what is left
    hour = datetime(2026, 12, 4, 15, tzinfo=UTC)
    assert store.rows == {(hour, "nlp", "alice", "chat"): [3, 126, 13]}
    assert store.writes == 1
    assert usage.flush() == 0  # nothing pending


def test_the_background_thread_flushes_without_being_asked() -> None:
    store = _FlakyStore()
    usage = UsageRecorder(store, flush_s=0.05)  # type: ignore[arg-type]
    usage.start()
    try:
        usage.add("chat", "nlp", "alice", 3, 4)
        deadline = time.monotonic() + 5
        while not store.rows and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(store.rows.values()) == [[1, 3, 4]]
    finally:
        usage.stop()
