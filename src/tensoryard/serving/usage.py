"""Stored usage: the gateway's token counts, written to the database in batches.

The gateway counts each answered request (`UsageRecorder.add`, a dict update under a lock: no
database call on the request path). A background thread adds what accumulated to the
``serving_usage`` rows every `flush_s` seconds, in one transaction, by upserting increments
(several control-plane replicas count into the same rows). A flush that fails keeps its counts
and retries them with the next one; stopping the control plane flushes what is left. What a
process killed outright (SIGKILL, power loss) had not flushed is lost: at most `flush_s`
seconds of counts, which the Prometheus counter ``tyard_serving_tokens_total`` also had.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from tensoryard.store import Store, UsageDelta

__all__ = ["UsageRecorder"]

log = logging.getLogger(__name__)

_Key = tuple[datetime, str, str, str]  # hour, team, user, deployment


class UsageRecorder:
    def __init__(self, store: Store, *, flush_s: float = 2.0) -> None:
        self.store = store
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._pending: dict[_Key, list[int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0  # flushes that failed (their counts were kept)

    def add(
        self,
        deployment: str,
        team: str,
        user: str,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        requests: int = 1,
        at: datetime | None = None,
    ) -> None:
        """Count one answered request (never blocks on the database)."""
        hour = (at or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
        key = (hour, team, user, deployment)
        with self._lock:
            acc = self._pending.setdefault(key, [0, 0, 0])
            acc[0] += requests
            acc[1] += max(0, int(prompt_tokens))
            acc[2] += max(0, int(completion_tokens))

    def flush(self) -> int:
        """Write what accumulated; returns the rows written (0 when a write failed: the
        counts stay for the next flush)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        deltas = [
            UsageDelta(hour, team, user, dep, n, p, c)
            for (hour, team, user, dep), (n, p, c) in pending.items()
        ]
        try:
            self.store.add_serving_usage(deltas)
        except Exception as exc:  # the database is down or locked: keep the counts
            self.failures += 1
            log.warning("could not store serving usage (kept for the next flush): %s", exc)
            with self._lock:
                for key, (n, p, c) in pending.items():
                    acc = self._pending.setdefault(key, [0, 0, 0])
                    acc[0] += n
                    acc[1] += p
                    acc[2] += c
            return 0
        return len(deltas)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="tyard-usage", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and flush what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()
