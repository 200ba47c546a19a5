"""The control loop: schedule pending jobs, launch admitted ones, reconcile running attempts.

`Controller` is the facade that main.py and the tests drive (`lead()`, `cycle()`, `start()`,
`stop()`, `kick()`); one `cycle()` reads top to bottom as numbered phases, each carried out by
a part in ``server/control/`` that owns its own slice of state:

- ``leadership``: the leader lease and the fencing checks;
- ``index``: every unfinished job by state (loaded once, then only the rows that changed, so
  an idle cycle costs one small query however many jobs wait) and the scheduling triggers;
- ``recovery``: after a restart or a change of leader, stray attempts killed and closed by
  key, jobs whose attempt ended without them repaired;
- ``reconcile`` (with ``health``, ``outcome``, ``stopping``): attempts polled, limits and hangs
  handled, ended attempts' jobs moved (restart, requeue, partial gang recovery);
- ``nodes``, ``drains``, ``avoidance``: node states, lost nodes, drains, nodes to avoid;
- ``schedule``: snapshot -> policy -> admissions and preemptions;
- ``launch``: the launch environment and tokens, launches in the background;
- ``pending``: why-pending and start estimates;
- ``isolation``: one job's error never stops the others.

Every state change is one store transaction (compare-and-set), written *before* the side
effect it stands for:

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
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry

from tensoryard.errors import FencedOut, StoreError, TensoryardError
from tensoryard.executors.base import Executor, ReportsChanges
from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.registry.service import ModelRegistry
from tensoryard.server.config import ServerConfig
from tensoryard.server.control.avoidance import NodeAvoidance
from tensoryard.server.control.drains import Drains
from tensoryard.server.control.health import HealthCheck
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.isolation import JobGuard
from tensoryard.server.control.launch import Launcher
from tensoryard.server.control.leadership import Leadership
from tensoryard.server.control.nodes import NodeView
from tensoryard.server.control.outcome import AttemptOutcome
from tensoryard.server.control.pending import PendingReasons
from tensoryard.server.control.reconcile import Reconciler
from tensoryard.server.control.recovery import Recovery
from tensoryard.server.control.rules import PREEMPTED, BadJobData, CapacityProvider, NodeSync
from tensoryard.server.control.schedule import Scheduling
from tensoryard.server.control.stopping import AttemptStopper
from tensoryard.server.metrics import LoopMetrics
from tensoryard.server.pipelines import PipelineAdvancer
from tensoryard.server.scheduling import CorePolicy
from tensoryard.server.secrets import SecretStore
from tensoryard.spec.states import JobState
from tensoryard.store import Store

__all__ = ["PREEMPTED", "BadJobData", "CapacityProvider", "Controller", "NodeSync"]

log = logging.getLogger("tensoryard.controller")

_SLOW_CYCLE_S = 1.0  # a cycle slower than this is logged with its phases
_STARTING_TICK_S = 0.05  # see Controller._pause
_PIPELINES_EVERY_S = 1.0  # pipelines are advanced at least this often (API on another replica)


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
        self.leadership = Leadership(
            lease_store=store, holder=holder, config=config, clock=clock, metrics=self.metrics
        )
        # Everything the loop writes goes through the fenced view: a deposed leader can
        # change no row (docs/state-machine.md, "Fencing").
        self.store = store.fenced(self.leadership.fence_token, on_fenced=self.leadership.fenced_out)
        self.node_sync = node_sync
        self.executor = executor
        self.policy = policy
        self.capacity = capacity
        self._config = config
        self.clock = clock
        self.job_key = job_key or uuid.uuid4().hex
        self.secrets = secrets or SecretStore(config.secrets_dir)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
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
        self._build_parts()

    def _build_parts(self) -> None:
        """The phases' parts, each given only the collaborators it uses."""
        store, executor, config, clock = self.store, self.executor, self._config, self.clock
        fence = self.leadership.check_fence
        self._jobs = index = JobIndex(store, clock)
        self._guard = guard = JobGuard(store=store, executor=executor, index=index)
        self._nodes = nodes = NodeView(
            store=store,
            # read through the facade: a test (or the autoscaler's wiring) may replace them
            capacity=lambda: self.capacity(),
            config=config,
            clock=clock,
            triggers=index.triggers,
            node_sync=lambda states: self.node_sync(states) if self.node_sync else None,
        )
        self._stopper = stopper = AttemptStopper(store=store, executor=executor, check_fence=fence)
        health = HealthCheck(
            store=store, executor=executor, config=config, index=index, stopper=stopper
        )
        avoidance = NodeAvoidance(store=store, index=index, nodes=nodes, clock=clock)
        outcome = AttemptOutcome(
            store=store,
            index=index,
            nodes=nodes,
            avoidance=avoidance,
            health=health,
            stopper=stopper,
            metrics=self.metrics,
            policy=self.policy,
        )
        self._reconciler = reconciler = Reconciler(
            store=store,
            executor=executor,
            config=config,
            index=index,
            guard=guard,
            stopper=stopper,
            health=health,
            nodes=nodes,
            outcome=outcome,
            check_fence=fence,
        )
        self._drains = Drains(
            store=store, config=config, index=index, guard=guard, nodes=nodes, stopper=stopper
        )
        self._pending = pending = PendingReasons(store=store, index=index)
        self._scheduling = Scheduling(
            store=store,
            policy=self.policy,
            config=config,
            clock=clock,
            metrics=self.metrics,
            index=index,
            guard=guard,
            nodes=nodes,
            avoidance=avoidance,
            pending=pending,
            stopper=stopper,
        )
        self._launcher = Launcher(
            store=store,
            executor=executor,
            config=config,
            clock=clock,
            index=index,
            guard=guard,
            outcome=outcome,
            secrets=self.secrets,
            job_key=self.job_key,
            epoch=lambda: self.leadership.epoch,
            check_fence=fence,
            stopping=self._stop,
            kick=self.kick,
        )
        self._recovery = Recovery(
            store=store,
            executor=executor,
            index=index,
            guard=guard,
            outcome=outcome,
            check_fence=fence,
        )
        # What recovery forgets: everything remembered about attempts, jobs and nodes.
        self._memories = (
            index,
            guard,
            nodes,
            stopper,
            health,
            avoidance,
            outcome,
            reconciler,
            pending,
        )

    @property
    def config(self) -> ServerConfig:
        """Fixed at construction: every part was built with it."""
        return self._config

    # ---- leadership ------------------------------------------------------------------------

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

    def lead(self) -> bool:
        """Take or renew the leader lease; on taking it, recover. False while another leads.

        The leader renews when a third of the TTL has passed (not every cycle)."""
        leading, took = self.leadership.lead()
        if took:
            self.recover()
        return leading

    def check_fence(self) -> None:
        """FencedOut unless this replica still holds the lease at its epoch (read now)."""
        self.leadership.check_fence()

    def leading_now(self) -> bool:
        """What /healthz reports (see Leadership.leading_now)."""
        return self.leadership.leading_now()

    def recover(self) -> None:
        """After a (re)start or a change of leader: rebuild memory from the store, close and
        kill stray attempts by key, and repair every job whose attempt ended without it."""
        for part in self._memories:
            part.reset()
        self._pipelines_due = True
        self.store.register_nodes(n.name for n in self.capacity())
        self._scheduling.load_state()
        self._recovery.repair()

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if isinstance(self.executor, ReportsChanges):  # events wake the loop (see changed)
            self._reconciler.events = self.executor.report_changes(self.changed)
        self._thread = threading.Thread(target=self._run, name="tyard-controller", daemon=True)
        self._thread.start()

    def changed(self, job_id: int | None) -> None:
        """The executor saw an attempt of `job_id` change (None: of some job): reconcile it
        in a cycle that starts now (any thread)."""
        self._reconciler.changed(job_id)
        self._wake.set()

    def kick(self) -> None:
        """Run the next cycle now (after a submit or cancel) instead of at the next tick."""
        self._pipelines_due = True
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._launcher.shutdown()
        if self.is_leader:
            with contextlib.suppress(TensoryardError):
                self._scheduling.save_state(force=True)
            self.leadership.release()

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait until no launch is in flight (tests, shutdown)."""
        self._launcher.wait_idle(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.lead():
                    self.cycle()
            except FencedOut as exc:  # another replica leads now: stepped down already
                log.warning("control cycle stopped: %s", exc)
            except Exception:  # the loop must survive anything; the next cycle retries
                log.exception("control cycle failed")
            self._wake.wait(self._pause())
            self._wake.clear()

    def _pause(self) -> float:
        """The wait before the next cycle: the loop interval, or a short one while an
        attempt is starting on an executor that reports no start (a local process's workers
        come up without an event; the next job's start should not wait a whole tick)."""
        interval = self._config.loop_interval_s
        if getattr(self.executor, "reports_starts", False):
            return interval
        if self._jobs.in_states(JobState.STARTING):
            return min(interval, _STARTING_TICK_S)
        return interval

    # ---- one cycle -------------------------------------------------------------------------

    def cycle(self) -> None:
        """One pass: the numbered phases below, each idempotent."""
        with self._lock:
            now = self.clock()
            timer = _PhaseTimer()
            # 0a. Read what changed since the last cycle into the index.
            with timer("refresh"):
                if self._jobs.refresh():
                    self._pipelines_due = True  # a step's job may have ended
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
                self._reconciler.reconcile(now)
            # 2b. Move jobs off draining nodes (checkpoint signal, then requeue).
            with timer("drain"):
                self._drains.drain(now)
            # 2c. Mirror the cordon states onto the executor's nodes (the Kubernetes Node:
            #     unschedulable + taint); the stored state is the intent, this repairs drift.
            if self.node_sync is not None:
                with timer("node-sync"):
                    self._nodes.sync(now)
            # 3. Schedule: snapshot -> policy -> admissions and pending reasons.
            if self._scheduling.due(now):
                with timer("schedule"):
                    self._scheduling.run(now)
            # 4. Launch admitted jobs and restarts whose backoff has passed (in the background).
            with timer("launch"):
                self._launcher.launch_ready(now)
            # 5. Write the pending reasons and start estimates (after the launches: a deep
            #    backlog's reasons must not delay the job that just got a slot).
            with timer("pending-info"):
                self._scheduling.note_reasons()
                self._pending.write()
            self._scheduling.save_state()
            self.leadership.cycle_done = self.clock()
            if timer.total() > _SLOW_CYCLE_S:
                log.warning("slow control cycle (%d unfinished jobs): %s", len(self._jobs), timer)

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

    def _cancel_pending(self) -> None:
        for job_id in list(self._jobs.cancel_requested):
            job = self._jobs.get(job_id)
            if job is not None and job.state is JobState.PENDING:
                self._jobs.try_transition(job, JobState.CANCELLED, "cancelled before it started")
