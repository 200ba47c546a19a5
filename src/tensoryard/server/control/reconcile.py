"""Phase 2: reconcile every live attempt with what the executor sees. Per attempt: a user's
cancel is signalled, limits and health are enforced, the executor is polled (a transient poll
error is waited out, then the attempt is killed by key and declared lost), an attempt with
ranks on nodes whose agents fell silent is ended with those nodes, and the status is applied
(`outcome.AttemptOutcome`)."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Mapping

from tensoryard.errors import TensoryardError
from tensoryard.executors.base import AttemptPhase, AttemptStatus, Executor
from tensoryard.server.config import ServerConfig
from tensoryard.server.control.health import HealthCheck
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.isolation import JobGuard
from tensoryard.server.control.nodes import NodeView
from tensoryard.server.control.outcome import AttemptOutcome
from tensoryard.server.control.stopping import AttemptKey, AttemptStopper
from tensoryard.spec.states import JobState
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["Reconciler"]

# A timed full pass polls an attempt waiting in an external queue at most this often: its
# admission is a watch event, and polling a Kueue backlog of thousands every resync_interval_s
# cost the loop a core (its starting timeout counts from the last poll that saw it queued).
_QUEUED_RESYNC_S = 10.0
# A pass polls at least this many of them when they are due (else the share of the queue that
# keeps each within that interval, whichever is larger).
_QUEUED_MIN_PER_PASS = 64


class Reconciler:
    """Polls the live attempts; remembers since when each one's polls have been failing."""

    def __init__(
        self,
        *,
        store: Store,
        executor: Executor,
        config: ServerConfig,
        index: JobIndex,
        guard: JobGuard,
        stopper: AttemptStopper,
        health: HealthCheck,
        nodes: NodeView,
        outcome: AttemptOutcome,
        check_fence: Callable[[], None],
    ) -> None:
        self._store = store
        self._executor = executor
        self._config = config
        self._index = index
        self._guard = guard
        self._stopper = stopper
        self._health = health
        self._nodes = nodes
        self._outcome = outcome
        self._check_fence = check_fence
        self._poll_failing_since: dict[AttemptKey, float] = {}
        # Starting attempts whose last poll found them waiting in an external queue (Kueue),
        # and when: their admission comes as a watch event, so they wait for one like running
        # attempts, and the timed full pass looks at them only every _QUEUED_RESYNC_S.
        self._queued: dict[AttemptKey, float] = {}
        # Events (see `changed`): off until the executor reports changes; then the jobs it
        # named since the last pass, or every job when it could not say which.
        self.events = False
        self._changed_lock = threading.Lock()
        self._changed: set[int] = set()
        self._changed_all = True
        self._last_full = -1e18

    def reset(self) -> None:
        self._poll_failing_since.clear()
        self._queued.clear()
        self.changed(None)

    def changed(self, job_id: int | None) -> None:
        """An attempt of `job_id` may have changed (None: of some job); any thread."""
        with self._changed_lock:
            if job_id is None:
                self._changed_all = True
            else:
                self._changed.add(job_id)

    def reconcile(self, now: float) -> None:
        live = self._index.in_states(JobState.STARTING, JobState.RUNNING)
        every = len(live)
        with self._changed_lock:
            changed, everything = self._changed, self._changed_all
            self._changed, self._changed_all = set(), False
        if not live:
            return
        partial = self.events and not everything and 0 <= now - self._last_full < self._resync_s
        if partial:
            live = [job for job in live if self._due(job, changed)]
            if not live:
                return
        else:
            self._last_full = now
            if self._queued:  # attempts that ended or left STARTING since the last full pass
                starting = {(j.id, j.attempts) for j in live if j.state is JobState.STARTING}
                self._queued = {k: t for k, t in self._queued.items() if k in starting}
            if self.events and not everything and self._queued:
                live = self._spread_queued(live, changed, now)
        # (the attempts of the jobs looked at; the store reads them all when that is cheaper)
        attempts = self._store.current_attempts([j.id for j in live] if len(live) < every else None)
        for job in live:
            attempt = attempts.get(job.id)
            if attempt is None or attempt.finished_at is not None:
                continue
            if attempt.state == "launching":
                continue  # phase 4 (re)launches it
            self._guard.run(job.id, self._reconcile_one, job, attempt, now)

    @property
    def _resync_s(self) -> float:
        return self._config.resync_interval_s

    def _due(self, job: JobRecord, changed: set[int]) -> bool:
        """Between full passes: the jobs the executor named, and those whose attempt needs
        looking at every cycle (starting, unless its last poll found it waiting in an external
        queue; being stopped or cancelled; failing to poll). A queued attempt's admission comes
        as a watch event, and its starting timeout counts from the last poll that saw it
        queued: polling a Kueue backlog of thousands every cycle made a cycle take seconds."""
        if job.id in changed or job.cancel_requested:
            return True
        key = (job.id, job.attempts)
        if job.state is JobState.STARTING and key not in self._queued:
            return True
        return self._stopper.sent(key) or key in self._poll_failing_since

    def _spread_queued(
        self, live: list[JobRecord], changed: set[int], now: float
    ) -> list[JobRecord]:
        """A timed full pass: the attempts waiting in an external queue that nothing was said
        of are polled when a poll last saw them queued _QUEUED_RESYNC_S ago or more, oldest
        first, and at most the share of the queue that keeps each within that interval
        (resync_interval_s / _QUEUED_RESYNC_S of it, or _QUEUED_MIN_PER_PASS): a queue polled
        all at once made one cycle in five take a second at 2,000 waiting jobs."""
        skip: set[int] = set()
        stale: list[tuple[float, int]] = []
        for job in live:
            seen = self._queued.get((job.id, job.attempts))
            if seen is None or self._due(job, changed):
                continue
            skip.add(job.id)
            if not 0 <= now - seen < _QUEUED_RESYNC_S:
                stale.append((seen, job.id))
        if stale:
            share = max(self._resync_s, 0.0) / _QUEUED_RESYNC_S
            stale.sort()
            budget = max(_QUEUED_MIN_PER_PASS, math.ceil(len(skip) * share))
            skip.difference_update(i for _, i in stale[:budget])
        return [job for job in live if job.id not in skip] if skip else live

    def _reconcile_one(self, job: JobRecord, attempt: AttemptRecord, now: float) -> None:
        key = (job.id, attempt.number)
        if job.cancel_requested and not self._stopper.sent(key):
            self._stopper.stop(
                job, attempt, "", "cancel requested by the user", self._config.cancel_grace_s
            )
        if not self._stopper.sent(key):
            self._health.enforce_limits(job, attempt, now)
        try:
            status: AttemptStatus | None = self._executor.poll(attempt.handle)
        except TensoryardError as exc:
            status = self._poll_failed(job, attempt, now, exc)
        else:
            self._poll_failing_since.pop(key, None)
        if status is not None and not status.finished and job.placement:
            silent = {n: why for n, why in self._nodes.silent(now).items() if n in job.placement}
            if silent and not self._stopper.sent(key):
                status = self._end_on_lost_nodes(job, attempt, silent)
        if status is not None:
            if status.queued and not status.finished:
                self._queued[key] = now
            else:
                self._queued.pop(key, None)
            self._health.note_polled(key, queued=status.queued, now=now)
            self._outcome.apply(job, attempt, status)

    def _end_on_lost_nodes(
        self, job: JobRecord, attempt: AttemptRecord, lost: Mapping[str, str]
    ) -> AttemptStatus:
        """The attempt has ranks on nodes the control plane takes as lost (their agents went
        silent): its processes are killed by key (a lost node cannot checkpoint) and it fails
        with those nodes, so the restart leaves them (a spare, or a wait for them)."""
        reason = "; ".join(lost[n] for n in sorted(lost))
        self._store.add_event(job.id, "warning", reason, attempt=attempt.number)
        self._check_fence()
        with contextlib.suppress(TensoryardError):
            self._executor.terminate(attempt.handle)
        return AttemptStatus(AttemptPhase.FAILED, None, reason, lost_nodes=tuple(sorted(lost)))

    def _poll_failed(
        self, job: JobRecord, attempt: AttemptRecord, now: float, exc: Exception
    ) -> AttemptStatus | None:
        """A transient poll error is not a verdict: wait, then kill by key and declare LOST."""
        key = (job.id, attempt.number)
        since = self._poll_failing_since.setdefault(key, now)
        if since == now:
            self._store.add_event(
                job.id,
                "warning",
                f"cannot poll attempt {attempt.number} ({exc}); retrying for "
                f"{self._config.poll_failure_grace_s:g}s before giving it up",
                attempt=attempt.number,
            )
        if now - since < self._config.poll_failure_grace_s:
            return None
        killed = 0
        self._check_fence()
        with contextlib.suppress(TensoryardError):
            killed = self._executor.terminate(attempt.handle)
        self._poll_failing_since.pop(key, None)
        return AttemptStatus(
            AttemptPhase.LOST,
            reason=f"could not be polled for {now - since:.0f}s ({exc}); "
            f"killed {killed} process(es) by its key",
        )
