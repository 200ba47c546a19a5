"""The scheduler loop's view: a snapshot of jobs and capacity in, decisions out.

`AdmissionPolicy` is the seam between the control plane and the scheduling core: the loop builds
a `ClusterView` from the store and the agent's inventory, the policy returns `Decisions`, and the
loop carries them out. The policy does no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tensoryard.spec.job import JobSpec
from tensoryard.store import JobRecord

__all__ = [
    "Admission",
    "AdmissionPolicy",
    "ClusterView",
    "Decisions",
    "FifoCapacityPolicy",
    "NodeCapacity",
    "PendingInfo",
]


@dataclass(frozen=True)
class NodeCapacity:
    """One node as the scheduler sees it."""

    name: str
    cpu_slots: float
    memory_bytes: int
    gpu_indices: tuple[int, ...] = ()
    gpu_model: str | None = None


@dataclass(frozen=True)
class ClusterView:
    """What one scheduling cycle looks at."""

    nodes: tuple[NodeCapacity, ...]
    pending: tuple[JobRecord, ...]  # in submission order
    running: tuple[JobRecord, ...]  # jobs holding capacity (admitted .. restarting)
    now: float


@dataclass(frozen=True)
class Admission:
    job_id: int
    placement: dict[str, list[int]]  # node -> GPU indices ([] on CPU-only nodes)


@dataclass(frozen=True)
class PendingInfo:
    reason: str
    eta_s: float | None = None  # unix time of the estimated start, None when unknown


@dataclass
class Decisions:
    admissions: list[Admission] = field(default_factory=list)
    pending: dict[int, PendingInfo] = field(default_factory=dict)


class AdmissionPolicy(Protocol):
    def decide(self, view: ClusterView) -> Decisions: ...


def _spec(job: JobRecord) -> JobSpec:
    return JobSpec.model_validate(job.spec)


@dataclass
class _Free:
    cpu: float
    memory: int
    gpus: list[int]


class FifoCapacityPolicy:
    """Strict FIFO by (priority desc, submit order) over node capacity, gangs all or nothing.

    The simplest honest policy; the scheduling core replaces it for multi-team clusters.
    """

    def decide(self, view: ClusterView) -> Decisions:
        free = {n.name: _Free(n.cpu_slots, n.memory_bytes, list(n.gpu_indices)) for n in view.nodes}
        for job in view.running:
            self._take(free, job.placement, _spec(job))
        decisions = Decisions()
        ordered = sorted(view.pending, key=lambda j: (-j.priority, j.created_at, j.id))
        blocked_by: JobRecord | None = None
        for position, job in enumerate(ordered):
            spec = _spec(job)
            if blocked_by is not None:
                decisions.pending[job.id] = PendingInfo(
                    f"waiting behind job {blocked_by.id} ({blocked_by.name}); "
                    f"{position} job(s) ahead in the queue"
                )
                continue
            placement, why = self._place(free, spec, view.nodes)
            if placement is None:
                decisions.pending[job.id] = PendingInfo(why)
                blocked_by = job
                continue
            self._take(free, placement, spec)
            decisions.admissions.append(Admission(job.id, placement))
        return decisions

    @staticmethod
    def _take(free: dict[str, _Free], placement: dict[str, list[int]], spec: JobSpec) -> None:
        for node, gpus in placement.items():
            slot = free.get(node)
            if slot is None:
                continue
            slot.cpu -= spec.resources.cpu
            slot.memory -= spec.resources.memory
            slot.gpus = [g for g in slot.gpus if g not in gpus]

    @staticmethod
    def _place(
        free: dict[str, _Free], spec: JobSpec, nodes: Sequence[NodeCapacity]
    ) -> tuple[dict[str, list[int]] | None, str]:
        res = spec.resources
        if res.nodes > len(nodes):
            return None, (
                f"needs {res.nodes} nodes; this cluster has {len(nodes)} "
                "(reduce resources.nodes or run on a larger cluster)"
            )
        fits_ever = [
            n
            for n in nodes
            if n.cpu_slots >= res.cpu
            and n.memory_bytes >= res.memory
            and len(n.gpu_indices) >= res.gpus_per_node
        ]
        if len(fits_ever) < res.nodes:
            biggest = max(nodes, key=lambda n: (len(n.gpu_indices), n.cpu_slots))
            return None, (
                f"needs {res.cpu:g} CPU, {res.memory / 2**30:.1f} GiB and {res.gpus_per_node} GPU "
                f"per node on {res.nodes} node(s); the largest node has {biggest.cpu_slots:g} CPU, "
                f"{biggest.memory_bytes / 2**30:.1f} GiB, {len(biggest.gpu_indices)} GPU: it can "
                "never start as specified"
            )
        chosen: dict[str, list[int]] = {}
        for node in fits_ever:
            slot = free[node.name]
            if (
                slot.cpu >= res.cpu - 1e-9
                and slot.memory >= res.memory
                and len(slot.gpus) >= res.gpus_per_node
            ):
                chosen[node.name] = slot.gpus[: res.gpus_per_node]
                if len(chosen) == res.nodes:
                    return chosen, ""
        total_free_cpu = sum(max(0.0, s.cpu) for s in free.values())
        total_free_gpu = sum(len(s.gpus) for s in free.values())
        return None, (
            f"needs {res.nodes} node(s) x ({res.cpu:g} CPU, {res.gpus_per_node} GPU); "
            f"free now: {total_free_cpu:g} CPU, {total_free_gpu} GPU; waits for running jobs to end"
        )
