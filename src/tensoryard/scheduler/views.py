"""What a cycle knows about the cluster, each part owning its data behind methods.

- :class:`CapacityView` (phase 1): the free capacity of every node (a ``ClusterState``), the
  per-model maxima, and the caches that stay valid while capacity only shrinks;
- :class:`QuotaView` (phase 2): the quota tree with its usage, the fair-share history, and
  the quota charged by this cycle's admissions, victims and terminating work; usage changes
  only through :meth:`QuotaView.charge`;
- :class:`RunningIndex` (phase 2): the running workloads indexed for victim searches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from tensoryard.scheduler.accounting import charge_of, resource_of
from tensoryard.scheduler.model import DecayedUsage, Node, Workload
from tensoryard.scheduler.quota import QuotaTree
from tensoryard.scheduler.state import CPU_MODEL, INF, ClusterState
from tensoryard.spec.queue import CPU_RESOURCE

__all__ = ["CapacityView", "Cost", "QuotaView", "RunningIndex", "Shape"]

Cost = tuple[float, int, float, str]
"""A victim's cost: (work lost in GPU-seconds, priority, -start time, id); cheapest first."""

Shape = tuple[int, int, float, int, bool]
"""A placement request: (nodes, GPUs, CPU and memory per node, strict topology)."""

ModelsKey = tuple[str, str | None, int, float, int, int]
"""(queue, GPU model asked for, GPUs, CPU and memory per node, nodes)."""

_FIRST = itemgetter(0)


@dataclass(slots=True)
class CapacityView:
    """Free capacity per node and model, the largest node per model, failure caches."""

    state: ClusterState
    nodes: Sequence[Node]
    gpu_models: list[str]
    capacity: dict[str, float]
    max_gpus_per_node: dict[str, int]
    max_cpu_per_node: dict[str, float]
    max_mem_per_node: dict[str, int]
    _failed: dict[str, list[Shape]] = field(default_factory=dict)
    _big_nodes: dict[tuple[str, int], int] = field(default_factory=dict)
    _max_cpu_free: float = 0.0
    _max_cpu_free_key: tuple[int, int, int] | None = None
    _models: dict[ModelsKey, tuple[str, ...]] = field(default_factory=dict)
    _gpu_free: bool = False
    _gpu_free_key: tuple[int, int, int] | None = None

    @classmethod
    def build(cls, nodes: Sequence[Node], running: Sequence[Workload], now: float) -> CapacityView:
        state = ClusterState(nodes, running, now)
        capacity: dict[str, float] = {CPU_RESOURCE: 0.0}
        max_cpu: dict[str, float] = {}
        max_mem: dict[str, int] = {}
        for node in nodes:
            if node.gpu_model:
                capacity[node.gpu_model] = capacity.get(node.gpu_model, 0.0) + node.gpus_total
            capacity[CPU_RESOURCE] += node.cpu_total
            # Largest CPU and memory of one schedulable node per index key: a workload asking
            # more per node can never start there, however long it waits.
            if node.schedulable:
                key = node.gpu_model or CPU_MODEL
                max_cpu[key] = max(max_cpu.get(key, 0.0), node.cpu_total)
                max_mem[key] = max(max_mem.get(key, 0), node.mem_total)
        return cls(
            state=state,
            nodes=nodes,
            gpu_models=[m for m in state.open if m != CPU_MODEL],
            capacity=capacity,
            max_gpus_per_node={m: ix.max_gpus for m, ix in state.open.items()},
            max_cpu_per_node=max_cpu,
            max_mem_per_node=max_mem,
        )

    def known_to_fail(self, cache: str, shape: Shape) -> bool:
        """True when a request no larger than `shape` already found no room in the index
        that `cache` names (an index only loses capacity within a cycle)."""
        strict = shape[4]
        for n, g, c, m, s in self._failed.get(cache, ()):
            covered = n <= shape[0] and g <= shape[1] and c <= shape[2] and m <= shape[3]
            if covered and ((not s) or strict):
                return True
        return False

    def note_failure(self, cache: str, shape: Shape, limit: int) -> None:
        """Remember that `shape` found no room (at most `limit` shapes per cache)."""
        failed = self._failed.setdefault(cache, [])
        if len(failed) < limit:
            failed.append(shape)

    def any_gpu_free(self, key: tuple[int, int, int]) -> bool:
        """Whether any open GPU is free, read again when `key` (the count of the cycle's
        admissions, reservations and claims, which is all that takes open GPUs) changes."""
        if self._gpu_free_key != key:
            self._gpu_free_key = key
            self._gpu_free = any(self.state.open[m].total_free > 0 for m in self.gpu_models)
        return self._gpu_free

    def known_models(self, key: ModelsKey) -> tuple[str, ...] | None:
        """The models a workload of this (queue, shape) may use, if already worked out."""
        return self._models.get(key)

    def remember_models(self, key: ModelsKey, models: tuple[str, ...]) -> None:
        self._models[key] = models

    def schedulable_with(self, model: str, gpus: int) -> int:
        """Schedulable nodes of `model` with at least `gpus` GPUs (memoized)."""
        key = (model, gpus)
        count = self._big_nodes.get(key)
        if count is None:
            count = self._big_nodes[key] = sum(
                1
                for n in self.nodes
                if n.schedulable and n.gpu_model == model and n.gpus_total >= gpus
            )
        return count

    def max_cpu_free(self, key: tuple[int, int, int]) -> float:
        """The largest free CPU of any node, open or held, read again when `key` (the count
        of the cycle's admissions, reservations and claims) changes."""
        if self._max_cpu_free_key != key:
            self._max_cpu_free_key = key
            self._max_cpu_free = max(
                (
                    node.cpu_free
                    for indexes in (self.state.open, self.state.held)
                    for index in indexes.values()
                    for node in index.nodes.values()
                ),
                default=0.0,
            )
        return self._max_cpu_free


