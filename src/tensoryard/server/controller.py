"""The control loop: schedule pending jobs, launch admitted ones, reconcile running attempts.

One `cycle()` reads top to bottom as numbered phases. The loop works from an in-memory index
of unfinished jobs (loaded once, then only the rows that changed since the last look), so an
idle cycle costs one small query however many jobs wait. Every state change is one store
transaction (compare-and-set), written *before* the side effect it stands for:

- a launch is recorded as an attempt with its key and handle (job -> STARTING) before the
  executor starts anything, and the executor's launch is idempotent per key, so a crash at any
  point is repaired by launching again;
- an attempt's end and its job's move are one transaction;
- after a restart (or when a replica takes the lead) `recover()` kills and closes every stray
  attempt by key and repairs every job whose attempt ended without it.

docs/state-machine.md lists the states and the invariants the tests check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tensoryard.errors import (
    Conflict,
    ExecutorError,
    FencedOut,
    NotFound,
    StoreError,
    TensoryardError,
)
from tensoryard.executors.base import (
    CONFIG_EXIT_CODE,
    AttemptPhase,
    AttemptStatus,
    Executor,
    LaunchRequest,
)
from tensoryard.observability.nccl import nccl_debug_env
from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.registry.pruning import CheckpointPruner, job_checkpoint_root
from tensoryard.registry.service import ModelRegistry
from tensoryard.runtime.megatron import SAVE_ENV as MEGATRON_SAVE_ENV
from tensoryard.runtime.megatron import launch_command, recognise
from tensoryard.runtime.stacks import summarize as summarize_stacks
from tensoryard.server.auth import derive_job_token
from tensoryard.server.config import ServerConfig
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.isolation import JobGuard
from tensoryard.server.control.leadership import Leadership
from tensoryard.server.control.rules import (
    DRAINED,
    HUNG,
    MAX_RUNTIME,
    NOT_STARTED,
    PREEMPTED,
    SCHEDULER_STATE_KEY,
    BadJobData,
    CapacityProvider,
    NodeSync,
    current_attempt,
    drained_node,
    in_place_restarts,
    is_drain,
    utc,
)
from tensoryard.server.faults import crashpoint
from tensoryard.server.metrics import LoopMetrics
from tensoryard.server.pipelines import PipelineAdvancer
from tensoryard.server.scheduling import (
    EXCLUDE_AFTER_FAILURES,
    ClusterView,
    CorePolicy,
    NodeCapacity,
    Preemption,
    nodes_to_avoid,
    replacement_placement,
)
from tensoryard.server.secrets import SecretStore
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import ACTIVE_STATES, TERMINAL_STATES, JobState
from tensoryard.store import AttemptRecord, JobRecord, NodeRecord, Store

__all__ = ["PREEMPTED", "BadJobData", "CapacityProvider", "Controller", "NodeSync"]

log = logging.getLogger("tensoryard.controller")

_HEALTH_CHECK_EVERY_S = 5.0
# After killing a hung attempt's workers for an in-place restart: how long the restarted
# workers have to report before the attempt is stopped the ordinary way.
_IN_PLACE_WAIT_S = 120.0
_STATE_SAVE_EVERY_S = 30.0
_ETA_SLACK_S = 60.0
_SLOW_CYCLE_S = 1.0  # a cycle slower than this is logged with its phases
_PENDING_WRITES_PER_CYCLE = 500
_PIPELINES_EVERY_S = 1.0  # pipelines are advanced at least this often (API on another replica)
_NODES_READ_EVERY_S = 1.0  # cordon/drain changes come from the API; read them this often


def _eta_moved(old: datetime | None, new: datetime | None) -> bool:
    """Whether a new start estimate is worth a write: known/unknown changed, or it moved by
    more than a minute (estimates drift with the clock; 20k rewrites a cycle would not do)."""
    if old is None or new is None:
        return old is not new
    return abs((new - old).total_seconds()) > _ETA_SLACK_S


class _PhaseTimer:
    """Wall time per phase of one cycle, for the slow-cycle log line."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] = time.perf_counter() - started

    def total(self) -> float:
        return sum(self.times.values())

    def __str__(self) -> str:
        return ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in self.times.items())


@dataclass
class _Memory:
    """What the controller remembers between cycles (rebuilt from the store after a restart)."""

    cancel_sent: set[tuple[int, int]] = field(default_factory=set)  # (job, attempt)
    warned: set[tuple[int, int, str]] = field(default_factory=set)
    poll_failing_since: dict[tuple[int, int], float] = field(default_factory=dict)
    health_checked: dict[tuple[int, int], float] = field(default_factory=dict)
    starting_reason: dict[tuple[int, int], str] = field(default_factory=dict)
    # External admission (Kueue): when a poll last saw the attempt waiting in its queue; the
    # starting timeout counts from there (absent: not polled since this process started).
    queued_seen: dict[tuple[int, int], float] = field(default_factory=dict)
    admitted_noted: set[tuple[int, int]] = field(default_factory=set)  # admitted_at written
    # A hung attempt whose workers were killed for torchrun to restart them in place: when.
    in_place_kills: dict[tuple[int, int], float] = field(default_factory=dict)
    stacks_dumped: set[tuple[int, int]] = field(default_factory=set)  # hung attempts asked
    # job -> (its attempt count when computed, the nodes its next placement avoids, why)
    avoid: dict[int, tuple[int, frozenset[str], str]] = field(default_factory=dict)
    # node -> when an attempt's executor reported it lost: closed to placement until the
    # capacity view has caught up (it is cached and fed by its own watch, a moment behind).
    lost_nodes: dict[str, float] = field(default_factory=dict)


