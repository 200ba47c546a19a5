"""Snapshot and decision types of the scheduling core (plain frozen dataclasses, no I/O)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from tensoryard.spec.queue import QuotaConfig

__all__ = [
    "Admission",
    "DecayedUsage",
    "Decisions",
    "Node",
    "PendingInfo",
    "Placement",
    "Preemption",
    "Snapshot",
    "Topology",
    "Workload",
]

Topology = Literal["none", "preferred", "required"]


@dataclass(frozen=True, slots=True)
class Node:
    """One machine as the inventory sees it. Free capacity is derived from running workloads.

    Attributes:
        name: unique node name.
        gpu_model: model of its GPUs, like "H100"; None for a CPU-only node.
        gpus_total: GPUs on the node (0 for CPU-only nodes).
        cpu_total: CPU cores the scheduler may hand out.
        mem_total: bytes the scheduler may hand out; 0 means memory is not tracked.
        switch: leaf switch the node hangs off ("" when unknown: every node its own group).
        block: spine block / pod above the switch ("" when unknown).
        cordoned: takes no new workloads (running ones stay).
        draining: takes no new workloads; running ones are being moved off.
        unavailable_gpus: GPU indices that are unhealthy or used outside the scheduler.
    """

    name: str
    gpu_model: str | None = None
    gpus_total: int = 0
    cpu_total: float = 0.0
    mem_total: int = 0
    switch: str = ""
    block: str = ""
    cordoned: bool = False
    draining: bool = False
    unavailable_gpus: tuple[int, ...] = ()

    @property
    def schedulable(self) -> bool:
        """True when new workloads may land here."""
        return not (self.cordoned or self.draining)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an admitted workload runs.

    Attributes:
        gpu_model: GPU model charged to the queue's quota (None for CPU-only workloads).
        gpus: node name -> GPU indices on that node (empty tuples for CPU-only workloads).
        cpu_per_node: CPU cores held on each node.
        mem_per_node: bytes held on each node.
    """

    gpu_model: str | None
    gpus: Mapping[str, tuple[int, ...]]
    cpu_per_node: float = 0.0
    mem_per_node: int = 0

    @property
    def nodes(self) -> tuple[str, ...]:
        """Names of the nodes used, in placement order."""
        return tuple(self.gpus)

    @property
    def total_gpus(self) -> int:
        return sum(len(ix) for ix in self.gpus.values())


@dataclass(frozen=True, slots=True)
class Workload:
    """A gang of `nodes` identical workers, pending or running.

    Attributes:
        id: unique id (the job id as text).
        queue: name of the queue (team) it is charged to.
        nodes: gang size in nodes; all are placed or none.
        gpus_per_node: GPUs on each node; 0 for CPU-only workloads.
        cpu_per_node: CPU cores on each node.
        mem_per_node: bytes on each node (0: not tracked).
        gpu_model: required GPU model, or None for any model the queue has quota for.
        priority: higher goes first and may preempt lower.
        submit_time: when it was (first) submitted, in the caller's clock (seconds).
        preemptible: False protects it from every preemption.
        topology: "required" keeps a multi-node gang on the fewest leaf switches it can ever
            use; "preferred" tries to; "none" ignores switches.
        runtime_estimate_s: expected run time of one attempt (spec max_runtime or history);
            None when unknown. Used for start-time estimates and backfill only.
        attained_service_s: seconds it already ran in earlier attempts (observed, not a guess).
        placement: where it runs (running workloads only).
        start_time: when the current attempt started (running workloads only).
        last_checkpoint_time: when its last checkpoint was written (None: never).
        terminating: a preemption or cancel was already signalled; it still holds resources.
        preempted_for: for a terminating workload, the id of the pending workload it was
            preempted for; its resources count only for that one in preemption searches, so
            another preemptor does not take them and make the first issue new preemptions.
            None when unknown (any preemptor may count them).
        reclaiming: for a pending workload, preemptions were made for it in an earlier cycle
            (its victims are stopping or have stopped): it is visited first in its queue, and
            before other queues' heads of its priority, so that the room made for it is not
            taken by a workload ahead of it (which another queue would then reclaim from, and
            so on: a preemption livelock). The caller keeps this memory (see CorePolicy).
        avoid_nodes: nodes it must not be placed on (where its attempts failed twice: see
            the controller); pending workloads only.
    """

    id: str
    queue: str
    nodes: int = 1
    gpus_per_node: int = 0
    cpu_per_node: float = 0.0
    mem_per_node: int = 0
    gpu_model: str | None = None
    priority: int = 0
    submit_time: float = 0.0
    preemptible: bool = True
    topology: Topology = "preferred"
    runtime_estimate_s: float | None = None
    attained_service_s: float = 0.0
    placement: Placement | None = None
    start_time: float | None = None
    last_checkpoint_time: float | None = None
    terminating: bool = False
    preempted_for: str | None = None
    reclaiming: bool = False
    avoid_nodes: frozenset[str] = frozenset()

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def total_cpu(self) -> float:
        return self.nodes * self.cpu_per_node

    def expected_end(self) -> float | None:
        """start_time + runtime estimate for a running workload; None when unknown."""
        if self.start_time is None or self.runtime_estimate_s is None:
            return None
        return self.start_time + self.runtime_estimate_s

    def service_s(self, now: float) -> float:
        """Seconds run so far over all attempts (earlier attempts plus the current one)."""
        current = now - self.start_time if self.start_time is not None else 0.0
        return self.attained_service_s + max(0.0, current)


