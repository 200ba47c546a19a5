"""Phase 3: schedule. When due, one pass: snapshot (a `ClusterView` of the pending and active
jobs, the nodes and the teams) -> the policy -> admissions (job -> ADMITTED with its
placement), preemptions (the victim is signalled to checkpoint, then requeued) and a pending
reason with an estimated start for every job left waiting. The policy's history (fair share,
run-time estimates) is saved to the store now and then and loaded on taking the lead."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime

from tensoryard.errors import StoreError
from tensoryard.server.config import ServerConfig
from tensoryard.server.control.avoidance import NodeAvoidance
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.isolation import JobGuard
from tensoryard.server.control.nodes import NodeView
from tensoryard.server.control.pending import PendingReasons
from tensoryard.server.control.rules import PREEMPTED, SCHEDULER_STATE_KEY, current_attempt
from tensoryard.server.control.stopping import AttemptStopper
from tensoryard.server.faults import crashpoint
from tensoryard.server.metrics import LoopMetrics
from tensoryard.server.scheduling import ClusterView, CorePolicy, Decisions, Preemption
from tensoryard.spec.states import ACTIVE_STATES, JobState
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["Scheduling"]

log = logging.getLogger("tensoryard.controller")

_STATE_SAVE_EVERY_S = 30.0
# Up to this many pending jobs every pass reads every reason; above, this many in turn (and
# the ones visited or changed): see _note_reasons.
_ALL_REASONS_BELOW = 1000


class Scheduling:
    """When the last pass ran and what it cost, when its answer changes with time alone
    (``wake_at``), the node shape it last saw, and when the policy's state was saved."""

    def __init__(
        self,
        *,
        store: Store,
        policy: CorePolicy,
        config: ServerConfig,
        clock: Callable[[], float],
        metrics: LoopMetrics,
        index: JobIndex,
        guard: JobGuard,
        nodes: NodeView,
        avoidance: NodeAvoidance,
        pending: PendingReasons,
        stopper: AttemptStopper,
    ) -> None:
        self._store = store
        self._policy = policy
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self._index = index
        self._guard = guard
        self._nodes = nodes
        self._avoidance = avoidance
        self._pending = pending
        self._stopper = stopper
        self.cost_s = 0.0  # how long the last pass took
        self._last = 0.0
        self._wake_at: float | None = None  # the last pass's Decisions.wake_at
        self._node_shape: tuple[tuple[str, bool, str], ...] = ()  # nodes at the last check
        self._last_state_save = 0.0
        self._reasons_cursor = 0  # where the next turn of a deep backlog's reasons starts
        self._reasons_read: dict[int, datetime] = {}  # job -> its updated_at when read
        self._unread: tuple[list[JobRecord], Decisions, float] | None = None  # see note_reasons

    def due(self, now: float) -> bool:
        """At once when capacity came free; after other changes (new submissions) at most
        every few times the last pass's duration, so a stream of submissions to a deep
        backlog cannot keep the scheduler (and the GIL) busy; and every
        `reschedule_interval_s` regardless (ETAs, aging); and when the last pass said its
        answer changes with time alone (a borrower became reclaimable)."""
        since = now - self._last
        if self._index.triggers.urgent or since >= self._config.reschedule_interval_s:
            return True
        shape = tuple((n.name, n.cordoned, n.state) for n in self._nodes.capacity(now))
        if shape != self._node_shape:  # a node came, went, or changed readiness: at once
            self._node_shape = shape
            return True
        if self._wake_at is not None and now >= self._wake_at:
            return True
        # 4x the last pass bounds the scheduler's share of the loop to a fifth under a stream
        # of submissions; the 20 ms floor only keeps cheap passes from running back to back
        # (a floor of a loop tick, 250 ms, added that much to a submission's start).
        gap = min(max(4 * self.cost_s, 0.02), 5.0)
        return self._index.triggers.dirty and since >= gap

    def run(self, now: float) -> None:
        started = time.perf_counter()
        try:
            self._pass(now)
        finally:
            self.cost_s = time.perf_counter() - started
            self._metrics.cycle_seconds.observe(self.cost_s)

    def _pass(self, now: float) -> None:
        triggers = self._index.triggers
        triggers.dirty = triggers.urgent = False
        self._last = now
        self._wake_at = None
        self._unread = None
        pending = [j for j in self._index.in_states(JobState.PENDING) if not j.cancel_requested]
        pending = [j for j in pending if self._guard.spec_or_quarantine(j) is not None]
        if not pending:
            return
        pending.sort(key=lambda j: (-j.priority, j.created_at, j.id))
        running = tuple(
            j
            for j in sorted(
                self._index.in_states(*ACTIVE_STATES), key=lambda j: (j.created_at, j.id)
            )
            if self._guard.spec_or_quarantine(j) is not None
        )
        attempts = self._store.current_attempts()
        capacity = self._nodes.capacity(now)
        view = ClusterView(
            nodes=capacity,
            teams=tuple(self._store.list_teams()),
            pending=tuple(pending),
            running=running,
            now=now,
            last_checkpoint=self._store.latest_checkpoint_times([job.id for job in running]),
            attained_s={j.id: j.run_time_s for j in (*pending, *running) if j.run_time_s},
            terminating=frozenset(j.id for j in running if _terminating(j, attempts.get(j.id))),
            attempt_started={
                j.id: (a.running_at or a.started_at).timestamp()
                for j in running
                if (a := attempts.get(j.id)) is not None and a.finished_at is None
            },
            specs=self._index.specs,
            avoid_nodes=self._avoidance.for_pending(pending, capacity),
        )
        decisions = self._policy.decide(view)
        self._wake_at = decisions.wake_at
        by_id = {j.id: j for j in pending}
        for admission in decisions.admissions:
            job = by_id[admission.job_id]
            nodes = ", ".join(admission.placement) or "-"
            if self._index.try_transition(
                job,
                JobState.ADMITTED,
                admission.reason or f"admitted on {nodes}",
                placement=admission.placement,
                pending_reason="",
                pending_eta=None,
            ):
                self._metrics.admitted(job, now)
            crashpoint("schedule.after_admit")
        running_by_id = {j.id: j for j in running}
        for preemption in decisions.preemptions:
            victim = running_by_id.get(preemption.job_id)
            if victim is not None:
                self._guard.run(victim.id, self._preempt, victim, preemption)
        self._unread = (pending, decisions, now)

    def note_reasons(self) -> None:
        """Hand the last pass's reasons to the writer (phase 5, after the launches: rendering
        a deep backlog's reasons must not delay the job that just got a slot)."""
        if self._unread is not None:
            pending, decisions, now = self._unread
            self._unread = None
            self._note_reasons(pending, decisions, now)

    def _note_reasons(self, pending: list[JobRecord], decisions: Decisions, now: float) -> None:
        """A small backlog's reasons are all read every pass. A deep one's (each reason is a
        rendered sentence) are read for the jobs this pass visited or that changed since
        their reason was last read, plus the next `_ALL_REASONS_BELOW` of the backlog in
        turn, so every reason is read again within a few passes without one pass paying for
        all of them (an unvisited job's reason only restates its place in line)."""
        if len(pending) <= _ALL_REASONS_BELOW:
            chosen, fresh = pending, {}
        else:
            visited = set(getattr(decisions.pending, "visited", ()))
            read = fresh = self._reasons_read
            start = self._reasons_cursor % len(pending)
            if start == 0:  # a new round: forget the jobs that left the backlog
                waiting = {j.id for j in pending}
                read = fresh = {k: v for k, v in read.items() if k in waiting}
            turn = pending[start : start + _ALL_REASONS_BELOW]
            self._reasons_cursor = start + len(turn)
            in_turn = {j.id for j in turn}
            chosen = turn + [
                j
                for j in pending
                if j.id not in in_turn and (j.id in visited or read.get(j.id) != j.updated_at)
            ]
        for job in chosen:
            info = decisions.pending.get(job.id)
            if info is not None:
                self._pending.decided(job, info.reason, info.eta_s, now)
                fresh[job.id] = job.updated_at
        self._reasons_read = fresh

    def _preempt(self, job: JobRecord, preemption: Preemption) -> None:
        """Signal a victim: it checkpoints within the grace period, then goes back to PENDING."""
        if job.cancel_requested or job.state not in (JobState.STARTING, JobState.RUNNING):
            return
        attempt = current_attempt(self._store, job)
        if attempt is None or attempt.finished_at is not None or attempt.state == "launching":
            return
        if self._stopper.sent((job.id, attempt.number)):
            return
        reason = f"{PREEMPTED} for job {preemption.for_job_id}: {preemption.message}"
        latest = self._store.latest_checkpoint(job.id)
        since = (attempt.running_at or attempt.started_at).timestamp()
        if latest is not None:
            since = max(since, latest.ts)
        gpus = sum(len(g) for g in job.placement.values())
        self._metrics.preempted(job, gpus, self._clock() - since)
        self._stopper.stop(
            job,
            attempt,
            reason,
            f"{reason}; {preemption.grace_s:g}s to checkpoint before SIGKILL",
            grace_s=preemption.grace_s,
            kind="preempt",
        )
        crashpoint("preempt.after_signal")

    # ---- the policy's state across restarts ------------------------------------------------

    def load_state(self) -> None:
        importer = getattr(self._policy, "import_state", None)
        if importer is None:
            return
        try:
            state = self._store.get_scheduler_state(SCHEDULER_STATE_KEY)
            if state:
                importer(state)
        except Exception:
            log.exception("stored scheduler state unreadable; starting with a fresh history")

    def save_state(self, *, force: bool = False) -> None:
        exporter = getattr(self._policy, "export_state", None)
        now = self._clock()
        if exporter is None or (not force and now - self._last_state_save < _STATE_SAVE_EVERY_S):
            return
        self._last_state_save = now
        with contextlib.suppress(StoreError):
            self._store.put_scheduler_state(SCHEDULER_STATE_KEY, exporter())


def _terminating(job: JobRecord, attempt: AttemptRecord | None) -> bool:
    """Cancelled or being stopped: still holds its resources during the grace period."""
    if job.cancel_requested:
        return True
    return attempt is not None and attempt.finished_at is None and bool(attempt.reason)
