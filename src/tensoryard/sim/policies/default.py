"""The platform's default policy: the production scheduling core, unchanged, behind a thin
adapter that turns the simulator's state into a :class:`~tensoryard.scheduler.Snapshot` and
the core's :class:`~tensoryard.scheduler.Decisions` back into simulator actions.

The core never sees true durations (the simulator hands policies job views whose duration
raises). Its runtime estimates (used for backfill and start-time estimates) come from the
same :class:`~tensoryard.scheduler.estimates.RuntimeEstimator` the control plane uses, fed
with the observed run time of every completed job; its accuracy is in :meth:`accuracy`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace
from typing import Any

from tensoryard.scheduler import (
    DecayedUsage,
    Decisions,
    Node,
    Placement,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tensoryard.scheduler.config import RECLAIM_MEMORY_S
from tensoryard.scheduler.estimates import (
    EstimatorConfig,
    JobFeatures,
    RuntimeEstimator,
    attempt_estimate,
)
from tensoryard.sim.cluster import ClusterShape
from tensoryard.sim.cluster import Placement as SimPlacement
from tensoryard.sim.engine import SimContext, SimulationError
from tensoryard.sim.jobs import JobState
from tensoryard.sim.view import JobView

__all__ = ["DefaultPolicy", "features"]


def features(job: JobView) -> JobFeatures:
    """What the estimator may know of a simulated job (traces carry no user or job name)."""
    return JobFeatures(team=job.team, gpus=job.gpus)


def cluster_nodes(shape: ClusterShape) -> tuple[Node, ...]:
    """The simulated cluster as the core's inventory (healthy, switch labels set)."""
    return tuple(
        Node(
            name=shape.node_name(i),
            gpu_model=shape.gpu_model,
            gpus_total=shape.gpus_per_node,
            switch=shape.switch_name(i),
        )
        for i in range(shape.nodes)
    )


