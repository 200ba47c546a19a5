"""Per-job isolation: an error in one job's step never stops the others. A store error is
taken as transient (the next cycle retries); bad data fails the job at once; any other error
does after a few cycles in a row, with the error as its reason (quarantine)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from tensoryard.errors import FencedOut, StoreError
from tensoryard.executors.base import Executor
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.rules import BadJobData, current_attempt
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import TERMINAL_STATES, JobState
from tensoryard.store import JobRecord, Store

__all__ = ["JobGuard"]

log = logging.getLogger("tensoryard.controller")

_FAILURES_BEFORE_QUARANTINE = 3


class JobGuard:
    """Runs one job's step at a time; counts each job's consecutive errors."""

    def __init__(self, *, store: Store, executor: Executor, index: JobIndex) -> None:
        self._store = store
        self._executor = executor
        self._index = index
        self._failures: dict[int, int] = {}  # job -> consecutive errors
        index.on_finished.append(self.forget)

    def reset(self) -> None:
        self._failures.clear()

    def forget(self, job_id: int) -> None:
        self._failures.pop(job_id, None)

    def run(self, job_id: int, action: Callable[..., Any], *args: Any) -> None:
        """Run one job's step; an error there never stops the others."""
        try:
            action(*args)
        except FencedOut:
            raise  # not this job's fault: the whole loop stops (the replica stepped down)
        except StoreError as exc:
            log.warning("job %s: store error, retrying next cycle: %s", job_id, exc)
        except Exception as exc:
            count = self._failures.get(job_id, 0) + 1
            self._failures[job_id] = count
            log.exception("job %s: error in the control loop (%d in a row)", job_id, count)
            if isinstance(exc, BadJobData) or count >= _FAILURES_BEFORE_QUARANTINE:
                self.quarantine(job_id, f"{type(exc).__name__}: {exc}")
        else:
            self._failures.pop(job_id, None)

    def spec_or_quarantine(self, job: JobRecord) -> JobSpec | None:
        try:
            return self._index.spec(job)
        except BadJobData as exc:
            self.quarantine(job.id, str(exc))
            return None

    def quarantine(self, job_id: int, why: str) -> None:
        """Fail one job that the loop cannot handle, stopping whatever of it runs."""
        with _never_raise():
            job = self._store.get_job(job_id)
            if job.state in TERMINAL_STATES:
                return
            attempt = current_attempt(self._store, job)
            if attempt is not None and attempt.finished_at is None:
                killed = 0
                if attempt.handle:
                    with contextlib.suppress(Exception):
                        killed = self._executor.terminate(attempt.handle)
                self._store.finish_attempt(
                    job_id,
                    attempt.number,
                    state="failed",
                    reason=f"stopped by the control plane ({killed} process(es) killed): {why}",
                    job_to=JobState.FAILED,
                    job_reason=f"the control plane cannot run this job: {why}",
                )
            else:
                self._store.transition(
                    job_id, JobState.FAILED, reason=f"the control plane cannot run this job: {why}"
                )
            self._index.put(self._store.get_job(job_id))


@contextlib.contextmanager
def _never_raise() -> Iterator[None]:
    try:
        yield
    except Exception:
        log.exception("while failing a job")
