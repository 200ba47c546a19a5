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

import re
from collections.abc import Mapping, Sequence
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
from tensoryard.scheduler.config import RECLAIM_MEMORY_S
from tensoryard.scheduler.estimates import (
    EstimatorConfig,
    JobFeatures,
    RuntimeEstimator,
    attempt_estimate,
)
from tensoryard.spec.job import JobSpec
from tensoryard.store import AttemptRecord, JobRecord, TeamRecord

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


@dataclass
class Decisions:
    admissions: list[Admission] = field(default_factory=list)
    pending: dict[int, PendingInfo] = field(default_factory=dict)
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
            pending=tuple(self._pending(j, view) for j in view.pending),
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
        for job in view.pending:
            info = core.pending.get(str(job.id))
            if info is not None:
                out.pending[job.id] = PendingInfo(info.reason, info.eta_s)
        for p in core.preemptions:
            out.preemptions.append(
                Preemption(int(p.workload_id), int(p.preemptor_id), p.grace_s, p.message)
            )
        out.wake_at = core.wake_at
        return out

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


EXCLUDE_AFTER_FAILURES = 2  # a node where this many of a job's attempts failed is avoided


def failed_on(attempts: Sequence[AttemptRecord]) -> dict[str, list[int]]:
    """node -> numbers of the job's attempts that failed because of something on that node.

    A failed or lost single-node attempt counts against its node. A multi-node attempt counts
    only against the node of its root cause ("rank 1 exited ... on node n2": the first failed
    rank listed; its peers fail after it) or, without one, the nodes its reason names (a lost
    node): a bug in the job fails every node of the gang alike and is no reason to avoid any.
    Attempts recorded without their nodes count against none."""
    out: dict[str, list[int]] = {}
    for a in attempts:
        if a.state not in ("failed", "lost") or not a.nodes:
            continue
        root = _ROOT_NODE.search(a.reason)  # "rank 1 exited with code 3 on node n2; ..."
        if len(a.nodes) == 1:
            named = list(a.nodes)
        elif root and root.group(1) in a.nodes:
            named = [root.group(1)]  # the root cause's node (the first failed rank listed)
        else:
            named = [n for n in a.nodes if _names(a.reason, n)]
        for node in named:
            out.setdefault(node, []).append(a.number)
    return out


_ROOT_NODE = re.compile(r"\bon node ([\w.-]+?)(?=[;,)]|\s|$)")


def _names(text: str, node: str) -> bool:
    """``text`` names ``node`` as a whole word (node "a" is not in "not ready")."""
    return re.search(rf"(?<![\w.-]){re.escape(node)}(?![\w.-])", text) is not None


def _usable(node: NodeCapacity, spec: JobSpec) -> bool:
    """Ready, not cordoned, of the job's GPU model, with at least the GPUs of one worker."""
    model = spec.scheduling.gpu_model
    return (
        node.state == "ready"
        and not node.cordoned
        and len(node.gpu_indices) >= spec.resources.gpus_per_node
        and (model is None or node.gpu_model == model)
    )


def nodes_to_avoid(
    attempts: Sequence[AttemptRecord], nodes: Sequence[NodeCapacity], spec: JobSpec
) -> tuple[frozenset[str], str]:
    """The nodes a job's next placement avoids, and why (an event's text; "" when none).

    Nothing is avoided when that would leave fewer usable nodes (ready, of the GPU model it
    asks for, with enough GPUs) than the job needs: it would wait forever instead."""
    failed = {
        n: nums for n, nums in failed_on(attempts).items() if len(nums) >= EXCLUDE_AFTER_FAILURES
    }
    if not failed:
        return frozenset(), ""
    res = spec.resources
    left = [n.name for n in nodes if _usable(n, spec) and n.name not in failed]
    where = "; ".join(
        f"{node}: attempts {', '.join(map(str, nums))} failed there"
        for node, nums in sorted(failed.items())
    )
    if len(left) < res.nodes:
        return frozenset(), (
            f"not avoiding {', '.join(sorted(failed))} ({where}): only {len(left)} other usable "
            f"node(s) for {res.nodes} needed"
        )
    return frozenset(failed), f"next placement avoids {', '.join(sorted(failed))} ({where})"


def replacement_placement(
    placement: Mapping[str, Sequence[int]],
    gone: frozenset[str],
    spec: JobSpec,
    nodes: Sequence[NodeCapacity],
    others: Sequence[tuple[Mapping[str, Sequence[int]], JobSpec]],
    avoid: frozenset[str] = frozenset(),
) -> dict[str, list[int]] | None:
    """Partial gang recovery: ``placement`` with its nodes in ``gone`` swapped for spare nodes
    that are free right now, or None when there are not enough spares (then the job is
    requeued whole).

    A spare is ready, not cordoned, of the job's GPU model, outside the placement, ``gone``
    and ``avoid``, with the GPUs, CPU and memory of one worker free after what ``others``
    (every other job holding capacity: their placements and specs) take. Spares under a leaf
    switch the kept nodes use come first, then the fullest (best fit)."""
    res = spec.resources
    keep = {n: list(g) for n, g in placement.items() if n not in gone}
    need = len(placement) - len(keep)
    if need <= 0 or not keep:
        return None
    used_gpus: dict[str, set[int]] = {}
    used_cpu: dict[str, float] = {}
    used_mem: dict[str, int] = {}
    for held, other in others:
        for node, gpus in held.items():
            used_gpus.setdefault(node, set()).update(gpus)
            used_cpu[node] = used_cpu.get(node, 0.0) + other.resources.cpu
            used_mem[node] = used_mem.get(node, 0) + (other.resources.memory or 0)
    by_name = {n.name: n for n in nodes}
    switches = {by_name[n].switch for n in keep if n in by_name and by_name[n].switch}
    candidates: list[tuple[bool, int, str, list[int]]] = []
    for n in nodes:
        if n.name in placement or n.name in gone or n.name in avoid or not _usable(n, spec):
            continue
        taken = used_gpus.get(n.name, set()) | set(n.unavailable_gpus)
        free = [g for g in n.gpu_indices if g not in taken]
        if len(free) < res.gpus_per_node:
            continue
        if n.cpu_slots - used_cpu.get(n.name, 0.0) + 1e-9 < res.cpu:
            continue
        if res.memory and n.memory_bytes - used_mem.get(n.name, 0) < res.memory:
            continue
        candidates.append((n.switch not in switches, len(free), n.name, free))
    if len(candidates) < need:
        return None
    chosen = sorted(candidates)[:need]
    return {**keep, **{name: free[: res.gpus_per_node] for _, _, name, free in chosen}}
