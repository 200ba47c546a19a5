"""Stopping an attempt the one way every phase does (a cancel, a limit, a hang, a drain, a
preemption): record why first, then signal, and remember that the signal went out so no phase
sends it twice (after a restart the signal is sent once more: SIGTERM twice is harmless)."""

from __future__ import annotations

from collections.abc import Callable

from tensoryard.errors import TensoryardError
from tensoryard.executors.base import Executor
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["AttemptKey", "AttemptStopper"]

AttemptKey = tuple[int, int]  # (job id, attempt number)


class AttemptStopper:
    """Sends the stop signals and knows which attempts were signalled."""

    def __init__(
        self, *, store: Store, executor: Executor, check_fence: Callable[[], None]
    ) -> None:
        self._store = store
        self._executor = executor
        self._check_fence = check_fence
        self._sent: set[AttemptKey] = set()

    def reset(self) -> None:
        self._sent.clear()

    def sent(self, key: AttemptKey) -> bool:
        """Whether this attempt was signalled to stop (by this process)."""
        return key in self._sent

    def forget(self, key: AttemptKey) -> None:
        """The attempt ended."""
        self._sent.discard(key)

    def stop(
        self,
        job: JobRecord,
        attempt: AttemptRecord,
        reason: str,
        message: str,
        grace_s: float,
        kind: str = "cancel",
    ) -> None:
        """Record why (first), then signal: SIGTERM now (the runtime checkpoints), SIGKILL
        after `grace_s`."""
        self._sent.add((job.id, attempt.number))
        if reason:
            self._store.update_attempt(job.id, attempt.number, reason=reason)
        self._store.add_event(
            job.id,
            kind,
            f"{message}: SIGTERM, SIGKILL after {grace_s:g}s",
            attempt=attempt.number,
        )
        self._check_fence()
        try:
            self._executor.cancel(attempt.handle, grace_s=grace_s)
        except TensoryardError as exc:
            self._store.add_event(job.id, "error", f"stop failed: {exc}", attempt=attempt.number)
