"""After a (re)start or a change of leader: finish the checkpoint removals a crash
interrupted, close and kill by key every stray attempt (unfinished, but its job no longer
owns it), reload every unfinished job, and repair each one whose attempt ended without it (a
crash between two old transactions); a live attempt is re-attached (the next poll decides)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from tensoryard.errors import TensoryardError
from tensoryard.executors.base import AttemptPhase, AttemptStatus, Executor
from tensoryard.registry.pruning import CheckpointPruner
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.isolation import JobGuard
from tensoryard.server.control.outcome import AttemptOutcome
from tensoryard.spec.states import JobState
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["Recovery"]

log = logging.getLogger("tensoryard.controller")


class Recovery:
    """Stateless: it repairs the store and reloads the index."""

    def __init__(
        self,
        *,
        store: Store,
        executor: Executor,
        index: JobIndex,
        guard: JobGuard,
        outcome: AttemptOutcome,
        check_fence: Callable[[], None],
    ) -> None:
        self._store = store
        self._executor = executor
        self._index = index
        self._guard = guard
        self._outcome = outcome
        self._check_fence = check_fence

    def repair(self) -> None:
        self._finish_checkpoint_removals()
        for job, attempt in self._store.stray_attempts():
            self._guard.run(job.id, self._close_stray, job, attempt)
        self._index.refresh()
        attempts = self._store.current_attempts()
        for job in list(self._index.jobs.values()):
            current = attempts.get(job.id)
            if current is None or job.state not in (JobState.STARTING, JobState.RUNNING):
                continue
            if current.finished_at is not None:
                self._guard.run(job.id, self._repair_finished, job, current)
            else:
                self._store.add_event(
                    job.id,
                    "recovery",
                    f"control plane restarted or took the lead; attempt {current.number} is "
                    f"{current.state}: re-attaching",
                    attempt=current.number,
                )

    def _finish_checkpoint_removals(self) -> None:
        """Delete the checkpoint directories retention had retired when a crash stopped it."""
        try:
            finished = CheckpointPruner(self._store).finish_pending()
        except TensoryardError as exc:  # retried at the next recovery; never blocks the loop
            log.warning("retention: cannot finish pending checkpoint removals: %s", exc)
            return
        if finished:
            log.info("retention: finished %d checkpoint removals a restart interrupted", finished)

    def _close_stray(self, job: JobRecord, attempt: AttemptRecord) -> None:
        killed = 0
        if attempt.handle:
            self._check_fence()
            with contextlib.suppress(TensoryardError):
                killed = self._executor.terminate(attempt.handle)
        why = (
            f"found unfinished after a restart while the job is {job.state.value}"
            + (f" at attempt {job.attempts}" if job.attempts != attempt.number else "")
            + f"; killed {killed} process(es) by its key"
        )
        self._store.finish_attempt(job.id, attempt.number, state="lost", reason=why)
        self._store.add_event(job.id, "recovery", f"attempt {attempt.number} {why}", attempt=None)

    def _repair_finished(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """An attempt ended but its job was not moved (a crash between two old transactions)."""
        try:
            phase = AttemptPhase(attempt.state)
        except ValueError:
            phase = AttemptPhase.LOST
        status = AttemptStatus(phase, attempt.exit_code, attempt.reason)
        to, why = self._outcome.next_state(job, attempt, status)
        if to is JobState.RESTARTING and job.restarts >= self._index.spec(job).restart.max_restarts:
            to = JobState.FAILED
        self._store.add_event(
            job.id,
            "recovery",
            f"attempt {attempt.number} had ended ({attempt.state}) but the job was still "
            f"{job.state.value}: moving it to {to.value}",
            attempt=attempt.number,
        )
        self._index.put(self._store.transition(job.id, to, reason=why, expected=[job.state]))
