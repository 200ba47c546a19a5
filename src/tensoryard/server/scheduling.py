"""The scheduler loop's seam: store records and inventory in, the pure core's decisions out.

`CorePolicy` turns what the control plane knows (nodes, teams, pending and running jobs) into a
`tensoryard.scheduler.Snapshot`, runs the same `Scheduler` the simulator replays, and hands the
decisions back in the store's terms (job ids, node -> GPU index lists). No I/O happens here.

It also carries the scheduler's memory between cycles: the decayed usage history (fair share)
and the run-time estimator (``tensoryard.scheduler.estimates``, the same one the simulator's
default policy uses). The control loop keeps both across restarts:

- after each finished job (SUCCEEDED), call :meth:`CorePolicy.observe_completion` (or
  :meth:`CorePolicy.observe_finished_job` with the record) with the seconds it ran;
- persist :meth:`CorePolicy.export_state` (JSON-able) in the store, e.g. after each cycle
  that changed it, and on start-up call :meth:`CorePolicy.import_state` with what was stored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tensoryard.errors import ConfigError
from tensoryard.executors.capacity import NodeCapacity
from tensoryard.scheduler import (
    DecayedUsage,
    Node,
    Placement,
    QueueSpec,
    QuotaConfig,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    Workload,
    workload_from_job,
)
from tensoryard.scheduler import PendingInfo as CorePendingInfo
from tensoryard.scheduler.config import RECLAIM_MEMORY_S
from tensoryard.scheduler.estimates import (
    EstimatorConfig,
    JobFeatures,
    RuntimeEstimator,
    attempt_estimate,
)

# re-exported: the control loop reads them from here
from tensoryard.server.node_avoidance import (
    EXCLUDE_AFTER_FAILURES,
    failed_on,
    nodes_to_avoid,
    replacement_placement,
)
from tensoryard.spec.job import JobSpec
from tensoryard.store import JobRecord, TeamRecord

__all__ = [
    "EXCLUDE_AFTER_FAILURES",
    "Admission",
    "ClusterView",
    "CorePolicy",
    "Decisions",
    "KueuePolicy",
    "NodeCapacity",
    "PendingInfo",
    "Preemption",
    "failed_on",
    "nodes_to_avoid",
    "replacement_placement",
]

COHORT = "everyone"
STATE_VERSION = 1


@dataclass(frozen=True)
class ClusterView:
    """What one scheduling cycle looks at."""

    nodes: tuple[NodeCapacity, ...]
    teams: tuple[TeamRecord, ...]
    pending: tuple[JobRecord, ...]
    running: tuple[JobRecord, ...]  # jobs holding capacity (admitted .. restarting)
    now: float
    last_checkpoint: Mapping[int, float] = field(default_factory=dict)  # job -> unix time
    # job -> run time of its earlier attempts (observed service, for fair share and LAS)
    attained_s: Mapping[int, float] = field(default_factory=dict)
    terminating: frozenset[int] = frozenset()  # signalled to stop (cancel, preemption)
    # job -> when its current attempt started running (its launch while not yet running)
    attempt_started: Mapping[int, float] = field(default_factory=dict)
    specs: Mapping[int, JobSpec] = field(default_factory=dict)  # parsed once by the caller
    # job -> nodes its next placement must avoid (two of its attempts failed there)
    avoid_nodes: Mapping[int, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Admission:
    job_id: int
    placement: dict[str, list[int]]  # node -> GPU indices ([] on CPU-only nodes)
    reason: str = ""  # the job's state reason ("" : "admitted on <nodes>")


@dataclass(frozen=True)
class PendingInfo:
    reason: str
    eta_s: float | None = None  # unix time of the estimated start; None when unknown


@dataclass(frozen=True)
class Preemption:
    job_id: int
    for_job_id: int
    grace_s: float
    message: str


# A pending job's run-time estimate follows the estimator's learning at most this late.
ESTIMATES_REFRESH_S = 5.0


class LazyPending(Mapping[int, PendingInfo]):
    """Job id -> PendingInfo over the core's lazy view: each reason is rendered when read,
    so a pass over a deep backlog pays only for the reasons its caller writes."""

    def __init__(self, core: Mapping[str, CorePendingInfo], job_ids: Sequence[int]) -> None:
        self._core = core
        self._ids = job_ids
        self.visited: tuple[int, ...] = tuple(
            int(k) for k in getattr(core, "visited", ()) if k.isdigit()
        )

    def __getitem__(self, job_id: int) -> PendingInfo:
        info = self._core.get(str(job_id))
        if info is None:
            raise KeyError(job_id)
        return PendingInfo(info.reason, info.eta_s)

    def __iter__(self) -> Iterator[int]:
        return (i for i in self._ids if str(i) in self._core)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class Decisions:
    admissions: list[Admission] = field(default_factory=list)
    pending: Mapping[int, PendingInfo] = field(default_factory=dict)
    preemptions: list[Preemption] = field(default_factory=list)
    # when the answer changes with time alone (a borrower becomes reclaimable): schedule then
    wake_at: float | None = None


class CorePolicy:
    """Runs the scheduling core; keeps the decayed usage history and the run-time estimator
    between cycles (both exported and imported as one JSON-able dict)."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        estimator_config: EstimatorConfig | None = None,
    ) -> None:
        self.scheduler = Scheduler(config or SchedulerConfig())
        self._estimator_config = estimator_config
        self.estimator = RuntimeEstimator(estimator_config)
        self._history: Mapping[str, DecayedUsage] = {}
        # victim job id -> the job it was preempted for (while it checkpoints and stops)
        self._preempted_for: dict[int, int] = {}
        # pending jobs preemptions were made for -> when: they go first while the room made
        # for them is still theirs (RECLAIM_MEMORY_S at most)
        self._reclaiming: dict[int, float] = {}
        # pending job id -> (what its Workload was built from, the Workload): a deep backlog
        # is converted once, not on every pass (the row's updated_at changes with any edit)
        self._workloads: dict[int, tuple[tuple[object, ...], Workload]] = {}
        self._estimates_seen: tuple[int, int] = (0, -1)  # the estimator state they used
        self._estimates_at = -1e18

    # --- memory across cycles and restarts -----------------------------------------------

    def observe_completion(
        self,
        *,
        team: str,
        user: str | None,
        job_name: str | None,
        gpus: int,
        run_s: float,
        max_runtime_s: float | None = None,
    ) -> None:
        """Learn from a job that finished successfully after running `run_s` seconds (its
        service over all attempts: the time it held its GPUs)."""
        features = JobFeatures(team, gpus, user, job_name, max_runtime_s)
        self.estimator.observe(features, run_s)

    def observe_finished_job(self, job: JobRecord, run_s: float) -> None:
        """:meth:`observe_completion` for a store record (its spec gives the features)."""
        self.estimator.observe(_features(JobSpec.model_validate(job.spec)), run_s)

    def export_state(self) -> dict[str, Any]:
        """The usage history and the estimator, as JSON-able data for the store."""
        return {
            "version": STATE_VERSION,
            "usage_history": {
                queue: {"gpu_seconds": dict(u.gpu_seconds), "as_of": u.as_of}
                for queue, u in self._history.items()
            },
            "estimator": self.estimator.to_state(),
        }

    def import_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`export_state` output (e.g. after a restart)."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                f"scheduler state version {state.get('version')!r} is not {STATE_VERSION} "
                "(fix: drop the stored scheduler state; it is rebuilt as jobs run)"
            )
        self._history = {
            str(queue): DecayedUsage(
                gpu_seconds={str(r): float(v) for r, v in record["gpu_seconds"].items()},
                as_of=float(record["as_of"]),
            )
            for queue, record in state.get("usage_history", {}).items()
        }
        self.estimator = RuntimeEstimator.from_state(
            state.get("estimator", {"version": 1}), self._estimator_config
        )

    # --- one cycle ----------------------------------------------------------------------------

    def decide(self, view: ClusterView) -> Decisions:
        snapshot = Snapshot(
            nodes=tuple(_node(n) for n in view.nodes),
            quotas=_quotas(view.teams, view.nodes),
            pending=self._pending_workloads(view),
            running=tuple(self._running(j, view) for j in view.running),
            usage_history=self._history,
        )
        core = self.scheduler.schedule(snapshot, view.now)
        self._history = core.usage_history
        self._preempted_for = {
            job.id: self._preempted_for[job.id]
            for job in view.running
            if job.id in view.terminating and job.id in self._preempted_for
        }
        for p in core.preemptions:
            self._preempted_for[int(p.workload_id)] = int(p.preemptor_id)
            self._reclaiming.setdefault(int(p.preemptor_id), view.now)
        admitted = {int(a.workload_id) for a in core.admissions}
        waiting = {j.id for j in view.pending}
        self._reclaiming = {
            job_id: since
            for job_id, since in self._reclaiming.items()
            if job_id in waiting and job_id not in admitted and view.now - since < RECLAIM_MEMORY_S
        }
        out = Decisions()
        for a in core.admissions:
            placement = {node: list(gpus) for node, gpus in a.placement.gpus.items()}
            out.admissions.append(Admission(int(a.workload_id), placement))
        out.pending = LazyPending(core.pending, [job.id for job in view.pending])
        for p in core.preemptions:
            out.preemptions.append(
                Preemption(int(p.workload_id), int(p.preemptor_id), p.grace_s, p.message)
            )
        out.wake_at = core.wake_at
        return out

    def _pending_workloads(self, view: ClusterView) -> tuple[Workload, ...]:
        """The pending jobs as Workloads, rebuilt only for jobs whose row, attained service,
        reclaim status or nodes to avoid changed, or after the estimator learned."""
        estimates = (id(self.estimator), self.estimator.version)
        if (
            estimates != self._estimates_seen
            and 0 <= view.now - self._estimates_at < ESTIMATES_REFRESH_S
            and self._estimates_seen[0] == estimates[0]
        ):
            # One finished job changes the estimate of every job of its team: rebuilding a
            # deep backlog's Workloads for it would delay the pass that fills the slot it
            # freed. The new estimates come in at most ESTIMATES_REFRESH_S later.
            estimates = self._estimates_seen
        else:
            self._estimates_seen, self._estimates_at = estimates, view.now
        cache, fresh = self._workloads, {}
        out = []
        for job in view.pending:
            key = (
                job.updated_at,
                estimates,
                view.attained_s.get(job.id, 0.0),
                job.id in self._reclaiming,
                view.avoid_nodes.get(job.id, frozenset()),
            )
            hit = cache.get(job.id)
            if hit is None or hit[0] != key:
                hit = (key, self._pending(job, view))
            fresh[job.id] = hit
            out.append(hit[1])
        self._workloads = fresh
        return tuple(out)

    def _pending(self, job: JobRecord, view: ClusterView) -> Workload:
        spec = _spec(job, view)
        workload = workload_from_job(
            str(job.id),
            spec,
            submit_time=job.created_at.timestamp(),
            runtime_estimate_s=self.estimator.estimate(_features(spec)),
            attained_service_s=view.attained_s.get(job.id, 0.0),
        )
        avoid = view.avoid_nodes.get(job.id, frozenset())
        return replace(workload, reclaiming=job.id in self._reclaiming, avoid_nodes=avoid)

    def _running(self, job: JobRecord, view: ClusterView) -> Workload:
        spec = _spec(job, view)
        attained = view.attained_s.get(job.id, 0.0)
        # The current attempt's start: a job re-admitted after a preemption starts afresh (its
        # earlier run time is attained service, not time spent in this placement).
        started = view.attempt_started.get(job.id)
        if started is None:
            started = (job.admitted_at or job.updated_at).timestamp()
        base = workload_from_job(
            str(job.id), spec, submit_time=job.created_at.timestamp(), attained_service_s=attained
        )
        model = next((n.gpu_model for n in view.nodes if n.name in job.placement), None)
        placement = Placement(
            gpu_model=model if spec.resources.gpus_per_node else None,
            gpus={node: tuple(gpus) for node, gpus in job.placement.items()},
            cpu_per_node=spec.resources.cpu,
            mem_per_node=spec.resources.memory,
        )
        typical = self.estimator.estimate(_features(spec))
        return replace(
            base,
            runtime_estimate_s=attempt_estimate(typical, attained, max(0.0, view.now - started)),
            placement=placement,
            start_time=started,
            last_checkpoint_time=view.last_checkpoint.get(job.id),
            terminating=job.id in view.terminating,
            preempted_for=_text(self._preempted_for.get(job.id)),
        )


