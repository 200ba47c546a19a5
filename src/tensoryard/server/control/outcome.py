"""What a polled status means for its attempt and job: a starting attempt's hold-up becomes
an event, a running one is marked running, and an ended one moves its job (succeeded, failed,
cancelled, restarting within the budget, requeued off a node it failed on twice or lost, or
restarted on spares with the healthy nodes kept), in one store transaction with the
attempt's end."""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tensoryard.errors import Conflict, NotFound
from tensoryard.executors.base import CONFIG_EXIT_CODE, AttemptPhase, AttemptStatus
from tensoryard.server.control.avoidance import NodeAvoidance
from tensoryard.server.control.health import HealthCheck
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.nodes import NodeView
from tensoryard.server.control.rules import (
    HUNG,
    MAX_RUNTIME,
    NOT_STARTED,
    PREEMPTED,
    drained_node,
    is_drain,
)
from tensoryard.server.control.stopping import AttemptKey, AttemptStopper
from tensoryard.server.faults import crashpoint
from tensoryard.server.metrics import LoopMetrics
from tensoryard.server.scheduling import CorePolicy
from tensoryard.spec.states import TERMINAL_STATES, JobState
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["AttemptOutcome"]

log = logging.getLogger("tensoryard.controller")


@dataclass
class _Ending:
    """How an ended attempt's job moves: the arguments of its one finish transaction."""

    to: JobState
    why: str
    reason: str
    count_restart: bool | None
    placement: dict[str, Any] | None
    swap_event: str


