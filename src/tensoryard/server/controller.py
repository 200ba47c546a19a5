"""The control loop: schedule pending jobs, launch admitted ones, reconcile running attempts.

One `cycle()` reads top to bottom as numbered phases. All side effects go through the store
(state, events) and the executor (processes); the policy only decides. Every state change is a
compare-and-set in the store, so a crash between two phases loses nothing: the next cycle (or
the next control plane after a restart) picks up from what the store says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tensoryard.errors import Conflict, ExecutorError, TensoryardError
from tensoryard.executors.base import AttemptPhase, AttemptStatus, Executor, LaunchRequest
from tensoryard.server.config import ServerConfig
from tensoryard.server.scheduling import ClusterView, CorePolicy, NodeCapacity, Preemption
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["Controller"]

log = logging.getLogger("tensoryard.controller")

PREEMPTED = "preempted"

CapacityProvider = Callable[[], tuple[NodeCapacity, ...]]


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


@dataclass
class _Memory:
    """What the controller remembers between cycles (rebuilt from the store after a restart)."""

    cancel_sent: set[tuple[int, int]] = field(default_factory=set)  # (job, attempt)
    stale_warned: set[tuple[int, int]] = field(default_factory=set)


class Controller:
    """Drives jobs through PENDING -> ADMITTED -> STARTING -> RUNNING -> terminal."""

    def __init__(
        self,
        *,
        store: Store,
        executor: Executor,
        policy: CorePolicy,
        capacity: CapacityProvider,
        config: ServerConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.executor = executor
        self.policy = policy
        self.capacity = capacity
        self.config = config
        self.clock = clock
        self._mem = _Memory()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------------

    def recover(self) -> None:
        """After a (re)start: find every active attempt again and record what became of it."""
        for job in self.store.active_jobs():
            attempt = self._current_attempt(job)
            if attempt is None or attempt.finished_at is not None:
                continue
            try:
                status = self.executor.reattach(attempt.handle)
            except TensoryardError as exc:
                status = AttemptStatus(AttemptPhase.LOST, reason=f"reattach failed: {exc}")
            self.store.add_event(
                job.id,
                "recovery",
                f"control plane restarted; attempt {attempt.number} is {status.phase.value}"
                + (f" ({status.reason})" if status.reason else ""),
                attempt=attempt.number,
            )
            self._apply_status(job, attempt, status)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tyard-controller", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Run the next cycle now (after a submit or cancel) instead of at the next tick."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cycle()
            except Exception:  # the loop must survive anything; the next cycle retries
                log.exception("control cycle failed")
            self._wake.wait(self.config.loop_interval_s)
            self._wake.clear()

    # ---- one cycle -------------------------------------------------------------------------

    def cycle(self) -> None:
        """One pass: the numbered phases below, each idempotent."""
        with self._lock:
            now = self.clock()
            # 1. Cancel requests for jobs that never started end at once.
            self._cancel_pending()
            # 2. Schedule: snapshot -> policy -> admissions and pending reasons.
            self._schedule(now)
            # 3. Launch admitted jobs and restarts whose backoff has passed.
            self._launch_ready(now)
            # 4. Reconcile running attempts with what the executor sees.
            self._reconcile(now)

    # 1 ------------------------------------------------------------------------------------
    def _cancel_pending(self) -> None:
        for job in self.store.pending_jobs():
            if job.cancel_requested:
                self._try_transition(job, JobState.CANCELLED, "cancelled before it started")

    # 2 ------------------------------------------------------------------------------------
    def _schedule(self, now: float) -> None:
        pending = tuple(j for j in self.store.pending_jobs() if not j.cancel_requested)
        if not pending:
            return
        running = tuple(self.store.active_jobs())
        view = ClusterView(
            nodes=self.capacity(),
            teams=tuple(self.store.list_teams()),
            pending=pending,
            running=running,
            now=now,
            last_checkpoint=self._checkpoint_times(running),
            attained_s={j.id: self._attained_s(j) for j in (*pending, *running) if j.attempts},
            terminating=frozenset(j.id for j in running if self._terminating(j)),
        )
        decisions = self.policy.decide(view)
        by_id = {j.id: j for j in pending}
        for admission in decisions.admissions:
            job = by_id[admission.job_id]
            nodes = ", ".join(admission.placement) or "-"
            self._try_transition(
                job,
                JobState.ADMITTED,
                f"admitted on {nodes}",
                placement=admission.placement,
                pending_reason="",
                pending_eta=None,
            )
        running_by_id = {j.id: j for j in running}
        for preemption in decisions.preemptions:
            self._preempt(running_by_id.get(preemption.job_id), preemption)
        for job_id, info in decisions.pending.items():
            job = by_id[job_id]
            eta = _utc(info.eta_s) if info.eta_s is not None else None
            if job.pending_reason != info.reason or job.pending_eta != eta:
                self.store.update_job(job_id, pending_reason=info.reason, pending_eta=eta)
                if job.pending_reason != info.reason:
                    self.store.add_event(job_id, "pending", info.reason)

    def _checkpoint_times(self, running: tuple[JobRecord, ...]) -> dict[int, float]:
        times = {}
        for job in running:
            latest = self.store.latest_checkpoint(job.id)
            if latest is not None:
                times[job.id] = latest.ts
        return times

    def _terminating(self, job: JobRecord) -> bool:
        """Cancelled or preempted: still holds its resources during the grace period."""
        if job.cancel_requested:
            return True
        attempt = self._current_attempt(job)
        return attempt is not None and attempt.reason.startswith(PREEMPTED)

    def _attained_s(self, job: JobRecord) -> float:
        """Run time of the job's finished attempts (what fair share and LAS may look at)."""
        return sum(
            (a.finished_at - a.started_at).total_seconds()
            for a in self.store.list_attempts(job.id)
            if a.finished_at is not None
        )

    def _preempt(self, job: JobRecord | None, preemption: Preemption) -> None:
        """Signal a victim: it checkpoints within the grace period, then goes back to PENDING."""
        if job is None or job.cancel_requested:
            return
        attempt = self._current_attempt(job)
        if attempt is None or attempt.finished_at is not None:
            return
        key = (job.id, attempt.number)
        if key in self._mem.cancel_sent:
            return
        reason = f"{PREEMPTED} for job {preemption.for_job_id}: {preemption.message}"
        self.store.update_attempt(job.id, attempt.number, reason=reason)
        self._mem.cancel_sent.add(key)
        self.store.add_event(
            job.id,
            "preempt",
            f"{reason}; {preemption.grace_s:g}s to checkpoint before SIGKILL",
            attempt=attempt.number,
        )
        try:
            self.executor.cancel(attempt.handle, grace_s=preemption.grace_s)
        except TensoryardError as exc:
            self.store.add_event(
                job.id, "error", f"preemption failed: {exc}", attempt=attempt.number
            )

    # 3 ------------------------------------------------------------------------------------
    def _launch_ready(self, now: float) -> None:
        for job in self.store.active_jobs():
            if job.state is JobState.ADMITTED:
                self._launch(job)
            elif job.state is JobState.RESTARTING:
                spec = JobSpec.model_validate(job.spec)
                if job.cancel_requested:
                    self._try_transition(job, JobState.CANCELLED, "cancelled while restarting")
                elif now >= job.updated_at.timestamp() + spec.restart.backoff:
                    self._launch(job)

    def _launch(self, job: JobRecord) -> None:
        spec = JobSpec.model_validate(job.spec)
        run_dir = Path(job.run_dir)
        ckpt_dir = Path(spec.checkpoint.dir) if spec.checkpoint.dir else run_dir / "checkpoints"
        latest = self.store.latest_checkpoint(job.id)
        number = job.attempts + 1
        token = self.store.issue_job_token(job.id)
        env = {
            "TYARD_JOB_ID": str(job.id),
            "TYARD_ATTEMPT": str(number),
            "TYARD_RUN_DIR": str(run_dir),
            "TYARD_CHECKPOINT_DIR": str(ckpt_dir),
            "TYARD_CHECKPOINT_INTERVAL": str(spec.checkpoint.interval),
            "TYARD_CHECKPOINT_KEEP": str(spec.checkpoint.keep),
            "TYARD_SERVER_URL": self.config.report_url,
            "TYARD_JOB_TOKEN": token,
        }
        request = LaunchRequest(
            job_id=str(job.id),
            attempt=number,
            spec=spec,
            run_dir=run_dir,
            env=env,
            placement=dict(job.placement),
        )
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            handle = self.executor.launch(request)
        except (ExecutorError, OSError) as exc:
            reason = f"launch of attempt {number} failed: {exc}"
            self.store.start_attempt(job.id, handle={})  # the number is used up
            self.store.update_attempt(
                job.id, number, state=AttemptPhase.FAILED.value, reason=reason, finished=True
            )
            self._fail_or_retry(self.store.get_job(job.id), number, reason)
            return
        self.store.start_attempt(
            job.id, handle=handle, resumed_from_step=latest.step if latest else None
        )
        resume = f", resuming from checkpoint step {latest.step}" if latest else ""
        self._try_transition(job, JobState.STARTING, f"attempt {number} launched{resume}")

    # 4 ------------------------------------------------------------------------------------
    def _reconcile(self, now: float) -> None:
        for job in self.store.active_jobs():
            if job.state not in (JobState.STARTING, JobState.RUNNING):
                continue
            attempt = self._current_attempt(job)
            if attempt is None or attempt.finished_at is not None:
                continue
            key = (job.id, attempt.number)
            if job.cancel_requested and key not in self._mem.cancel_sent:
                self._cancel_attempt(job, attempt, "cancel requested by the user")
            self._enforce_max_runtime(job, attempt, now)
            self._warn_if_silent(job, attempt, now)
            try:
                status = self.executor.poll(attempt.handle)
            except TensoryardError as exc:
                status = AttemptStatus(AttemptPhase.LOST, reason=f"poll failed: {exc}")
            self._apply_status(job, attempt, status)

    def _cancel_attempt(self, job: JobRecord, attempt: AttemptRecord, why: str) -> None:
        self._mem.cancel_sent.add((job.id, attempt.number))
        grace = self.config.cancel_grace_s
        self.store.add_event(
            job.id, "cancel", f"{why}: SIGTERM, SIGKILL after {grace:g}s", attempt=attempt.number
        )
        try:
            self.executor.cancel(attempt.handle, grace_s=grace)
        except TensoryardError as exc:
            self.store.add_event(job.id, "error", f"cancel failed: {exc}", attempt=attempt.number)

    def _enforce_max_runtime(self, job: JobRecord, attempt: AttemptRecord, now: float) -> None:
        limit = JobSpec.model_validate(job.spec).max_runtime
        if limit is None or job.started_at is None or job.cancel_requested:
            return
        if now - job.started_at.timestamp() > limit:
            self.store.request_cancel(job.id)
            self.store.update_attempt(
                job.id, attempt.number, reason=f"exceeded max_runtime of {limit:g}s"
            )
            self._cancel_attempt(job, attempt, f"max_runtime of {limit:g}s exceeded")

    def _warn_if_silent(self, job: JobRecord, attempt: AttemptRecord, now: float) -> None:
        if job.state is not JobState.RUNNING or attempt.last_heartbeat is None:
            return
        key = (job.id, attempt.number)
        silent = now - attempt.last_heartbeat.timestamp()
        if silent > self.config.heartbeat_timeout_s and key not in self._mem.stale_warned:
            self._mem.stale_warned.add(key)
            self.store.add_event(
                job.id,
                "warning",
                f"no heartbeat for {silent:.0f}s: the job may be hung",
                attempt=attempt.number,
            )

    def _apply_status(self, job: JobRecord, attempt: AttemptRecord, status: AttemptStatus) -> None:
        if status.phase is AttemptPhase.STARTING:
            return
        if status.phase is AttemptPhase.RUNNING:
            if attempt.state != "running":
                self.store.update_attempt(job.id, attempt.number, state="running")
            if job.state is JobState.STARTING:
                self._try_transition(job, JobState.RUNNING, f"attempt {attempt.number} running")
            return
        reason = status.reason or status.phase.value
        limit_reason = attempt.reason if attempt.reason.startswith("exceeded max_runtime") else ""
        kept = attempt.reason if attempt.reason.startswith(PREEMPTED) else limit_reason
        self.store.update_attempt(
            job.id,
            attempt.number,
            state=status.phase.value,
            exit_code=status.exit_code,
            reason=kept or reason,
            finished=True,
        )
        if status.phase is AttemptPhase.SUCCEEDED:
            self._try_transition(job, JobState.SUCCEEDED, f"attempt {attempt.number} succeeded")
        elif attempt.reason.startswith(PREEMPTED) and not job.cancel_requested:
            self._try_transition(
                job,
                JobState.PENDING,
                f"{attempt.reason}; requeued, resumes from its last checkpoint",
                placement={},
            )
        elif limit_reason:
            self._try_transition(job, JobState.FAILED, limit_reason)
        elif job.cancel_requested or status.phase is AttemptPhase.CANCELLED:
            self._try_transition(job, JobState.CANCELLED, "cancelled by the user")
        else:
            self._fail_or_retry(job, attempt.number, f"attempt {attempt.number}: {reason}")

    def _fail_or_retry(self, job: JobRecord, number: int, reason: str) -> None:
        spec = JobSpec.model_validate(job.spec)
        fresh = self.store.get_job(job.id)
        if fresh.restarts < spec.restart.max_restarts:
            left = spec.restart.max_restarts - fresh.restarts - 1
            self._try_transition(
                fresh,
                JobState.RESTARTING,
                f"{reason}; restarting from the last checkpoint in {spec.restart.backoff:g}s "
                f"({left} restart(s) left)",
            )
        else:
            self._try_transition(
                fresh,
                JobState.FAILED,
                f"{reason}; no restarts left (max_restarts={spec.restart.max_restarts})",
            )

    # ---- helpers ---------------------------------------------------------------------------

    def _current_attempt(self, job: JobRecord) -> AttemptRecord | None:
        if job.attempts == 0:
            return None
        return self.store.get_attempt(job.id, job.attempts)

    def _try_transition(self, job: JobRecord, to: JobState, reason: str, **fields: object) -> bool:
        try:
            self.store.transition(job.id, to, reason=reason, expected=[job.state], **fields)
        except Conflict as exc:
            log.info("job %s: skipped %s -> %s (%s)", job.id, job.state, to, exc)
            return False
        return True
