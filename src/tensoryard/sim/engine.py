"""The event-driven replay: a heap of submit / finish / grace-end / wake-up events.

All events at one simulated time are applied together, then the policy runs one scheduling
cycle on the resulting state (no fixed tick). A preempted job keeps its GPUs for the grace
period, then stops, loses the work since its last periodic checkpoint and is requeued.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from tensoryard.errors import ConfigError
from tensoryard.sim.cluster import ClusterShape, ClusterState, Placement, gang_shape
from tensoryard.sim.errors import OracleAccessError, SimulationError
from tensoryard.sim.jobs import JobState, SimJob
from tensoryard.sim.metrics import MetricsRecorder, SimResult
from tensoryard.sim.quotas import nominal_gpus
from tensoryard.sim.trace import TraceJob
from tensoryard.sim.view import JobView
from tensoryard.spec.queue import QuotaConfig

__all__ = [
    "JobView",
    "OracleAccessError",
    "Policy",
    "SimConfig",
    "SimContext",
    "SimulationError",
    "Simulator",
    "simulate",
]

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """How the simulated jobs behave around preemption."""

    checkpoint_interval_s: float = 600.0
    """Every job writes a checkpoint this often (per attempt); 0 means never."""
    grace_s: float = 30.0
    """A preempted job keeps its GPUs this long before it is stopped."""


class _Event(IntEnum):
    # Order within one timestamp: free resources before new arrivals.
    FINISH = 0
    GRACE_END = 1
    SUBMIT = 2
    WAKEUP = 3


class SimContext(Protocol):
    """What a policy sees and may do during one scheduling cycle."""

    @property
    def now(self) -> float: ...

    @property
    def shape(self) -> ClusterShape: ...

    @property
    def cluster(self) -> ClusterState: ...

    @property
    def config(self) -> SimConfig: ...

    @property
    def quotas(self) -> QuotaConfig: ...

    def pending(self) -> list[JobView]:
        """Pending jobs, in the order they (re)entered the queue."""
        ...

    def running(self) -> list[JobView]:
        """Jobs holding GPUs and not being preempted."""
        ...

    def stopping(self) -> list[JobView]:
        """Preempted jobs still in their grace period."""
        ...

    @property
    def completed(self) -> list[JobView]:
        """Finished jobs in the order they finished (append-only)."""
        ...

    def admit(self, job: JobView, placement: Placement) -> None: ...

    def preempt(self, job: JobView, grace_s: float | None = None) -> None: ...

    def true_duration_s(self, job: JobView) -> float:
        """The job's true run time; only for policies declared ``oracle = True``."""
        ...

    def true_remaining_s(self, job: JobView) -> float:
        """What is left of its run (current attempt included, as if it ran on from its
        last stop); only for policies declared ``oracle = True``."""
        ...


class Policy(Protocol):
    """A scheduling policy: one cycle per event batch; may ask to be woken at a later time.

    A policy sees jobs as :class:`JobView` (no true durations). Oracle baselines set a class
    attribute ``oracle = True`` to be allowed ``SimContext.true_duration_s``.
    """

    name: str

    def cycle(self, ctx: SimContext) -> float | None:
        """Admit and preempt through ``ctx``; return a time to be woken at, or None."""
        ...


