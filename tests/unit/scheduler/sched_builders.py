"""Fluent builders for scheduler tests: make_workload("a", queue="nlp").gpus(8).nodes(2).obj()."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from tensoryard.scheduler import (
    Decisions,
    Node,
    Placement,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tensoryard.spec.queue import CohortSpec, QueueSpec, QuotaConfig


class WorkloadBuilder:
    """Builds a Workload step by step; `.obj()` returns the frozen result."""

    def __init__(self, workload_id: str, queue: str) -> None:
        self._fields: dict[str, Any] = {
            "id": workload_id,
            "queue": queue,
            "gpus_per_node": 1,
            "cpu_per_node": 1.0,
        }

    def gpus(self, per_node: int) -> WorkloadBuilder:
        self._fields["gpus_per_node"] = per_node
        return self

    def nodes(self, count: int) -> WorkloadBuilder:
        self._fields["nodes"] = count
        return self

    def cpu(self, cores: float) -> WorkloadBuilder:
        self._fields["cpu_per_node"] = cores
        return self

    def cpu_only(self, cores: float = 1.0) -> WorkloadBuilder:
        self._fields["gpus_per_node"] = 0
        self._fields["cpu_per_node"] = cores
        return self

    def memory(self, nbytes: int) -> WorkloadBuilder:
        self._fields["mem_per_node"] = nbytes
        return self

    def model(self, gpu_model: str) -> WorkloadBuilder:
        self._fields["gpu_model"] = gpu_model
        return self

    def priority(self, value: int) -> WorkloadBuilder:
        self._fields["priority"] = value
        return self

    def submitted(self, at: float) -> WorkloadBuilder:
        self._fields["submit_time"] = at
        return self

    def estimate(self, seconds: float) -> WorkloadBuilder:
        self._fields["runtime_estimate_s"] = seconds
        return self

    def attained(self, seconds: float) -> WorkloadBuilder:
        self._fields["attained_service_s"] = seconds
        return self

    def topology(self, kind: str) -> WorkloadBuilder:
        self._fields["topology"] = kind
        return self

    def not_preemptible(self) -> WorkloadBuilder:
        self._fields["preemptible"] = False
        return self

    def terminating(self) -> WorkloadBuilder:
        self._fields["terminating"] = True
        return self

    def running_on(
        self,
        gpus: Mapping[str, Iterable[int]],
        *,
        start: float,
        checkpoint: float | None = None,
        model: str | None = "H100",
    ) -> WorkloadBuilder:
        """Mark it running on `gpus` (node -> GPU indices) since `start`."""
        per_node = {name: tuple(ix) for name, ix in gpus.items()}
        self._fields["nodes"] = len(per_node)
        if self._fields["gpus_per_node"] > 0:
            self._fields["gpus_per_node"] = len(next(iter(per_node.values())))
        self._fields["placement"] = Placement(
            model if self._fields["gpus_per_node"] > 0 else None,
            per_node,
            self._fields["cpu_per_node"],
            self._fields.get("mem_per_node", 0),
        )
        self._fields["start_time"] = start
        self._fields["last_checkpoint_time"] = checkpoint
        return self

    def obj(self) -> Workload:
        return Workload(**self._fields)


def make_workload(workload_id: str, queue: str = "team-a") -> WorkloadBuilder:
    return WorkloadBuilder(workload_id, queue)


def make_nodes(
    count: int,
    *,
    gpus: int = 8,
    model: str | None = "H100",
    per_switch: int | None = None,
    cpu: float = 64.0,
    prefix: str = "n",
    mem: int = 0,
) -> tuple[Node, ...]:
    """`count` identical nodes named n0, n1, ...; `per_switch` consecutive nodes share a switch."""
    return tuple(
        Node(
            name=f"{prefix}{i}",
            gpu_model=model if gpus else None,
            gpus_total=gpus,
            cpu_total=cpu,
            mem_total=mem,
            switch=f"{prefix}sw{i // per_switch}" if per_switch else "",
        )
        for i in range(count)
    )


def make_quotas(
    queues: Mapping[str, Mapping[str, int]],
    *,
    cohort: str | None = "pool",
    **extra: Mapping[str, Any],
) -> QuotaConfig:
    """Queues with nominal quotas, all in one cohort; `extra[name]` adds fields to a queue."""
    specs = [
        QueueSpec(name=name, cohort=cohort, nominal=dict(nominal), **dict(extra.get(name, {})))
        for name, nominal in queues.items()
    ]
    cohorts = [CohortSpec(name=cohort)] if cohort else []
    return QuotaConfig.build(specs, cohorts)


def schedule(
    nodes: tuple[Node, ...],
    quotas: QuotaConfig,
    pending: Iterable[Workload] = (),
    running: Iterable[Workload] = (),
    *,
    now: float = 1000.0,
    config: SchedulerConfig | None = None,
) -> Decisions:
    snap = Snapshot(nodes=nodes, quotas=quotas, pending=tuple(pending), running=tuple(running))
    return Scheduler(config or SchedulerConfig()).schedule(snap, now)


def apply(
    decisions: Decisions,
    pending: list[Workload],
    running: list[Workload],
    *,
    now: float,
    stop_victims: bool = True,
) -> tuple[list[Workload], list[Workload]]:
    """Carry decisions out: admitted start now; victims stop (or turn terminating)."""
    admitted = decisions.admitted
    victims = {p.workload_id for p in decisions.preemptions}
    still_pending = [w for w in pending if w.id not in admitted]
    started = [
        replace(w, placement=admitted[w.id], start_time=now, last_checkpoint_time=now)
        for w in pending
        if w.id in admitted
    ]
    kept: list[Workload] = []
    for w in running:
        if w.id in victims:
            if not stop_victims:
                kept.append(replace(w, terminating=True))
            continue
        kept.append(w)
    return still_pending, kept + started


def gpus_in_use(running: Iterable[Workload]) -> list[tuple[str, int]]:
    """Every (node, GPU index) held, with repeats (so a double allocation shows up)."""
    return [
        (node, g)
        for w in running
        if w.placement is not None
        for node, ix in w.placement.gpus.items()
        for g in ix
    ]