# How long a node an executor reported lost stays closed when the capacity view never shows
# it closed (it came back at once, or the view cannot see readiness).
LOST_NODE_HOLD_S = 60.0


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
        job_key: str = "",
        clock: Callable[[], float] = time.time,
        holder: str | None = None,
        secrets: SecretStore | None = None,
        metrics: LoopMetrics | None = None,
        node_sync: NodeSync | None = None,
    ) -> None:
        holder = holder or f"{uuid.uuid4().hex[:8]}"
        store.replica = store.replica or holder  # every event names its writer
        self.metrics = metrics or LoopMetrics(CollectorRegistry())
        # The lease is taken and renewed through the plain store; everything else the loop
        # writes goes through the fenced view: a deposed leader can change no row
        # (docs/state-machine.md, "Fencing").
        self.leadership = Leadership(
            lease_store=store, holder=holder, config=config, clock=clock, metrics=self.metrics
        )
        self.store = store.fenced(self.leadership.fence_token, on_fenced=self.leadership.fenced_out)
        self.node_sync = node_sync
        self.executor = executor
        self.policy = policy
        self.capacity = capacity
        self.config = config
        self.clock = clock
        self.job_key = job_key or uuid.uuid4().hex
        self.secrets = secrets or SecretStore(config.secrets_dir)
        self._node_shape: tuple[tuple[str, bool, str], ...] = ()  # nodes at the last check
        self._mem = _Memory()
        self._jobs = JobIndex(self.store, clock)
        self._guard = JobGuard(store=self.store, executor=executor, index=self._jobs)
        self._schedule_cost_s = 0.0
        self._last_schedule = 0.0
        self._wake_at: float | None = None  # the last pass's Decisions.wake_at
        self._pending_info: dict[int, tuple[str, datetime | None]] = {}
        self._restart_notes: dict[tuple[int, int], str] = {}  # (job, attempts) -> note
        self._last_state_save = 0.0
        self._node_states: dict[str, NodeRecord] = {}
        self._nodes_read = float("-inf")
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._in_flight: set[tuple[int, int]] = set()
        self._flight_lock = threading.Lock()
        workers = config.launch_workers
        self._pool = ThreadPoolExecutor(workers, "tyard-launch") if workers > 0 else None
        self.pipelines = PipelineAdvancer(
            self.store,
            runs_dir=config.runs_dir,
            registry=ModelRegistry(
                self.store,
                ArtifactStore(open_blobs(config.artifact_store_url)),
                protected=(config.home,),
            ),
        )
        self._pipelines_due = True
        self._last_pipelines = 0.0

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tyard-controller", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Run the next cycle now (after a submit or cancel) instead of at the next tick."""
        self._pipelines_due = True
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=False)
        if self.is_leader:
            with contextlib.suppress(TensoryardError):
                self._save_scheduler_state(force=True)
            self.leadership.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.lead():
                    self.cycle()
            except FencedOut as exc:  # another replica leads now: stepped down already
                log.warning("control cycle stopped: %s", exc)
            except Exception:  # the loop must survive anything; the next cycle retries
                log.exception("control cycle failed")
            self._wake.wait(self.config.loop_interval_s)
            self._wake.clear()

    def lead(self) -> bool:
        """Take or renew the leader lease; on taking it, recover. False while another leads."""
        leading, took = self.leadership.lead()
        if took:
            self.recover()
        return leading

    def check_fence(self) -> None:
        """FencedOut unless this replica still holds the lease (see Leadership.check_fence)."""
        self.leadership.check_fence()

    def leading_now(self) -> bool:
        """What /healthz reports (see Leadership.leading_now)."""
        return self.leadership.leading_now()

    @property
    def holder(self) -> str:
        return self.leadership.holder

    @holder.setter
    def holder(self, value: str) -> None:
        self.leadership.holder = value

    @property
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    @property
    def epoch(self) -> int | None:
        return self.leadership.epoch

    def recover(self) -> None:
        """After a (re)start or a change of leader: rebuild memory from the store, close and
        kill stray attempts by key, and repair every job whose attempt ended without it."""
        self._mem = _Memory()
        self._jobs.reset()
        self._guard.reset()
        self._pending_info = {}
        self._pipelines_due = True
        self._nodes_read = float("-inf")
        self.store.register_nodes(n.name for n in self.capacity())
        self._load_scheduler_state()
        self._finish_checkpoint_removals()
        for job, attempt in self.store.stray_attempts():
            self._guard.run(job.id, self._close_stray, job, attempt)
        self._refresh()
        attempts = self.store.current_attempts()
        for job in list(self._jobs.jobs.values()):
            current = attempts.get(job.id)
            if current is None or job.state not in (JobState.STARTING, JobState.RUNNING):
                continue
            if current.finished_at is not None:
                self._guard.run(job.id, self._repair_finished, job, current)
            else:
                self.store.add_event(
                    job.id,
                    "recovery",
                    f"control plane restarted or took the lead; attempt {current.number} is "
                    f"{current.state}: re-attaching",
                    attempt=current.number,
                )

    def _finish_checkpoint_removals(self) -> None:
        """Delete the checkpoint directories retention had retired when a crash stopped it."""
        try:
            finished = CheckpointPruner(self.store).finish_pending()
        except TensoryardError as exc:  # retried at the next recovery; never blocks the loop
            log.warning("retention: cannot finish pending checkpoint removals: %s", exc)
            return
        if finished:
            log.info("retention: finished %d checkpoint removals a restart interrupted", finished)

    def _close_stray(self, job: JobRecord, attempt: AttemptRecord) -> None:
        killed = 0
        if attempt.handle:
            self.check_fence()
            with contextlib.suppress(TensoryardError):
                killed = self.executor.terminate(attempt.handle)
        why = (
            f"found unfinished after a restart while the job is {job.state.value}"
            + (f" at attempt {job.attempts}" if job.attempts != attempt.number else "")
            + f"; killed {killed} process(es) by its key"
        )
        self.store.finish_attempt(job.id, attempt.number, state="lost", reason=why)
        self.store.add_event(job.id, "recovery", f"attempt {attempt.number} {why}", attempt=None)

    def _repair_finished(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """An attempt ended but its job was not moved (a crash between two old transactions)."""
        try:
            phase = AttemptPhase(attempt.state)
        except ValueError:
            phase = AttemptPhase.LOST
        status = AttemptStatus(phase, attempt.exit_code, attempt.reason)
        to, why = self._next_state(job, attempt, status)
        if to is JobState.RESTARTING and job.restarts >= self._jobs.spec(job).restart.max_restarts:
            to = JobState.FAILED
        self.store.add_event(
            job.id,
            "recovery",
            f"attempt {attempt.number} had ended ({attempt.state}) but the job was still "
            f"{job.state.value}: moving it to {to.value}",
            attempt=attempt.number,
        )
        self._jobs.put(self.store.transition(job.id, to, reason=why, expected=[job.state]))

    # ---- one cycle -------------------------------------------------------------------------

    def cycle(self) -> None:
        """One pass: the numbered phases below, each idempotent."""
        with self._lock:
            now = self.clock()
            timer = _PhaseTimer()
            # 0a. Read what changed since the last cycle into the index.
            with timer("refresh"):
                self._refresh()
            # 0b. Advance pipelines when a job changed, on a kick, or every second: record
            #     finished steps, submit the jobs of ready ones (stored like any job; the next
            #     cycle's refresh picks them up for scheduling).
            with timer("pipelines"):
                self._advance_pipelines(now)
            # 1. Cancel requests for jobs that never started end at once.
            with timer("cancel"):
                self._cancel_pending()
            # 2. Reconcile running attempts with what the executor sees (frees ended slots).
            with timer("reconcile"):
                self._reconcile(now)
            # 2b. Move jobs off draining nodes (checkpoint signal, then requeue).
            with timer("drain"):
                self._drain(now)
            # 2c. Mirror the cordon states onto the executor's nodes (the Kubernetes Node:
            #     unschedulable + taint); the stored state is the intent, this repairs drift.
            if self.node_sync is not None:
                with timer("node-sync"):
                    self._sync_nodes(now)
            # 3. Schedule: snapshot -> policy -> admissions and pending reasons.
            if self._schedule_due(now):
                with timer("schedule"):
                    self._schedule(now)
            # 4. Launch admitted jobs and restarts whose backoff has passed (in the background).
            with timer("launch"):
                self._launch_ready(now)
            # 5. Write the pending reasons and start estimates (after the launches: a deep
            #    backlog's reasons must not delay the job that just got a slot).
            with timer("pending-info"):
                self._write_pending_info()
            self._save_scheduler_state()
            self.leadership.cycle_done = self.clock()
            if timer.total() > _SLOW_CYCLE_S:
                log.warning("slow control cycle (%d unfinished jobs): %s", len(self._jobs), timer)

    # 0 ------------------------------------------------------------------------------------
    def _advance_pipelines(self, now: float) -> None:
        if not self._pipelines_due and 0 <= now - self._last_pipelines < _PIPELINES_EVERY_S:
            return  # an idle cycle costs no pipeline query
        self._pipelines_due, self._last_pipelines = False, now
        try:
            if self.pipelines.advance():
                self._wake.set()  # a step's job was just stored: schedule it without a tick
        except StoreError:  # the database hiccuped: jobs go on, the next pass retries
            self._pipelines_due = True
            log.exception("advancing pipelines failed")

    def _refresh(self) -> None:
        if self._jobs.refresh():
            self._pipelines_due = True  # a step's job may have ended

    # 1 ------------------------------------------------------------------------------------
    def _cancel_pending(self) -> None:
        for job_id in list(self._jobs.cancel_requested):
            job = self._jobs.get(job_id)
            if job is not None and job.state is JobState.PENDING:
                self._jobs.try_transition(job, JobState.CANCELLED, "cancelled before it started")

    # 2 ------------------------------------------------------------------------------------
    def _reconcile(self, now: float) -> None:
        live = self._jobs.in_states(JobState.STARTING, JobState.RUNNING)
        if not live:
            return
        attempts = self.store.current_attempts()
        for job in live:
            attempt = attempts.get(job.id)
            if attempt is None or attempt.finished_at is not None:
                continue
            if attempt.state == "launching":
                continue  # phase 3 (re)launches it
            self._guard.run(job.id, self._reconcile_one, job, attempt, now)

    def _reconcile_one(self, job: JobRecord, attempt: AttemptRecord, now: float) -> None:
        key = (job.id, attempt.number)
        if job.cancel_requested and key not in self._mem.cancel_sent:
            self._stop_attempt(
                job, attempt, "", "cancel requested by the user", self.config.cancel_grace_s
            )
        if key not in self._mem.cancel_sent:
            self._enforce_limits(job, attempt, now)
        try:
            status: AttemptStatus | None = self.executor.poll(attempt.handle)
        except TensoryardError as exc:
            status = self._poll_failed(job, attempt, now, exc)
        else:
            self._mem.poll_failing_since.pop(key, None)
        if status is not None and not status.finished and job.placement:
            silent = {n: why for n, why in self._silent_nodes(now).items() if n in job.placement}
            if silent and key not in self._mem.cancel_sent:
                status = self._end_on_lost_nodes(job, attempt, silent)
        if status is not None:
            if getattr(self.executor, "external_admission", False) and (
                status.queued or key not in self._mem.queued_seen
            ):
                self._mem.queued_seen[key] = now
            self._apply_status(job, attempt, status)

    def _end_on_lost_nodes(
        self, job: JobRecord, attempt: AttemptRecord, lost: Mapping[str, str]
    ) -> AttemptStatus:
        """The attempt has ranks on nodes the control plane takes as lost (their agents went
        silent): its processes are killed by key (a lost node cannot checkpoint) and it fails
        with those nodes, so the restart leaves them (a spare, or a wait for them)."""
        reason = "; ".join(lost[n] for n in sorted(lost))
        self.store.add_event(job.id, "warning", reason, attempt=attempt.number)
        self.check_fence()
        with contextlib.suppress(TensoryardError):
            self.executor.terminate(attempt.handle)
        return AttemptStatus(AttemptPhase.FAILED, None, reason, lost_nodes=tuple(sorted(lost)))

    def _poll_failed(
        self, job: JobRecord, attempt: AttemptRecord, now: float, exc: Exception
    ) -> AttemptStatus | None:
        """A transient poll error is not a verdict: wait, then kill by key and declare LOST."""
        key = (job.id, attempt.number)
        since = self._mem.poll_failing_since.setdefault(key, now)
        if since == now:
            self.store.add_event(
                job.id,
                "warning",
                f"cannot poll attempt {attempt.number} ({exc}); retrying for "
                f"{self.config.poll_failure_grace_s:g}s before giving it up",
                attempt=attempt.number,
            )
        if now - since < self.config.poll_failure_grace_s:
            return None
        killed = 0
        self.check_fence()
        with contextlib.suppress(TensoryardError):
            killed = self.executor.terminate(attempt.handle)
        self._mem.poll_failing_since.pop(key, None)
        return AttemptStatus(
            AttemptPhase.LOST,
            reason=f"could not be polled for {now - since:.0f}s ({exc}); "
            f"killed {killed} process(es) by its key",
        )

    def _stop_attempt(
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
        self._mem.cancel_sent.add((job.id, attempt.number))
        if reason:
            self.store.update_attempt(job.id, attempt.number, reason=reason)
        self.store.add_event(
            job.id,
            kind,
            f"{message}: SIGTERM, SIGKILL after {grace_s:g}s",
            attempt=attempt.number,
        )
        self.check_fence()
        try:
            self.executor.cancel(attempt.handle, grace_s=grace_s)
        except TensoryardError as exc:
            self.store.add_event(job.id, "error", f"stop failed: {exc}", attempt=attempt.number)

    def _enforce_limits(self, job: JobRecord, attempt: AttemptRecord, now: float) -> None:
        spec = self._jobs.spec(job)
        grace = self.config.cancel_grace_s
        if attempt.state == "starting":
            since = attempt.started_at.timestamp()
            if getattr(self.executor, "external_admission", False):
                seen = self._mem.queued_seen.get((job.id, attempt.number))
                if seen is None:
                    return  # not polled since this process started: the next cycle decides
                since = max(since, seen)
            waited = now - since
            if waited > self.config.starting_timeout_s:
                why = f"{NOT_STARTED} within {self.config.starting_timeout_s:g}s"
                self._stop_attempt(job, attempt, why, why, grace)
            return
        limit = spec.max_runtime
        if limit is not None and attempt.running_at is not None:
            ran = job.run_time_s + now - attempt.running_at.timestamp()
            if ran > limit:
                why = f"{MAX_RUNTIME} of {limit:g}s (ran {ran:.0f}s over all attempts)"
                self._stop_attempt(job, attempt, why, why, grace)
                return
        self._check_health(job, attempt, spec, now)

    def _check_health(
        self, job: JobRecord, attempt: AttemptRecord, spec: JobSpec, now: float
    ) -> None:
        """Hung: no heartbeat for the timeout, or no step for stall_factor x the median step
        time (at least min_stall). Then stop (SIGTERM, SIGKILL after the hang grace) and
        restart."""
        key = (job.id, attempt.number)
        if now - self._mem.health_checked.get(key, 0.0) < _HEALTH_CHECK_EVERY_S:
            return
        self._mem.health_checked[key] = now
        killed_at = self._mem.in_place_kills.get(key)
        if killed_at is not None and now - killed_at < _IN_PLACE_WAIT_S:
            return  # its workers are being restarted in place; they report as a new attempt
        health = spec.health
        why = ""
        beat_limit = health.heartbeat_timeout or self.config.heartbeat_timeout_s
        # Only jobs that use the runtime send heartbeats: silence counts once one arrived.
        beat = self.store.get_attempt(job.id, attempt.number).last_heartbeat
        if beat is not None and now - beat.timestamp() > beat_limit:
            why = f"{HUNG}: no heartbeat for {now - beat.timestamp():.0f}s (limit {beat_limit:g}s)"
        else:
            progress = self.store.step_progress(job.id, attempt.number)
            if progress.steps >= 3 and progress.median_step_s and progress.last_ts is not None:
                limit = max(health.stall_factor * progress.median_step_s, health.min_stall)
                silent = now - progress.last_ts
                if silent > limit:
                    why = (
                        f"{HUNG}: no step for {silent:.0f}s after step {progress.last_step} "
                        f"({health.stall_factor:g}x the median step time of "
                        f"{progress.median_step_s:.2f}s, at least {health.min_stall:g}s)"
                    )
        if not why:
            return
        self._dump_stacks(job, attempt)
        if health.on_hang == "warn":
            if (job.id, attempt.number, why[:20]) not in self._mem.warned:
                self._mem.warned.add((job.id, attempt.number, why[:20]))
                self.store.add_event(job.id, "warning", why, attempt=attempt.number)
            return
        if self._restart_hung_in_place(job, attempt, spec, why, now):
            return
        # A hung gang cannot checkpoint (its ranks wait in a collective): the short hang grace,
        # not the cancel grace, before SIGKILL; the restart resumes from the last checkpoint.
        grace = min(health.hang_grace, self.config.cancel_grace_s)
        self._stop_attempt(job, attempt, why, f"{why}; restarting", grace)

    def _dump_stacks(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Once per hung attempt, before anything is killed: where each rank waits (the
        executor signals the ranks that enabled dumps; tensoryard.runtime.stacks), as an
        event. Executors without the means (a pod's processes) skip it."""
        dump = getattr(self.executor, "dump_stacks", None)
        key = (job.id, attempt.number)
        if dump is None or key in self._mem.stacks_dumped:
            return
        self._mem.stacks_dumped.add(key)
        try:
            texts: dict[int, str | None] = dump(attempt.handle)
        except (TensoryardError, OSError) as exc:
            log.warning("job %s: stack dump of attempt %s failed: %s", job.id, attempt.number, exc)
            return
        if not texts:
            return
        where = "; ".join(summarize_stacks(rank, text) for rank, text in sorted(texts.items()))
        self.store.add_event(
            job.id,
            "warning",
            f"hung attempt {attempt.number}, where the ranks are: {where} (full stacks: "
            f"rank-R.stacks.txt in the attempt's directory)",
            attempt=attempt.number,
        )

    def _in_place_left(self, job: JobRecord, attempt: AttemptRecord, spec: JobSpec) -> int:
        """In-place restarts still granted to this attempt's launch. Its in-place attempts
        are numbered right after it, so it has used ``number - launch`` of them."""
        used = attempt.number - (attempt.launch_attempt or attempt.number)
        granted = in_place_restarts(spec, restarts=job.restarts - used)  # as at its launch
        return max(0, granted - used)

    def _restart_hung_in_place(
        self, job: JobRecord, attempt: AttemptRecord, spec: JobSpec, why: str, now: float
    ) -> bool:
        """Kill a hung attempt's workers (not its launcher) when its launch has in-place
        restarts left: torchrun starts them again from the last checkpoint on the same
        allocation, much sooner than a new launch. False: stop it the ordinary way."""
        key = (job.id, attempt.number)
        restart = getattr(self.executor, "restart_workers", None)
        if restart is None or key in self._mem.in_place_kills:
            return False
        if self._in_place_left(job, attempt, spec) <= 0:
            return False
        self._mem.in_place_kills[key] = now
        self.store.update_attempt(job.id, attempt.number, reason=why)  # the reason, first
        try:
            killed = int(restart(attempt.handle))
        except TensoryardError as exc:
            self.store.add_event(
                job.id, "error", f"in-place restart failed: {exc}", attempt=attempt.number
            )
            return False
        if killed == 0:
            return False  # no worker to kill: the launcher itself is stuck
        self.store.add_event(
            job.id,
            "restart",
            f"{why}; killed its {killed} worker(s) for torchrun to restart them in place "
            "from the last checkpoint",
            attempt=attempt.number,
        )
        return True

    def _apply_status(self, job: JobRecord, attempt: AttemptRecord, status: AttemptStatus) -> None:
        key = (job.id, attempt.number)
        if (
            status.admitted_at is not None
            and attempt.admitted_at is None
            and key not in self._mem.admitted_noted
        ):
            # Kueue granted the resources: the wait before is queueing (goodput); written once
            when = datetime.fromtimestamp(status.admitted_at, UTC)
            with contextlib.suppress(NotFound):
                self.store.update_attempt(job.id, attempt.number, admitted_at=when)
            self._mem.admitted_noted.add(key)
        if status.phase is AttemptPhase.STARTING:
            self._note_starting_reason(job, attempt, status.reason, queued=status.queued)
            return
        if status.phase is AttemptPhase.RUNNING:
            if attempt.state != "running" or job.state is JobState.STARTING:
                crashpoint("running.before_mark")
                how = f" ({status.reason})" if status.reason else ""
                with contextlib.suppress(Conflict):  # it ended meanwhile: the next poll says so
                    self._jobs.put(
                        self.store.mark_running(
                            job.id, attempt.number, f"attempt {attempt.number} running{how}"
                        )
                    )
            return
        crashpoint("finish.before")
        to, why = self._next_state(job, attempt, status)
        if to is JobState.RESTARTING:
            to, why = self._retry_or_fail(job, why)
        # The stop reason we recorded (preempted, limit, hang) is the attempt's reason.
        reason = attempt.reason or status.reason or status.phase.value
        moved, avoided, swap_event = "", frozenset[str](), ""
        lost = frozenset[str]()
        if to is JobState.RESTARTING:  # a node where this job failed twice: placed elsewhere
            avoided, moved = self._avoid_after(job, attempt, status.phase.value, reason)
            # A node that is lost, NotReady, cordoned or draining now is left at once, on the
            # first failure it caused: a restart there would wait for a node that is not there.
            lost = self._unusable_placement(job, status) - avoided
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
            swapped = self._replace_nodes(job, gone)
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
        try:
            record = self.store.finish_attempt(
                job.id,
                attempt.number,
                state=status.phase.value,
                exit_code=status.exit_code,
                reason=reason,
                job_to=to,
                job_reason=why,
                expected=[job.state],
                count_restart=count_restart,
                **({"placement": placement} if placement is not None else {}),
            )
        except Conflict as exc:
            log.info("job %s: attempt end not applied yet (%s)", job.id, exc)
            self._jobs.triggers.dirty = True
            return
        crashpoint("finish.after")
        if swap_event:  # after the change it describes (the state event says it too)
            self.store.add_event(job.id, "recovery", swap_event, attempt=attempt.number)
        self._jobs.put(record)
        self._mem.starting_reason.pop((job.id, attempt.number), None)
        self._mem.queued_seen.pop((job.id, attempt.number), None)
        self._mem.admitted_noted.discard((job.id, attempt.number))
        self._mem.in_place_kills.pop((job.id, attempt.number), None)
        self._mem.stacks_dumped.discard((job.id, attempt.number))
        if to in (JobState.RESTARTING, JobState.PENDING):
            self.metrics.restarted(job, attempt.reason or why)
        self._mem.cancel_sent.discard((job.id, attempt.number))
        if to is JobState.SUCCEEDED:  # the run-time estimator learns from finished jobs
            self.policy.observe_finished_job(record, record.run_time_s)
        if to in TERMINAL_STATES:
            self.store.revoke_job_token(job.id)

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
        if not reason or self._mem.starting_reason.get(key) == seen:
            return
        self._mem.starting_reason[key] = seen
        self.store.add_event(
            job.id,
            "queue" if queued else "warning",
            f"attempt {attempt.number} not running yet: {reason}",
            attempt=attempt.number,
        )

    def _next_state(
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

    def _retry_or_fail(self, job: JobRecord, reason: str) -> tuple[JobState, str]:
        spec = self._jobs.spec(job)
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
        latest = self.store.latest_checkpoint(job.id)
        return f"step {latest.step}" if latest is not None else "none yet: from the start"

    def _restarting_note(self, job: JobRecord) -> str:
        """What a requeued job is doing, before the scheduler's why-pending: "restarting
        attempt 3 from step 1200 after attempt 2 ended (node n2 deleted ...)". Read once per
        requeue (the checkpoint does not move while no attempt runs)."""
        key = (job.id, job.attempts)
        note = self._restart_notes.get(key)
        if note is None:
            cause = re.sub(r"^attempt \d+: ", "", job.reason)
            cause = re.split(r"; (?:requeued|restarting from)", cause)[0]
            waiting = job.reason.partition("; requeued: ")[2]  # "waiting for a node to ..."
            latest = self.store.latest_checkpoint(job.id)
            start = f"from step {latest.step}" if latest is not None else "from the start"
            note = (
                f"restarting attempt {job.attempts + 1} {start} after attempt {job.attempts} "
                f"ended ({cause})" + (f", {waiting}" if waiting else "")
            )
            if len(self._restart_notes) > 10_000:  # jobs long gone; cheap to read again
                self._restart_notes.clear()
            self._restart_notes[key] = note
        return note

    # 2b -----------------------------------------------------------------------------------
    def _read_nodes(self, now: float) -> dict[str, NodeRecord]:
        """The stored node states, re-read at most every `_NODES_READ_EVERY_S`."""
        if now - self._nodes_read >= _NODES_READ_EVERY_S or now < self._nodes_read:
            previous = self._node_states
            self._node_states = {n.name: n for n in self.store.list_nodes()}
            new = [n.name for n in self.capacity() if n.name not in self._node_states]
            if new:  # the executor found nodes since the loop took the lead
                self.store.register_nodes(new)
                self._node_states = {n.name: n for n in self.store.list_nodes()}
            self._nodes_read = now
            if any(
                previous.get(n) is None or previous[n].state != r.state
                for n, r in self._node_states.items()
            ):
                self._jobs.triggers.urgent = True  # capacity appeared or vanished: schedule at once
        return self._node_states

    def _silent_nodes(self, now: float) -> dict[str, str]:
        """node -> why, for the nodes whose agent reported once and has been silent longer
        than the agent heartbeat timeout (local executor only: Kubernetes and Slurm see their
        nodes themselves). Such a node is lost: closed to placements, its attempts ended."""
        timeout = self.config.agent_heartbeat_timeout_s
        if not timeout or self.config.executor != "local":
            return {}
        out = {}
        for name, record in self._read_nodes(now).items():
            beat = record.heartbeat_at
            if beat is not None and now - beat.timestamp() > timeout:
                since = beat.astimezone(UTC).strftime("%H:%M:%S")
                out[name] = (
                    f"node {name} lost: its agent has not reported since {since} UTC "
                    f"(--agent-heartbeat-timeout {timeout:g}s)"
                )
        return out

    def _nodes(self, now: float) -> tuple[NodeCapacity, ...]:
        """The executor's capacity with each node's cordon state from the store, and the
        nodes an executor just reported lost (or whose agent fell silent) closed until the
        capacity view shows it too."""
        states = self._read_nodes(now)
        silent = self._silent_nodes(now)
        nodes = tuple(
            dataclasses.replace(n, state=states[n.name].state) if n.name in states else n
            for n in self.capacity()
        )
        if silent:
            nodes = tuple(
                dataclasses.replace(n, cordoned=True, condition=silent[n.name])
                if n.name in silent
                else n
                for n in nodes
            )
        lost = self._mem.lost_nodes
        if not lost:
            return nodes
        seen = {n.name: n for n in nodes}
        for name, at in list(lost.items()):
            node = seen.get(name)
            if node is None or node.cordoned or now - at > LOST_NODE_HOLD_S:
                del lost[name]  # the view has it (or it is gone from the view): it decides
        return tuple(dataclasses.replace(n, cordoned=True) if n.name in lost else n for n in nodes)

    def _drain(self, now: float) -> None:
        """Jobs placed on a draining node: a running attempt gets the checkpoint signal (its
        job is then requeued, see `_next_state`); a job admitted or waiting to restart there
        goes back to PENDING at once. Idempotent: a stopped attempt is not signalled again."""
        draining = {n: r for n, r in self._read_nodes(now).items() if r.state == "draining"}
        if not draining:
            return
        active = self._jobs.in_states(
            JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING
        )
        for job in active:
            node = next((n for n in job.placement if n in draining), None)
            if node is not None and not job.cancel_requested:
                why = f"node {node}{DRAINED}{draining[node].reason}"
                self._guard.run(job.id, self._drain_job, job, why)

    def _sync_nodes(self, now: float) -> None:
        assert self.node_sync is not None
        try:
            self.node_sync(self._read_nodes(now))
        except (TensoryardError, OSError):  # the sync logs its own; never stop the loop
            log.exception("mirroring node cordon states failed; retrying next cycle")

    def _drain_job(self, job: JobRecord, why: str) -> None:
        if job.state in (JobState.ADMITTED, JobState.RESTARTING):
            if self._jobs.try_transition(
                job,
                JobState.PENDING,
                f"{why}; requeued, resumes from its last checkpoint on another node",
                placement={},
            ):
                self.store.add_event(job.id, "drain", why)
            return
        attempt = current_attempt(self.store, job)
        if attempt is None or attempt.finished_at is not None or attempt.state == "launching":
            return  # phase 4 (re)launches it; the next cycle signals it
        if (job.id, attempt.number) in self._mem.cancel_sent:
            return  # after a restart the signal is sent once more: SIGTERM twice is harmless
        self._stop_attempt(
            job,
            attempt,
            why,
            f"{why}; checkpointing, then requeued",
            self.config.cancel_grace_s,
            kind="drain",
        )

    # 3 ------------------------------------------------------------------------------------
    def _schedule_due(self, now: float) -> bool:
        """At once when capacity came free; after other changes (new submissions) at most
        every few times the last pass's duration, so a stream of submissions to a deep
        backlog cannot keep the scheduler (and the GIL) busy; and every
        `reschedule_interval_s` regardless (ETAs, aging); and when the last pass said its
        answer changes with time alone (a borrower became reclaimable)."""
        since = now - self._last_schedule
        if self._jobs.triggers.urgent or since >= self.config.reschedule_interval_s:
            return True
        shape = tuple((n.name, n.cordoned, n.state) for n in self._nodes(now))
        if shape != self._node_shape:  # a node came, went, or changed readiness: at once
            self._node_shape = shape
            return True
        if self._wake_at is not None and now >= self._wake_at:
            return True
        # 4x the last pass bounds the scheduler's share of the loop to a fifth under a stream
        # of submissions; the 20 ms floor only keeps cheap passes from running back to back
        # (a floor of a loop tick, 250 ms, added that much to a submission's start).
        gap = min(max(4 * self._schedule_cost_s, 0.02), 5.0)
        return self._jobs.triggers.dirty and since >= gap

    def _schedule(self, now: float) -> None:
        started = time.perf_counter()
        try:
            self._schedule_pass(now)
        finally:
            self._schedule_cost_s = time.perf_counter() - started
            self.metrics.cycle_seconds.observe(self._schedule_cost_s)

    def _avoid_after(
        self, job: JobRecord, attempt: AttemptRecord, state: str, reason: str
    ) -> tuple[frozenset[str], str]:
        """When ending ``attempt`` this way makes nodes of the job's placement ones where two
        of its attempts failed, and the job fits elsewhere: those nodes, and why it goes back
        to the queue (the scheduler then avoids them); empty to restart as usual."""
        history = [
            dataclasses.replace(a, state=state, reason=reason) if a.number == attempt.number else a
            for a in self.store.list_attempts(job.id)
        ]
        avoid, why = nodes_to_avoid(history, self._nodes(self.clock()), self._jobs.spec(job))
        mine = avoid & set(job.placement)
        if not mine:
            return frozenset(), ""
        return frozenset(mine), f"requeued to be placed elsewhere: {why}"

    def _unusable_placement(self, job: JobRecord, status: AttemptStatus) -> frozenset[str]:
        """Nodes of the job's placement that its next attempt must not use: the ones the
        executor saw lost under this attempt, and any that is gone from the cluster, not
        Ready, cordoned or draining right now."""
        now = self.clock()
        for name in status.lost_nodes:
            self._mem.lost_nodes.setdefault(name, now)
        nodes = {n.name: n for n in self._nodes(now)}
        bad = set(status.lost_nodes)
        for name in job.placement:
            node = nodes.get(name)
            if node is None or node.cordoned or node.state in ("cordoned", "draining"):
                bad.add(name)
        return frozenset(bad & set(job.placement))

    def _replace_nodes(self, job: JobRecord, gone: frozenset[str]) -> dict[str, list[int]] | None:
        """The job's placement with ``gone`` swapped for spares free now (None: not enough)."""
        others = []
        for other in self._jobs.in_states(*ACTIVE_STATES):
            spec = self._jobs.specs.get(other.id) if other.id != job.id else None
            if spec is not None and other.placement:
                others.append((other.placement, spec))
        known = self._mem.avoid.get(job.id)
        return replacement_placement(
            job.placement,
            gone,
            self._jobs.spec(job),
            self._nodes(self.clock()),
            others,
            avoid=known[1] if known else frozenset(),
        )

    def _avoid_nodes(
        self, pending: list[JobRecord], nodes: tuple[NodeCapacity, ...]
    ) -> dict[int, frozenset[str]]:
        """job -> nodes its next placement avoids: where two of its attempts failed (see
        scheduling.nodes_to_avoid). Read from the attempts once per new attempt count; an
        event says so when the set changes."""
        out: dict[int, frozenset[str]] = {}
        waiting = {j.id for j in pending}
        self._mem.avoid = {k: v for k, v in self._mem.avoid.items() if k in waiting}
        for job in pending:
            if job.attempts < EXCLUDE_AFTER_FAILURES:
                continue
            known = self._mem.avoid.get(job.id)
            if known is None or known[0] != job.attempts:
                spec = self._jobs.specs.get(job.id)
                if spec is None:
                    continue
                avoid, why = nodes_to_avoid(self.store.list_attempts(job.id), nodes, spec)
                if why and (known is None or (known[1], known[2]) != (avoid, why)):
                    self.store.add_event(job.id, "placement", why)
                known = (job.attempts, avoid, why)
                self._mem.avoid[job.id] = known
            if known[1]:
                out[job.id] = known[1]
        return out

    def _schedule_pass(self, now: float) -> None:
        self._jobs.triggers.dirty = self._jobs.triggers.urgent = False
        self._last_schedule = now
        self._wake_at = None
        pending = [j for j in self._jobs.in_states(JobState.PENDING) if not j.cancel_requested]
        pending = [j for j in pending if self._guard.spec_or_quarantine(j) is not None]
        if not pending:
            return
        pending.sort(key=lambda j: (-j.priority, j.created_at, j.id))
        running = tuple(
            j
            for j in sorted(
                self._jobs.in_states(*ACTIVE_STATES), key=lambda j: (j.created_at, j.id)
            )
            if self._guard.spec_or_quarantine(j) is not None
        )
        attempts = self.store.current_attempts()
        capacity = self._nodes(now)
        view = ClusterView(
            nodes=capacity,
            teams=tuple(self.store.list_teams()),
            pending=tuple(pending),
            running=running,
            now=now,
            last_checkpoint=self._checkpoint_times(running),
            attained_s={j.id: j.run_time_s for j in (*pending, *running) if j.run_time_s},
            terminating=frozenset(
                j.id for j in running if self._terminating(j, attempts.get(j.id))
            ),
            attempt_started={
                j.id: (a.running_at or a.started_at).timestamp()
                for j in running
                if (a := attempts.get(j.id)) is not None and a.finished_at is None
            },
            specs=self._jobs.specs,
            avoid_nodes=self._avoid_nodes(pending, capacity),
        )
        decisions = self.policy.decide(view)
        self._wake_at = decisions.wake_at
        by_id = {j.id: j for j in pending}
        for admission in decisions.admissions:
            job = by_id[admission.job_id]
            nodes = ", ".join(admission.placement) or "-"
            if self._jobs.try_transition(
                job,
                JobState.ADMITTED,
                admission.reason or f"admitted on {nodes}",
                placement=admission.placement,
                pending_reason="",
                pending_eta=None,
            ):
                self.metrics.admitted(job, now)
            crashpoint("schedule.after_admit")
        running_by_id = {j.id: j for j in running}
        for preemption in decisions.preemptions:
            victim = running_by_id.get(preemption.job_id)
            if victim is not None:
                self._guard.run(victim.id, self._preempt, victim, preemption)
        for job_id, info in decisions.pending.items():
            job = by_id[job_id]
            eta = utc(round(info.eta_s)) if info.eta_s is not None else None
            reason = info.reason
            if job.attempts:  # requeued: say what happened and where it resumes, then why
                reason = f"{self._restarting_note(job)}; {reason}"
            if job.pending_reason != reason or _eta_moved(job.pending_eta, eta):
                self._pending_info[job_id] = (reason, eta)
            else:
                self._pending_info.pop(job_id, None)  # an older change not yet written

    # 5 ------------------------------------------------------------------------------------
    def _write_pending_info(self) -> None:
        """Write at most `_PENDING_WRITES_PER_CYCLE` changed reasons, oldest first: when a
        freed slot changes the reasons of a deep backlog, the loop goes on reconciling and
        launching while the rest are written over the next cycles."""
        batch = list(itertools.islice(self._pending_info.items(), _PENDING_WRITES_PER_CYCLE))
        for job_id, _ in batch:
            del self._pending_info[job_id]
        if not batch:
            return
        written, stamp = self.store.set_pending_info([(i, r, eta) for i, (r, eta) in batch])
        info = dict(batch)
        for job_id in written:
            job = self._jobs.get(job_id)
            if job is not None and job.state is JobState.PENDING:
                reason, eta = info[job_id]
                self._jobs.put(
                    dataclasses.replace(
                        job, pending_reason=reason, pending_eta=eta, changed_at=stamp
                    )
                )

    def _checkpoint_times(self, running: tuple[JobRecord, ...]) -> dict[int, float]:
        return self.store.latest_checkpoint_times([job.id for job in running])

    def _terminating(self, job: JobRecord, attempt: AttemptRecord | None) -> bool:
        """Cancelled or being stopped: still holds its resources during the grace period."""
        if job.cancel_requested:
            return True
        return attempt is not None and attempt.finished_at is None and bool(attempt.reason)

    def _preempt(self, job: JobRecord, preemption: Preemption) -> None:
        """Signal a victim: it checkpoints within the grace period, then goes back to PENDING."""
        if job.cancel_requested or job.state not in (JobState.STARTING, JobState.RUNNING):
            return
        attempt = current_attempt(self.store, job)
        if attempt is None or attempt.finished_at is not None or attempt.state == "launching":
            return
        key = (job.id, attempt.number)
        if key in self._mem.cancel_sent:
            return
        reason = f"{PREEMPTED} for job {preemption.for_job_id}: {preemption.message}"
        latest = self.store.latest_checkpoint(job.id)
        since = (attempt.running_at or attempt.started_at).timestamp()
        if latest is not None:
            since = max(since, latest.ts)
        gpus = sum(len(g) for g in job.placement.values())
        self.metrics.preempted(job, gpus, self.clock() - since)
        self._stop_attempt(
            job,
            attempt,
            reason,
            f"{reason}; {preemption.grace_s:g}s to checkpoint before SIGKILL",
            grace_s=preemption.grace_s,
            kind="preempt",
        )
        crashpoint("preempt.after_signal")

    # 4 ------------------------------------------------------------------------------------
    def _launch_ready(self, now: float) -> None:
        attempts: dict[int, AttemptRecord] | None = None
        for job in self._jobs.in_states(JobState.ADMITTED, JobState.RESTARTING, JobState.STARTING):
            if job.state is JobState.STARTING:
                # A launch recorded but not confirmed (a crash, or a launch still in flight).
                attempts = attempts if attempts is not None else self.store.current_attempts()
                attempt = attempts.get(job.id)
                if attempt is not None and attempt.state == "launching":
                    self._guard.run(job.id, self._dispatch, job, attempt)
                continue
            self._guard.run(job.id, self._begin_launch, job, now)

    def _begin_launch(self, job: JobRecord, now: float) -> None:
        spec = self._jobs.spec(job)
        if job.cancel_requested:
            where = "restarting" if job.state is JobState.RESTARTING else "admitted"
            self._jobs.try_transition(job, JobState.CANCELLED, f"cancelled while {where}")
            return
        if job.state is JobState.RESTARTING and now < job.updated_at.timestamp() + (
            spec.restart.backoff
        ):
            return
        number = job.attempts + 1
        key = f"j{job.id}-a{number}-{uuid.uuid4().hex[:12]}"
        request = self._request(job, spec, number, key)
        latest = self.store.latest_checkpoint(job.id)
        resume = f", resuming from checkpoint step {latest.step}" if latest else ""
        try:
            record, attempt = self.store.begin_attempt(
                job.id,
                expected=job.state,
                number=number,
                attempt_key=key,
                handle=self.executor.prepare(request),
                reason=f"attempt {number} launching{resume}",
                resumed_from_step=latest.step if latest else None,
            )
        except Conflict as exc:
            log.info("job %s: launch skipped (%s)", job.id, exc)
            self._jobs.triggers.dirty = True
            return
        self._jobs.put(record)
        crashpoint("launch.after_intent")
        self._dispatch(record, attempt)

    def _request(self, job: JobRecord, spec: JobSpec, number: int, key: str) -> LaunchRequest:
        run_dir = Path(job.run_dir)
        ckpt_dir = job_checkpoint_root(run_dir, spec)
        megatron = recognise(spec.command, spec.framework)
        if megatron is not None:
            # Megatron resumes from --load, not from TYARD_CHECKPOINT_DIR: after a checkpoint
            # was recorded, every launch resumes from the job's own save directory.
            resume = self.store.latest_checkpoint(job.id) is not None
            auto = spec.checkpoint.auto_interval and number > 1
            interval = self._checkpoint_interval(job, spec, number) if auto else None
            command = launch_command(
                spec.command, save_dir=ckpt_dir, resume=resume, save_interval=interval
            )
            spec = spec.model_copy(update={"command": command})
        env = {
            "TYARD_JOB_ID": str(job.id),
            "TYARD_ATTEMPT": str(number),
            "TYARD_RUN_DIR": str(run_dir),
            "TYARD_CHECKPOINT_DIR": str(ckpt_dir),
            "TYARD_CHECKPOINT_INTERVAL": str(self._checkpoint_interval(job, spec, number)),
            "TYARD_CHECKPOINT_ASYNC": "1" if spec.checkpoint.async_save else "0",
            "TYARD_CHECKPOINT_LAYOUT": spec.checkpoint.layout,
            # 0: the runtime deletes nothing; the control plane applies the job's retention
            # policy when a checkpoint is reported (registry/pruning.py)
            "TYARD_CHECKPOINT_KEEP": "0",
            "TYARD_SERVER_URL": self.config.report_url,
            "TYARD_JOB_TOKEN": derive_job_token(self.job_key, key),
        }
        # NCCL debug log per rank and PyTorch's flight recorder (dumped on a collective
        # timeout) into the run dir, where the node agent tails them; spec.env overrides.
        for name, value in nccl_debug_env(run_dir).items():
            if name not in spec.env:
                env[name] = value
        if megatron is not None:
            env[MEGATRON_SAVE_ENV] = str(ckpt_dir)  # the executor follows it (docs/goodput.md)
        in_place = in_place_restarts(spec, restarts=job.restarts)
        if in_place:  # the runtime numbers a restarted worker launch + k (docs/contracts.md)
            env["TYARD_IN_PLACE_RESTARTS"] = str(in_place)
        return LaunchRequest(
            job_id=str(job.id),
            attempt=number,
            spec=spec,
            run_dir=run_dir,
            env=env,
            placement=dict(job.placement),
            attempt_key=key,
            in_place_restarts=in_place,
            fencing_epoch=self.epoch or 0,
        )

    def _checkpoint_interval(self, job: JobRecord, spec: JobSpec, number: int) -> int:
        """The spec's interval; with auto_interval, a restart uses the Young/Daly interval
        from the failures seen so far and the measured save cost (docs/goodput.md)."""
        if not spec.checkpoint.auto_interval or number <= 1:
            return spec.checkpoint.interval
        from tensoryard.server.summary import summarize

        advice = summarize(
            self.store, job.id, now=datetime.fromtimestamp(self.clock(), UTC)
        ).checkpoint_advice
        if advice is None or advice.interval_steps is None:
            return spec.checkpoint.interval
        return advice.interval_steps

    def _dispatch(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Hand a recorded attempt to the executor, in the background when configured."""
        key = (job.id, attempt.number)
        if self._stop.is_set():
            return  # stopping (the pool may be shut down): the recorded attempt is launched
            # by whoever leads next (a launch is idempotent by its key)
        with self._flight_lock:
            if key in self._in_flight:
                return
            self._in_flight.add(key)
        if self._pool is None:
            self._launch(job, attempt)
        else:
            self._pool.submit(self._launch, job, attempt)

    def _launch(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Launch (or re-launch: idempotent by key) one recorded attempt, record the result."""
        try:
            spec = self._jobs.spec(job)
            request = self._request(job, spec, attempt.number, attempt.attempt_key)
            try:  # values are read at launch, never stored with the job
                request.env.update(self.secrets.resolve(spec.team, spec.secrets))
            except NotFound as exc:
                self._launch_failed(job, attempt, f"launch of attempt {attempt.number}: {exc}")
                return
            self.store.issue_job_token(
                job.id, request.env["TYARD_JOB_TOKEN"], attempt=attempt.number
            )
            Path(job.run_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
            (Path(job.run_dir) / "nccl").mkdir(exist_ok=True, mode=0o700)  # NCCL makes no dirs
            (Path(job.run_dir) / "nccl" / "inspector").mkdir(exist_ok=True, mode=0o700)
            self.check_fence()  # the last moment a deposed leader can be stopped
            try:
                handle = self.executor.launch(request)
            except (ExecutorError, OSError) as exc:
                self._launch_failed(
                    job, attempt, f"launch of attempt {attempt.number} failed: {exc}"
                )
                return
            crashpoint("launch.after_start")
            self.store.mark_launched(job.id, attempt.number, handle)
        except FencedOut as exc:  # the new leader's recovery launches it (same key) if due
            log.warning("job %s: attempt %s not launched here: %s", job.id, attempt.number, exc)
        except Exception as exc:  # never lose a launch thread silently, never retry it blindly
            log.exception("job %s: launch of attempt %s failed", job.id, attempt.number)
            with contextlib.suppress(Exception):
                self._launch_failed(job, attempt, f"launch of attempt {attempt.number}: {exc}")
        finally:
            with self._flight_lock:
                self._in_flight.discard((job.id, attempt.number))
            self.kick()

    def _launch_failed(self, job: JobRecord, attempt: AttemptRecord, reason: str) -> None:
        fresh = self.store.get_job(job.id)
        to, why = self._retry_or_fail(fresh, reason)
        with contextlib.suppress(Conflict):
            self.store.finish_attempt(
                job.id,
                attempt.number,
                state=AttemptPhase.FAILED.value,
                reason=reason,
                job_to=to,
                job_reason=why,
                expected=[JobState.STARTING],
            )

    # ---- scheduler state across restarts ---------------------------------------------------

    def _load_scheduler_state(self) -> None:
        importer = getattr(self.policy, "import_state", None)
        if importer is None:
            return
        try:
            state = self.store.get_scheduler_state(SCHEDULER_STATE_KEY)
            if state:
                importer(state)
        except Exception:
            log.exception("stored scheduler state unreadable; starting with a fresh history")

    def _save_scheduler_state(self, *, force: bool = False) -> None:
        exporter = getattr(self.policy, "export_state", None)
        now = self.clock()
        if exporter is None or (not force and now - self._last_state_save < _STATE_SAVE_EVERY_S):
            return
        self._last_state_save = now
        with contextlib.suppress(StoreError):
            self.store.put_scheduler_state(SCHEDULER_STATE_KEY, exporter())

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait until no launch is in flight (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._flight_lock:
                if not self._in_flight:
                    return
            time.sleep(0.02)