class Simulator:
    """Replays ``jobs`` on ``shape`` under ``policy``. Use :func:`simulate` for one call."""

    def __init__(
        self,
        jobs: Iterable[TraceJob],
        shape: ClusterShape,
        policy: Policy,
        quotas: QuotaConfig,
        config: SimConfig | None = None,
    ) -> None:
        self._shape = shape
        self._cluster = ClusterState(shape)
        self._config = config or SimConfig()
        self._quotas = quotas
        self.policy = policy
        self.jobs = [self._make_job(i, t) for i, t in enumerate(jobs)]
        self._views = [JobView(j) for j in self.jobs]
        self._oracle = bool(getattr(policy, "oracle", False))
        self.nominal = nominal_gpus(quotas, shape.gpu_model)
        missing = sorted({j.team for j in self.jobs} - set(self.nominal))
        if missing:
            raise ConfigError(
                f"teams {', '.join(missing)} appear in the trace but have no queue "
                "(fix: add them to the quotas file)"
            )
        self.recorder = MetricsRecorder(shape.total_gpus, self.nominal)
        self._pending: dict[int, SimJob] = {}
        self._holding: dict[int, SimJob] = {}
        self._completed: list[JobView] = []
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._now = 0.0
        self._done = 0
        self._next_wakeup = math.inf
        self.cycles = 0

    def _make_job(self, index: int, trace: TraceJob) -> SimJob:
        nodes, per_node = gang_shape(trace.num_gpus, self._shape.gpus_per_node)
        if nodes > self._shape.nodes:
            raise ConfigError(
                f"job {trace.job_id} needs {trace.num_gpus} GPUs ({nodes} nodes), the cluster "
                f"has {self._shape.total_gpus} (fix: use a larger --cluster or another window)"
            )
        if trace.gpu_model and trace.gpu_model != self._shape.gpu_model:
            raise ConfigError(
                f"job {trace.job_id} asks for GPU model {trace.gpu_model!r}, the cluster has "
                f"{self._shape.gpu_model!r} (fix: write the model in the shape, like 64x8:"
                f"{trace.gpu_model})"
            )
        return SimJob(trace, index, nodes, per_node, trace.duration_s)

    # SimContext ----------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self._now

    @property
    def shape(self) -> ClusterShape:
        return self._shape

    @property
    def cluster(self) -> ClusterState:
        return self._cluster

    @property
    def config(self) -> SimConfig:
        return self._config

    @property
    def quotas(self) -> QuotaConfig:
        return self._quotas

    def pending(self) -> list[JobView]:
        views = self._views
        return [views[i] for i in self._pending]

    def running(self) -> list[JobView]:
        views = self._views
        return [views[i] for i, j in self._holding.items() if j.state is JobState.RUNNING]

    def stopping(self) -> list[JobView]:
        views = self._views
        return [views[i] for i, j in self._holding.items() if j.state is JobState.STOPPING]

    @property
    def completed(self) -> list[JobView]:
        return self._completed

    def true_duration_s(self, job: JobView) -> float:
        self._check_oracle()
        return self.jobs[job.index].trace.duration_s

    def true_remaining_s(self, job: JobView) -> float:
        self._check_oracle()
        sim_job = self.jobs[job.index]
        return sim_job.remaining_s - sim_job.executed_s(self._now)

    def _check_oracle(self) -> None:
        if not self._oracle:
            raise OracleAccessError(
                f"policy {self.policy.name} asked for a true duration but is not an oracle "
                "(fix: set oracle = True on oracle baselines only)"
            )

    def admit(self, view: JobView, placement: Placement) -> None:
        """Start ``job`` on ``placement`` now (the placement must be a full, free gang)."""
        job = self.jobs[view.index]
        if job.state is not JobState.PENDING:
            raise SimulationError(f"{self.policy.name} admitted {job.trace.job_id} twice")
        if len(placement) != job.nodes or any(
            len(g) != job.gpus_per_node for g in placement.values()
        ):
            raise SimulationError(
                f"{self.policy.name} placed {job.trace.job_id} ({job.nodes}x{job.gpus_per_node}) "
                f"on {{{', '.join(f'{n}: {len(g)}' for n, g in placement.items())}}}: not a gang"
            )
        try:
            self._cluster.allocate(placement)
        except ConfigError as exc:
            raise SimulationError(f"{self.policy.name}: {exc}") from exc
        self._unpend(job)
        job.state, job.placement = JobState.RUNNING, dict(placement)
        job.attempt += 1
        job.attempt_start = self._now
        if job.first_start is None:
            job.first_start = self._now
        self._holding[job.index] = job
        self.recorder.gpus_taken(job)
        self._push(self._now + job.remaining_s, _Event.FINISH, job.index, job.attempt)

    def preempt(self, view: JobView, grace_s: float | None = None) -> None:
        """Signal ``job``; it keeps its GPUs for the grace period (the configured one unless
        ``grace_s`` is given), then stops and requeues."""
        job = self.jobs[view.index]
        if job.state is not JobState.RUNNING:
            raise SimulationError(f"{self.policy.name} preempted {job.trace.job_id}, not running")
        job.state = JobState.STOPPING
        job.preemptions += 1
        grace = self._config.grace_s if grace_s is None else grace_s
        self._push(self._now + grace, _Event.GRACE_END, job.index, job.attempt)

    # the loop ------------------------------------------------------------------------------

    def _push(self, at: float, kind: _Event, index: int, attempt: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, int(kind), self._seq, index, attempt))

    def _pend(self, job: SimJob) -> None:
        job.state, job.pending_since = JobState.PENDING, self._now
        self._pending[job.index] = job
        self.recorder.pending_added(job)

    def _unpend(self, job: SimJob) -> None:
        del self._pending[job.index]
        job.wait_s += self._now - (job.pending_since or self._now)
        job.pending_since = None
        self.recorder.pending_removed(job)

    def _release(self, job: SimJob) -> None:
        assert job.placement is not None
        self._cluster.release(job.placement)
        self.recorder.gpus_freed(job)
        del self._holding[job.index]
        ran = self._now - job.attempt_start
        job.attained_gpu_s += job.gpus * ran
        job.last_exec_s, job.last_stop, job.placement = ran, self._now, None

    def _apply(self, kind: int, index: int, attempt: int) -> bool:
        job = self.jobs[index] if index >= 0 else None
        if kind == _Event.SUBMIT and job is not None:
            self._pend(job)
            return True
        if kind == _Event.WAKEUP:
            self._next_wakeup = math.inf
            return True
        if job is None or attempt != job.attempt:
            return False  # an event of an attempt that has already ended
        if kind == _Event.FINISH and job.state in (JobState.RUNNING, JobState.STOPPING):
            self._release(job)
            job.state, job.finish_time, job.remaining_s = JobState.DONE, self._now, 0.0
            self._done += 1
            self._completed.append(self._views[job.index])
            return True
        if kind == _Event.GRACE_END and job.state is JobState.STOPPING:
            self._stop(job)
            return True
        return False

    def _stop(self, job: SimJob) -> None:
        interval = self._config.checkpoint_interval_s
        ran = self._now - job.attempt_start
        kept = math.floor(ran / interval) * interval if interval > 0 else 0.0
        job.remaining_s -= kept
        job.lost_gpu_s += job.gpus * (ran - kept)
        self._release(job)
        self._pend(job)

    def run(self, progress: ProgressFn | None = None) -> SimResult:
        """Replay every job to completion and return the measurements."""
        started = time.perf_counter()
        for job in self.jobs:
            self._push(job.submit_time_s, _Event.SUBMIT, job.index)
        total = len(self.jobs)
        while self._done < total:
            if not self._heap:
                self._stuck()
            at = self._heap[0][0]
            self.recorder.advance(at)
            self._now = at
            changed = False
            while self._heap and self._heap[0][0] == at:
                _, kind, _, index, attempt = heapq.heappop(self._heap)
                changed |= self._apply(kind, index, attempt)
            if changed and self._done < total:
                self._cycle()
            self.recorder.sample(at)
            if progress is not None:
                progress(self._done, total)
        return SimResult(
            policy=self.policy.name,
            total_gpus=self._shape.total_gpus,
            jobs=self.jobs,
            recorder=self.recorder,
            cycles=self.cycles,
            wall_s=time.perf_counter() - started,
        )

    def _cycle(self) -> None:
        self.cycles += 1
        wake = self.policy.cycle(self)
        if wake is not None and self._now < wake < self._next_wakeup:
            self._next_wakeup = wake
            self._push(wake, _Event.WAKEUP, -1)

    def _stuck(self) -> None:
        waiting = ", ".join(j.trace.job_id for j in list(self._pending.values())[:5])
        raise SimulationError(
            f"policy {self.policy.name} left {len(self._pending)} jobs pending ({waiting}) on "
            "an otherwise idle cluster; nothing will ever start them"
        )


def simulate(
    jobs: Iterable[TraceJob],
    shape: ClusterShape,
    policy: Policy,
    quotas: QuotaConfig,
    config: SimConfig | None = None,
    progress: ProgressFn | None = None,
) -> SimResult:
    """Replay ``jobs`` on ``shape`` under ``policy`` and return the measurements."""
    return Simulator(jobs, shape, policy, quotas, config).run(progress)