class AttemptOutcome:
    """Applies polled statuses; remembers per attempt the last hold-up reported and whether
    its admission time (Kueue) was written."""

    def __init__(
        self,
        *,
        store: Store,
        index: JobIndex,
        nodes: NodeView,
        avoidance: NodeAvoidance,
        health: HealthCheck,
        stopper: AttemptStopper,
        metrics: LoopMetrics,
        policy: CorePolicy,
    ) -> None:
        self._store = store
        self._index = index
        self._nodes = nodes
        self._avoidance = avoidance
        self._health = health
        self._stopper = stopper
        self._metrics = metrics
        self._policy = policy
        self._starting_reason: dict[AttemptKey, str] = {}
        self._admitted_noted: set[AttemptKey] = set()

    def reset(self) -> None:
        self._starting_reason.clear()
        self._admitted_noted.clear()

    def apply(self, job: JobRecord, attempt: AttemptRecord, status: AttemptStatus) -> None:
        key = (job.id, attempt.number)
        if (
            status.admitted_at is not None
            and attempt.admitted_at is None
            and key not in self._admitted_noted
        ):
            # Kueue granted the resources: the wait before is queueing (goodput); written once
            when = datetime.fromtimestamp(status.admitted_at, UTC)
            with contextlib.suppress(NotFound):
                self._store.update_attempt(job.id, attempt.number, admitted_at=when)
            self._admitted_noted.add(key)
        if status.phase is AttemptPhase.STARTING:
            self._note_starting_reason(job, attempt, status.reason, queued=status.queued)
            return
        if status.phase is AttemptPhase.RUNNING:
            if attempt.state != "running" or job.state is JobState.STARTING:
                crashpoint("running.before_mark")
                how = f" ({status.reason})" if status.reason else ""
                with contextlib.suppress(Conflict):  # it ended meanwhile: the next poll says so
                    self._index.put(
                        self._store.mark_running(
                            job.id, attempt.number, f"attempt {attempt.number} running{how}"
                        )
                    )
            return
        crashpoint("finish.before")
        end = self._ending(job, attempt, status)
        try:
            record = self._store.finish_attempt(
                job.id,
                attempt.number,
                state=status.phase.value,
                exit_code=status.exit_code,
                reason=end.reason,
                job_to=end.to,
                job_reason=end.why,
                expected=[job.state],
                count_restart=end.count_restart,
                **({"placement": end.placement} if end.placement is not None else {}),
            )
        except Conflict as exc:
            log.info("job %s: attempt end not applied yet (%s)", job.id, exc)
            self._index.triggers.dirty = True
            return
        crashpoint("finish.after")
        if end.swap_event:  # after the change it describes (the state event says it too)
            self._store.add_event(job.id, "recovery", end.swap_event, attempt=attempt.number)
        self._index.put(record)
        self._starting_reason.pop(key, None)
        self._health.forget(key)
        self._admitted_noted.discard(key)
        if end.to in (JobState.RESTARTING, JobState.PENDING):
            self._metrics.restarted(job, attempt.reason or end.why)
        self._stopper.forget(key)
        if end.to is JobState.SUCCEEDED:  # the run-time estimator learns from finished jobs
            self._policy.observe_finished_job(record, record.run_time_s)
        if end.to in TERMINAL_STATES:
            self._store.revoke_job_token(job.id)

    def _ending(self, job: JobRecord, attempt: AttemptRecord, status: AttemptStatus) -> _Ending:
        to, why = self.next_state(job, attempt, status)
        if to is JobState.RESTARTING:
            to, why = self.retry_or_fail(job, why)
        # The stop reason we recorded (preempted, limit, hang) is the attempt's reason.
        reason = attempt.reason or status.reason or status.phase.value
        moved, avoided, swap_event = "", frozenset[str](), ""
        lost = frozenset[str]()
        if to is JobState.RESTARTING:  # a node where this job failed twice: placed elsewhere
            avoided, moved = self._avoidance.after_failure(job, attempt, status.phase.value, reason)
            # A node that is lost, NotReady, cordoned or draining now is left at once, on the
            # first failure it caused: a restart there would wait for a node that is not there.
            lost = self._nodes.unusable_placement(job, status) - avoided
            if lost:
                names = ", ".join(sorted(lost))
                avoided = avoided | lost
                moved = moved or f"requeued: waiting for a node to replace {names}"
            if moved:
                to, why = JobState.PENDING, f"{why}; {moved}"
        count_restart: bool | None = True if moved else None  # a restart all the same
        # A lost node is the cluster's failure, not the job's: no restart is charged for it.
        cluster_fault = bool(lost) and moved.startswith("requeued: waiting for a node")
        if cluster_fault:
            count_restart = False
        placement: dict[str, Any] | None = {} if to is JobState.PENDING else None
        drained = drained_node(attempt.reason) if to is JobState.PENDING else None
        gone = avoided or (frozenset({drained}) if drained else frozenset())
        if gone and len(job.placement) > 1 and not job.cancel_requested:
            # partial gang recovery: keep the healthy nodes, swap the bad ones for spares
            swapped = self._avoidance.replacement(job, gone)
            if swapped is not None:
                new = ", ".join(sorted(set(swapped) - set(job.placement)))
                to, placement = JobState.RESTARTING, swapped
                why = (
                    f"{why.split('; requeued')[0]}; {', '.join(sorted(gone))} replaced by "
                    f"{new} (partial gang recovery: the other nodes are kept, no queueing), "
                    "resuming from the last checkpoint"
                )
                # neither a drained node nor a lost one is the job's failure
                count_restart = bool(moved) and not cluster_fault
                swap_event = (
                    f"attempt {attempt.number}: {', '.join(sorted(gone))} replaced by {new}; "
                    f"the gang restarts on {', '.join(swapped)}"
                )
        return _Ending(to, why, reason, count_restart, placement, swap_event)

    def _note_starting_reason(
        self, job: JobRecord, attempt: AttemptRecord, reason: str, *, queued: bool = False
    ) -> None:
        """What holds a starting attempt up (an image that cannot be pulled, a pod the cluster
        cannot schedule, Kueue's queue) becomes an event once per new reason: `tyard describe`
        shows it."""
        key = (job.id, attempt.number)
        # A queue's reason changes its numbers as others come and go ("8 more needed"): one
        # event per kind of reason, not per number.
        seen = re.sub(r"\d+", "#", reason) if queued else reason
        if not reason or self._starting_reason.get(key) == seen:
            return
        self._starting_reason[key] = seen
        self._store.add_event(
            job.id,
            "queue" if queued else "warning",
            f"attempt {attempt.number} not running yet: {reason}",
            attempt=attempt.number,
        )

    def next_state(
        self, job: JobRecord, attempt: AttemptRecord, status: AttemptStatus
    ) -> tuple[JobState, str]:
        """Where a job goes when its attempt ended (RESTARTING still subject to the budget)."""
        n = attempt.number
        reason = status.reason or status.phase.value
        if status.phase is AttemptPhase.SUCCEEDED:
            return JobState.SUCCEEDED, f"attempt {n} succeeded"
        if attempt.reason.startswith(PREEMPTED) and not job.cancel_requested:
            return JobState.PENDING, f"{attempt.reason}; requeued, resumes from its last checkpoint"
        if is_drain(attempt.reason) and not job.cancel_requested:
            return (
                JobState.PENDING,
                f"{attempt.reason}; requeued, resumes from its last checkpoint on another node",
            )
        if attempt.reason.startswith(MAX_RUNTIME):
            return JobState.FAILED, attempt.reason
        if status.reason.startswith(PREEMPTED) and not job.cancel_requested:
            # preempted outside tensoryard (Kueue evicted the workload)
            return JobState.PENDING, f"{status.reason}; requeued, resumes from its last checkpoint"
        if job.cancel_requested:
            return JobState.CANCELLED, "cancelled by the user"
        if status.phase is AttemptPhase.FAILED and status.exit_code == CONFIG_EXIT_CODE:
            return (
                JobState.FAILED,
                f"attempt {n}: {reason}; not restarted: a configuration error (exit code "
                f"{CONFIG_EXIT_CODE}) fails every attempt alike",
            )
        if attempt.reason.startswith((HUNG, NOT_STARTED)):
            return JobState.RESTARTING, f"attempt {n} {attempt.reason}"
        if status.phase is AttemptPhase.CANCELLED:
            return JobState.CANCELLED, "cancelled"
        return JobState.RESTARTING, f"attempt {n}: {reason}"

    def retry_or_fail(self, job: JobRecord, reason: str) -> tuple[JobState, str]:
        spec = self._index.spec(job)
        if job.restarts < spec.restart.max_restarts:
            left = spec.restart.max_restarts - job.restarts - 1
            return (
                JobState.RESTARTING,
                f"{reason}; restarting from the last checkpoint ({self._resume_point(job)}) as "
                f"attempt {job.attempts + 1} in {spec.restart.backoff:g}s ({left} restart(s) left)",
            )
        return (
            JobState.FAILED,
            f"{reason}; no restarts left (max_restarts={spec.restart.max_restarts})",
        )

    def _resume_point(self, job: JobRecord) -> str:
        latest = self._store.latest_checkpoint(job.id)
        return f"step {latest.step}" if latest is not None else "none yet: from the start"
