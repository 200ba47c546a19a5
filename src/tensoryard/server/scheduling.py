"""The scheduler loop's seam: store records and inventory in, the pure core's decisions out.

`CorePolicy` turns what the control plane knows (nodes, teams, pending and running jobs) into a
`tensoryard.scheduler.Snapshot`, runs the same `Scheduler` the simulator replays, and hands the
decisions back in the store's terms (job ids, node -> GPU index lists). No I/O happens here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
from tensoryard.spec.job import JobSpec
from tensoryard.store import JobRecord, TeamRecord

__all__ = [
    "Admission",
    "ClusterView",
    "CorePolicy",
    "Decisions",
    "NodeCapacity",
    "PendingInfo",
    "Preemption",
]

COHORT = "everyone"


@dataclass(frozen=True)
class NodeCapacity:
    """One node as the agent reports it."""

    name: str
    cpu_slots: float
    memory_bytes: int
    gpu_indices: tuple[int, ...] = ()
    gpu_model: str | None = None


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


@dataclass(frozen=True)
class Admission:
    job_id: int
    placement: dict[str, list[int]]  # node -> GPU indices ([] on CPU-only nodes)


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


@dataclass
class Decisions:
    admissions: list[Admission] = field(default_factory=list)
    pending: dict[int, PendingInfo] = field(default_factory=dict)
    preemptions: list[Preemption] = field(default_factory=list)


class CorePolicy:
    """Runs the scheduling core; keeps the decayed usage history between cycles."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.scheduler = Scheduler(config or SchedulerConfig())
        self._history: Mapping[str, DecayedUsage] = {}

    def decide(self, view: ClusterView) -> Decisions:
        snapshot = Snapshot(
            nodes=tuple(_node(n) for n in view.nodes),
            quotas=_quotas(view.teams, view.nodes),
            pending=tuple(_pending(j, view) for j in view.pending),
            running=tuple(_running(j, view) for j in view.running),
            usage_history=self._history,
        )
        core = self.scheduler.schedule(snapshot, view.now)
        self._history = core.usage_history
        out = Decisions()
        for a in core.admissions:
            placement = {node: list(gpus) for node, gpus in a.placement.gpus.items()}
            out.admissions.append(Admission(int(a.workload_id), placement))
        for job in view.pending:
            info = core.pending.get(str(job.id))
            if info is not None:
                out.pending[job.id] = PendingInfo(info.reason, info.eta_s)
        for p in core.preemptions:
            out.preemptions.append(
                Preemption(int(p.workload_id), int(p.preemptor_id), p.grace_s, p.message)
            )
        return out


def _node(n: NodeCapacity) -> Node:
    return Node(
        name=n.name,
        gpu_model=n.gpu_model,
        gpus_total=len(n.gpu_indices),
        cpu_total=n.cpu_slots,
        mem_total=n.memory_bytes,
        unavailable_gpus=(),
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
    spec = view.specs.get(job.id)
    return spec if spec is not None else JobSpec.model_validate(job.spec)


def _pending(job: JobRecord, view: ClusterView) -> Workload:
    return workload_from_job(
        str(job.id),
        _spec(job, view),
        submit_time=job.created_at.timestamp(),
        attained_service_s=view.attained_s.get(job.id, 0.0),
    )


def _running(job: JobRecord, view: ClusterView) -> Workload:
    spec = _spec(job, view)
    base = workload_from_job(
        str(job.id),
        spec,
        submit_time=job.created_at.timestamp(),
        attained_service_s=view.attained_s.get(job.id, 0.0),
    )
    model = next((n.gpu_model for n in view.nodes if n.name in job.placement), None)
    placement = Placement(
        gpu_model=model if spec.resources.gpus_per_node else None,
        gpus={node: tuple(gpus) for node, gpus in job.placement.items()},
        cpu_per_node=spec.resources.cpu,
        mem_per_node=spec.resources.memory,
    )
    # The current attempt's start: a job re-admitted after a preemption starts afresh (its
    # earlier run time is attained service, not time spent in this placement).
    started = view.attempt_started.get(job.id)
    if started is None:
        started = (job.admitted_at or job.updated_at).timestamp()
    return Workload(
        **{
            **{f: getattr(base, f) for f in Workload.__dataclass_fields__},
            "placement": placement,
            "start_time": started,
            "last_checkpoint_time": view.last_checkpoint.get(job.id),
            "terminating": job.id in view.terminating,
        }
    )
