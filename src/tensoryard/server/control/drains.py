"""Phase 2b: move jobs off draining nodes. A running attempt gets the checkpoint signal (its
job is then requeued, see `outcome.AttemptOutcome.next_state`); a job admitted or waiting to
restart there goes back to PENDING at once. Idempotent: a stopped attempt is not signalled
again."""

from __future__ import annotations

from tensoryard.server.config import ServerConfig
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.isolation import JobGuard
from tensoryard.server.control.nodes import NodeView
from tensoryard.server.control.rules import DRAINED, current_attempt
from tensoryard.server.control.stopping import AttemptStopper
from tensoryard.spec.states import JobState
from tensoryard.store import JobRecord, Store

__all__ = ["Drains"]


class Drains:
    """Stateless: the signals sent are remembered by the stopper."""

    def __init__(
        self,
        *,
        store: Store,
        config: ServerConfig,
        index: JobIndex,
        guard: JobGuard,
        nodes: NodeView,
        stopper: AttemptStopper,
    ) -> None:
        self._store = store
        self._config = config
        self._index = index
        self._guard = guard
        self._nodes = nodes
        self._stopper = stopper

    def drain(self, now: float) -> None:
        draining = {n: r for n, r in self._nodes.states(now).items() if r.state == "draining"}
        if not draining:
            return
        active = self._index.in_states(
            JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING
        )
        for job in active:
            node = next((n for n in job.placement if n in draining), None)
            if node is not None and not job.cancel_requested:
                why = f"node {node}{DRAINED}{draining[node].reason}"
                self._guard.run(job.id, self._drain_job, job, why)

    def _drain_job(self, job: JobRecord, why: str) -> None:
        if job.state in (JobState.ADMITTED, JobState.RESTARTING):
            if self._index.try_transition(
                job,
                JobState.PENDING,
                f"{why}; requeued, resumes from its last checkpoint on another node",
                placement={},
            ):
                self._store.add_event(job.id, "drain", why)
            return
        attempt = current_attempt(self._store, job)
        if attempt is None or attempt.finished_at is not None or attempt.state == "launching":
            return  # phase 4 (re)launches it; the next cycle signals it
        if self._stopper.sent((job.id, attempt.number)):
            return  # after a restart the signal is sent once more: SIGTERM twice is harmless
        self._stopper.stop(
            job,
            attempt,
            why,
            f"{why}; checkpointing, then requeued",
            self._config.cancel_grace_s,
            kind="drain",
        )