Key = tuple[str, str]
"""(queue, resource)."""


@dataclass(slots=True)
class QuotaView:
    """Quota usage in the tree, fair-share history, and what this cycle charged to whom."""

    tree: QuotaTree
    history: dict[str, DecayedUsage]
    _usage: dict[str, dict[str, float]] = field(default_factory=dict)
    # Quota charged by this cycle's admissions: reclaim looks at what a queue borrows with
    # work that already runs, not with work admitted just now.
    _admitted: dict[Key, float] = field(default_factory=dict)
    # Quota of victims already chosen this cycle (still charged until they stop), so that two
    # preemptors do not both count the same borrowed GPUs as reclaimable.
    _victims: dict[Key, float] = field(default_factory=dict)
    # Quota of terminating workloads (still charged until they stop): reclaim counts only
    # the borrowing of work that stays.
    _leaving: dict[Key, float] = field(default_factory=dict)
    # the smallest need that failed quota this cycle (quota only shrinks within a cycle)
    _failed: dict[Key, float] = field(default_factory=dict)
    _final: dict[Key, dict[str, object]] = field(default_factory=dict)

    def charge(self, queue: str, resource: str, amount: float, cpu: float, gpu: bool) -> None:
        """Add `amount` of `resource` (and `cpu` cores for a GPU workload) to a queue."""
        if not self.tree.has_queue(queue):
            return
        self.tree.add_usage(queue, resource, amount)
        usage = self._usage.setdefault(queue, {})
        usage[resource] = usage.get(resource, 0.0) + amount
        if gpu and cpu:
            self.tree.add_usage(queue, CPU_RESOURCE, cpu)
            usage[CPU_RESOURCE] = usage.get(CPU_RESOURCE, 0.0) + cpu

    def uncharge(self, w: Workload) -> None:
        """Give back what running `w` is charged (a what-if removal)."""
        assert w.placement is not None
        resource = resource_of(w, w.placement.gpu_model)
        self.charge(w.queue, resource, -charge_of(w), -w.total_cpu, w.gpus_per_node > 0)

    def recharge(self, w: Workload) -> None:
        """Charge running `w` again (undo :meth:`uncharge`)."""
        assert w.placement is not None
        resource = resource_of(w, w.placement.gpu_model)
        self.charge(w.queue, resource, charge_of(w), w.total_cpu, w.gpus_per_node > 0)

    def admit(self, w: Workload, resource: str) -> None:
        """Charge `w`, admitted this cycle."""
        self.charge(w.queue, resource, charge_of(w), w.total_cpu, w.gpus_per_node > 0)
        key = (w.queue, resource)
        self._admitted[key] = self._admitted.get(key, 0.0) + charge_of(w)

    def mark_victim(self, v: Workload) -> None:
        """`v` was chosen as a victim: its quota stays charged until it stops."""
        assert v.placement is not None
        key = (v.queue, resource_of(v, v.placement.gpu_model))
        self._victims[key] = self._victims.get(key, 0.0) + charge_of(v)

    def mark_leaving(self, w: Workload) -> None:
        """Running `w` is terminating: its quota stays charged until it stops."""
        assert w.placement is not None
        key = (w.queue, resource_of(w, w.placement.gpu_model))
        self._leaving[key] = self._leaving.get(key, 0.0) + charge_of(w)

    def usage_of(self, queue: str) -> dict[str, float]:
        """Usage per resource of `queue` (read-only)."""
        return self._usage.get(queue, {})

    def staying_usage(self, queue: str, resource: str) -> float:
        """Usage of the queue's running work that stays: not this cycle's admissions, not
        victims chosen this cycle, not terminating work."""
        key = (queue, resource)
        used = self.tree.usage(queue, resource) - self._admitted.get(key, 0.0)
        return used - (self._victims.get(key, 0.0) + self._leaving.get(key, 0.0))

    def failed_need(self, key: Key) -> float:
        """The smallest need that failed quota for (queue, resource) this cycle (INF: none)."""
        return self._failed.get(key, INF)

    def note_failed(self, key: Key, amount: float) -> None:
        self._failed[key] = min(amount, self._failed.get(key, INF))

    def final_facts(self, key: Key, compute: Callable[[], dict[str, object]]) -> dict[str, object]:
        """The quota facts of (queue, resource) once the cycle is over (computed once)."""
        found = self._final.get(key)
        if found is None:
            found = self._final[key] = compute()
        return found


@dataclass(slots=True)
class RunningIndex:
    """Running workloads indexed for victim searches (built in phase 2)."""

    by_queue: dict[tuple[str, str], list[Workload]] = field(default_factory=dict)
    leaving: dict[str, list[Workload]] = field(default_factory=dict)
    min_priority: dict[str, int] = field(default_factory=dict)
    max_level: dict[str, int] = field(default_factory=dict)
    top_level: int = 0
    _pools: dict[tuple[str, str], list[tuple[Cost, Workload]]] = field(default_factory=dict)

    def pool(
        self, model: str, queue: str, cost: Callable[[Workload], Cost]
    ) -> list[tuple[Cost, Workload]]:
        """A queue's running workloads on `model`, cheapest victim first (built once)."""
        key = (model, queue)
        pool = self._pools.get(key)
        if pool is None:
            pool = sorted(((cost(v), v) for v in self.by_queue.get(key, [])), key=_FIRST)
            self._pools[key] = pool
        return pool