class DefaultPolicy:
    """Runs :class:`tensoryard.scheduler.Scheduler` once per simulator cycle."""

    name = "default"

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        use_history: bool = True,
        estimator_config: EstimatorConfig | None = None,
    ) -> None:
        self._config = config
        self._scheduler: Scheduler | None = None
        self._nodes: tuple[Node, ...] = ()
        self._node_ix: dict[str, int] = {}
        self._usage: dict[str, DecayedUsage] = {}
        self._pending_cache: dict[int, tuple[tuple[int, float | None, bool], Workload]] = {}
        self._running_cache: dict[int, tuple[tuple[int, bool], float, Workload]] = {}
        self._seen_completed = 0
        self._preempted_for: dict[int, str] = {}  # victim index -> preemptor workload id
        # preemptor workload id -> when its preemptions were made (as CorePolicy keeps it)
        self._reclaiming: dict[str, float] = {}
        self.estimator = RuntimeEstimator(estimator_config) if use_history else None
        self.last_decisions: Decisions | None = None

    @property
    def scheduler(self) -> Scheduler:
        assert self._scheduler is not None, "the policy has not run a cycle yet"
        return self._scheduler

    def _setup(self, ctx: SimContext) -> None:
        # Same grace for every policy: the simulator's, unless a config was given.
        config = self._config or SchedulerConfig(preemption_grace_s=ctx.config.grace_s)
        self._scheduler = Scheduler(config)
        self._nodes = cluster_nodes(ctx.shape)
        self._node_ix = {n.name: i for i, n in enumerate(self._nodes)}

    def cycle(self, ctx: SimContext) -> float | None:
        if self._scheduler is None:
            self._setup(ctx)
        self._learn_completions(ctx)
        now = ctx.now
        pending = ctx.pending()
        if not pending:
            return None
        holding = ctx.running() + ctx.stopping()
        snapshot = Snapshot(
            nodes=self._nodes,
            quotas=ctx.quotas,
            pending=tuple(self._pending_workload(j) for j in pending),
            running=tuple(self._running_workload(j, now, ctx) for j in holding),
            usage_history=self._usage,
        )
        decisions = self.scheduler.schedule(snapshot, now)
        self.last_decisions = decisions
        self._remember_reclaims(decisions, snapshot, now)
        self._usage = dict(decisions.usage_history)
        self._apply(ctx, decisions, {j.index: j for j in pending}, {j.index: j for j in holding})
        wake = self._next_change(ctx, now)
        if decisions.wake_at is not None and decisions.wake_at > now:
            wake = decisions.wake_at if wake is None else min(wake, decisions.wake_at)
        return wake

    # snapshot ------------------------------------------------------------------------------

    @staticmethod
    def workload_id(job: JobView) -> str:
        return f"j{job.index:08d}"

    def _estimate(self, job: JobView) -> float | None:
        return self.estimator.estimate(features(job)) if self.estimator is not None else None

    def accuracy(self) -> dict[str, Any]:
        """The estimator's accuracy over the replay so far (empty without history)."""
        return dict(self.estimator.accuracy()) if self.estimator is not None else {}

    def _base(self, job: JobView) -> Workload:
        return Workload(
            id=self.workload_id(job),
            queue=job.team,
            nodes=job.nodes,
            gpus_per_node=job.gpus_per_node,
            gpu_model=job.trace.gpu_model,
            priority=job.trace.priority,
            submit_time=job.submit_time_s,
            runtime_estimate_s=self._estimate(job),
            attained_service_s=job.attained_gpu_s / job.gpus,
        )

    def _pending_workload(self, job: JobView) -> Workload:
        self._preempted_for.pop(job.index, None)  # its preemption is over
        estimate = self._estimate(job)  # changes as the team's history grows
        reclaiming = self.workload_id(job) in self._reclaiming
        cached = self._pending_cache.get(job.index)
        if cached is not None and cached[0] == (job.attempt, estimate, reclaiming):
            return cached[1]
        workload = self._base(job)
        if reclaiming:
            workload = replace(workload, reclaiming=True)
        self._pending_cache[job.index] = ((job.attempt, estimate, reclaiming), workload)
        return workload

    def _remember_reclaims(self, decisions: Decisions, snapshot: Snapshot, now: float) -> None:
        """Pending workloads preemptions were made for keep first pick (CorePolicy's rule)."""
        for p in decisions.preemptions:
            self._reclaiming.setdefault(p.preemptor_id, now)
        if not self._reclaiming:
            return
        admitted = {a.workload_id for a in decisions.admissions}
        waiting = {w.id for w in snapshot.pending}
        self._reclaiming = {
            w: since
            for w, since in self._reclaiming.items()
            if w in waiting and w not in admitted and now - since < RECLAIM_MEMORY_S
        }

    def _running_estimate(self, job: JobView, now: float) -> float | None:
        """Expected length of the current attempt: what is left of the typical run; once an
        attempt outlives that, twice what it has run so far (it is evidently not typical)."""
        typical = self._estimate(job)
        return attempt_estimate(typical, job.attained_gpu_s / job.gpus, now - job.attempt_start)

    def _running_workload(self, job: JobView, now: float, ctx: SimContext) -> Workload:
        cached = self._running_cache.get(job.index)
        stopping = job.state is JobState.STOPPING
        if cached is not None and cached[0] == (job.attempt, stopping) and now < cached[1]:
            return cached[2]
        assert job.placement is not None
        interval = ctx.config.checkpoint_interval_s
        checkpoint = job.last_checkpoint_at(now, interval)
        estimate = self._running_estimate(job, now)
        # valid until the next checkpoint or until the attempt outlives its estimate
        until = (
            job.attempt_start + (math.floor((now - job.attempt_start) / interval) + 1) * (interval)
            if interval > 0
            else math.inf
        )
        if estimate is not None:
            until = min(until, job.attempt_start + estimate)
        gpus = {self._nodes[n].name: ix for n, ix in job.placement.items()}
        workload = replace(
            self._base(job),
            runtime_estimate_s=estimate,
            placement=Placement(ctx.shape.gpu_model, gpus),
            start_time=job.attempt_start,
            last_checkpoint_time=checkpoint,
            terminating=stopping,
            preempted_for=self._preempted_for.get(job.index) if stopping else None,
        )
        self._running_cache[job.index] = ((job.attempt, stopping), until, workload)
        return workload

    def _learn_completions(self, ctx: SimContext) -> None:
        done = ctx.completed
        for job in done[self._seen_completed :]:
            if self.estimator is not None:
                self.estimator.observe(features(job), job.attained_gpu_s / job.gpus)
            self._running_cache.pop(job.index, None)
        self._seen_completed = len(done)

    # decisions -----------------------------------------------------------------------------

    def _apply(
        self,
        ctx: SimContext,
        decisions: Decisions,
        pending: dict[int, JobView],
        holding: dict[int, JobView],
    ) -> None:
        for preemption in decisions.preemptions:
            self._preempted_for[self._index(preemption.workload_id)] = preemption.preemptor_id
            victim = holding.get(self._index(preemption.workload_id))
            if victim is None:
                raise SimulationError(f"the core preempted unknown {preemption.workload_id}")
            if victim.state is JobState.RUNNING:
                ctx.preempt(victim, grace_s=preemption.grace_s)
        for admission in decisions.admissions:
            job = pending.get(self._index(admission.workload_id))
            if job is None:
                raise SimulationError(f"the core admitted unknown {admission.workload_id}")
            placement: SimPlacement = {
                self._node_ix[name]: tuple(ix) for name, ix in admission.placement.gpus.items()
            }
            ctx.admit(job, placement)

    @staticmethod
    def _index(workload_id: str) -> int:
        return int(workload_id[1:])

    def _next_change(self, ctx: SimContext, now: float) -> float | None:
        """When the core's view changes with time alone in a way that matters: a running
        attempt passes the least run time before service preemption, or crosses a service
        level, and so becomes a possible victim of a pending workload with less service."""
        config = self.scheduler.config
        pending = ctx.pending()
        if not pending or not config.preempt_by_service:
            return None
        levels = config.service_levels_gpu_s
        lowest = min(bisect.bisect_right(levels, j.attained_gpu_s) for j in pending)
        wake = math.inf
        for job in ctx.running():
            eligible = job.attempt_start + config.service_preemption_min_run_s
            service = job.attained_gpu_s + job.gpus * (now - job.attempt_start)
            level = bisect.bisect_right(levels, service)
            if eligible > now:
                at_eligible = job.attained_gpu_s + job.gpus * (eligible - job.attempt_start)
                if bisect.bisect_right(levels, at_eligible) > lowest:
                    wake = min(wake, eligible)
                    continue
            if level < len(levels) and level + 1 > lowest:
                crossing = now + (levels[level] - service) / job.gpus + 1e-6
                wake = min(wake, max(crossing, eligible))
        return wake if wake < math.inf else None