@dataclass(frozen=True, slots=True)
class DecayedUsage:
    """A queue's past usage: GPU-seconds (per GPU model or "cpu") decayed to `as_of`."""

    gpu_seconds: Mapping[str, float]
    as_of: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling cycle looks at. Built by the caller; never mutated.

    Attributes:
        nodes: every node (cordoned and draining ones included).
        quotas: validated queues and cohorts (``QuotaConfig.build``).
        pending: workloads waiting for admission (order does not matter).
        running: admitted workloads with their placements.
        usage_history: queue -> decayed past usage, as returned in ``Decisions.usage_history``
            of the previous cycle (empty on the first cycle).
    """

    nodes: tuple[Node, ...]
    quotas: QuotaConfig
    pending: tuple[Workload, ...] = ()
    running: tuple[Workload, ...] = ()
    usage_history: Mapping[str, DecayedUsage] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Admission:
    """Start `workload_id` on `placement` now."""

    workload_id: str
    placement: Placement
    borrowing: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    """Ask `workload_id` to checkpoint and stop within `grace_s` seconds.

    Attributes:
        workload_id: the victim.
        preemptor_id: the pending workload it makes room for.
        reason: "reclaim" (its queue borrowed quota the lender needs back), "priority" (a
            higher-priority workload of its own queue needs the room), "attained-service"
            (it has run long; a newcomer with less service takes its turn at a checkpoint),
            "borrowed-service" (the same, for a long runner of another queue that runs on
            borrowed quota; its queue keeps its nominal quota) or "defragment" (a small job is
            moved to GPUs free elsewhere so that a gang gets whole nodes).
        grace_s: seconds to write a checkpoint before it is stopped.
        work_lost_gpu_s: GPU-seconds since its last checkpoint (what the preemption costs).
        message: a sentence for the victim's owner.
    """

    workload_id: str
    preemptor_id: str
    reason: str
    grace_s: float
    work_lost_gpu_s: float
    message: str


@dataclass(frozen=True, slots=True)
class PendingInfo:
    """Why a workload still waits, and when it may start.

    Attributes:
        reason: one sentence a person can act on.
        code: "quota" | "capacity" | "reserved" | "waiting" | "preempting" | "unschedulable".
        position: workloads ahead of it in its own queue.
        eta_s: estimated start time (same clock as `now`), or None when unknown.
        details: structured facts behind the sentence (needed, used, nominal, ...).
    """

    reason: str
    code: str
    position: int
    eta_s: float | None
    details: Mapping[str, object] = field(default_factory=dict)


class _EmptyPending(Mapping[str, PendingInfo]):
    def __getitem__(self, key: str) -> PendingInfo:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class Decisions:
    """The result of one cycle.

    Attributes:
        admissions: workloads to start now, in admission order.
        preemptions: victims to signal now (they keep running for their grace period).
        pending: workload id -> PendingInfo for every pending workload not admitted. The
            mapping builds each PendingInfo when it is read, so a cycle over 100k pending
            workloads does not pay for sentences nobody reads.
        usage_history: the snapshot's usage history decayed to `now` with the current
            running usage added; feed it into the next snapshot.
        reservations: workload id -> node names held for it this cycle: head-of-line
            reservations, and the nodes a preemptor waits on while its victims checkpoint.
        wake_at: when this cycle's answer changes with time alone (a borrower that a pending
            workload could reclaim passes ``reclaim_min_run_s``); None: only on events. A
            caller that schedules on events should also schedule then.
    """

    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    pending: Mapping[str, PendingInfo] = field(default_factory=_EmptyPending)
    usage_history: Mapping[str, DecayedUsage] = field(default_factory=dict)
    reservations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    wake_at: float | None = None

    @property
    def admitted(self) -> dict[str, Placement]:
        """workload id -> placement, for callers that prefer a mapping."""
        return {a.workload_id: a.placement for a in self.admissions}