class KueuePolicy(CorePolicy):
    """Admission handed to Kueue (`tyard server --admission kueue`): every pending job goes to
    the executor at once, unplaced, as a suspended JobSet in its team's LocalQueue; Kueue's
    ClusterQueues decide when it runs and where (flavor), and whom to preempt. tensoryard
    still restarts, checkpoints, accounts and reports; it makes no admission, placement or
    preemption decision of its own (the run-time estimator still learns)."""

    def decide(self, view: ClusterView) -> Decisions:
        out = Decisions()
        for job in view.pending:
            if job.id in view.terminating:
                continue
            spec = _spec(job, view)
            out.admissions.append(
                Admission(job.id, {}, reason=f"handed to Kueue (LocalQueue {spec.team})")
            )
        return out


def _text(job_id: int | None) -> str | None:
    return None if job_id is None else str(job_id)


def _features(spec: JobSpec) -> JobFeatures:
    res = spec.resources
    return JobFeatures(
        team=spec.team,
        gpus=res.nodes * res.gpus_per_node,
        user=spec.user,
        name=spec.name,
        max_runtime_s=spec.max_runtime,
    )


def _node(n: NodeCapacity) -> Node:
    return Node(
        name=n.name,
        gpu_model=n.gpu_model,
        gpus_total=len(n.gpu_indices),
        cpu_total=n.cpu_slots,
        mem_total=n.memory_bytes,
        switch=n.switch,
        block=n.block,
        cordoned=n.cordoned or n.state == "cordoned",
        draining=n.state == "draining",
        unavailable_gpus=n.unavailable_gpus,
    )


def _quotas(teams: tuple[TeamRecord, ...], nodes: tuple[NodeCapacity, ...]) -> QuotaConfig:
    """One queue per team, all in one cohort. A team without a GPU quota may use every GPU."""
    totals: dict[str, int] = {}
    for n in nodes:
        if n.gpu_model:
            totals[n.gpu_model] = totals.get(n.gpu_model, 0) + len(n.gpu_indices)
    queues = []
    for t in teams:
        if t.gpu_quota is None:
            nominal = dict(totals)
        else:
            nominal = {model: min(t.gpu_quota, count) for model, count in totals.items()}
        queues.append(QueueSpec(name=t.name, cohort=COHORT, nominal=nominal, cpu=t.cpu_quota))
    return QuotaConfig.build(queues)


def _spec(job: JobRecord, view: ClusterView) -> JobSpec:
    """The job's spec: parsed once by the caller (`view.specs`), else here."""
    spec = view.specs.get(job.id)
    return spec if spec is not None else JobSpec.model_validate(job.spec)
