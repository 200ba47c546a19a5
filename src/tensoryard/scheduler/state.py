"""Per-cycle cluster state: node free capacity derived from running workloads, indexed per model."""

from __future__ import annotations

import math
from collections.abc import Iterable

from tensoryard.scheduler.capacity import CapacityIndex, NodeState
from tensoryard.scheduler.model import Node, Placement, Workload

__all__ = ["CPU_MODEL", "ClusterState"]

CPU_MODEL = ""
"""Index key of the CPU-only nodes (GPU models are non-empty strings)."""

INF = math.inf


class ClusterState:
    """Free capacity of every node, with an open index (may take work) and a held index
    (reserved for a head-of-line workload) per GPU model."""

    def __init__(self, nodes: Iterable[Node], running: Iterable[Workload], now: float) -> None:
        self.now = now
        self.by_name: dict[str, NodeState] = {}
        # per node: (expected end, gpus, cpu) of what runs there; end is inf when unknown
        self.node_jobs: list[list[tuple[float, int, float]]] = []
        # per node: the running, not terminating workloads there (victim searches read it)
        self.running_on: list[list[Workload]] = []
        switch_ids: dict[str, int] = {}
        block_ids: dict[str, int] = {}
        switch_block: list[int] = []
        max_gpus: dict[str, int] = {}
        specs = list(nodes)
        for node in specs:
            model = node.gpu_model or CPU_MODEL
            key = node.switch or f"node:{node.name}"
            if key not in switch_ids:
                switch_ids[key] = len(switch_ids)
                switch_block.append(block_ids.setdefault(node.block, len(block_ids)))
            max_gpus[model] = max(max_gpus.get(model, 0), node.gpus_total if model else 0)
        self.n_switches = len(switch_ids)
        self.switch_names = list(switch_ids)
        self.open: dict[str, CapacityIndex] = {
            m: CapacityIndex(self.n_switches, g, switch_block) for m, g in max_gpus.items()
        }
        self.held: dict[str, CapacityIndex] = {
            m: CapacityIndex(self.n_switches, g, switch_block) for m, g in max_gpus.items()
        }
        self.max_nodes_per_switch: dict[str, int] = {}
        self.schedulable_nodes: dict[str, int] = dict.fromkeys(max_gpus, 0)
        self.states: list[NodeState] = []
        for ix, node in enumerate(specs):
            self._add_node(ix, node, switch_ids[node.switch or f"node:{node.name}"])
        self._charge_running(running)
        for state, node in zip(self.states, specs, strict=True):
            if node.schedulable:
                self.open[state.gpu_model or CPU_MODEL].add(state)
        per_switch: dict[tuple[str, int], int] = {}
        for state, node in zip(self.states, specs, strict=True):
            if node.schedulable:
                group = (state.gpu_model or CPU_MODEL, state.switch)
                per_switch[group] = per_switch.get(group, 0) + 1
        for (model, _), count in per_switch.items():
            self.max_nodes_per_switch[model] = max(self.max_nodes_per_switch.get(model, 0), count)

    def _add_node(self, ix: int, node: Node, switch: int) -> None:
        bad = set(node.unavailable_gpus)
        free = [g for g in range(node.gpus_total) if g not in bad] if node.gpu_model else []
        state = NodeState(
            ix=ix,
            name=node.name,
            gpu_model=node.gpu_model,
            switch=switch,
            gpus_total=node.gpus_total,
            free=free,
            cpu_free=node.cpu_total,
            mem_free=node.mem_total,
            mem_tracked=node.mem_total > 0,
        )
        self.states.append(state)
        self.by_name[node.name] = state
        self.node_jobs.append([])
        self.running_on.append([])
        if node.schedulable:
            model = node.gpu_model or CPU_MODEL
            self.schedulable_nodes[model] = self.schedulable_nodes.get(model, 0) + 1

    def _charge_running(self, running: Iterable[Workload]) -> None:
        # Done before nodes join an index: collect what is used per node, then subtract once.
        used: dict[str, list[int]] = {}
        by_name = self.by_name
        jobs = self.node_jobs
        on = self.running_on
        for w in running:
            placement = w.placement
            if placement is None:
                continue
            stays = not w.terminating
            end = w.expected_end()
            if end is None:
                end = INF
            cpu, mem = placement.cpu_per_node, placement.mem_per_node
            for name, gpus in placement.gpus.items():
                state = by_name.get(name)
                if state is None:
                    continue
                taken = used.get(name)
                if taken is None:
                    used[name] = list(gpus)
                else:
                    taken.extend(gpus)
                state.cpu_free -= cpu
                state.mem_free -= mem
                jobs[state.ix].append((end, len(gpus), cpu))
                if stays:
                    on[state.ix].append(w)
        for name, taken in used.items():
            state = by_name[name]
            gone = set(taken)
            state.free = [g for g in state.free if g not in gone]

    # --- moving capacity -------------------------------------------------------------------

    def index_of(self, state: NodeState) -> CapacityIndex | None:
        """The index (open or held) the node is in, or None for cordoned/draining nodes."""
        model = state.gpu_model or CPU_MODEL
        if state.ix in self.open[model]:
            return self.open[model]
        if state.ix in self.held[model]:
            return self.held[model]
        return None

    def take(self, state: NodeState, gpus: int, cpu: float, mem: int) -> tuple[int, ...]:
        index = self.index_of(state)
        assert index is not None, "placement chose a node outside every index"
        return index.take(state, gpus, cpu, mem)

    def give_back(self, placement: Placement) -> None:
        """Return a placement's resources to its nodes (for what-if preemption)."""
        for name, gpus in placement.gpus.items():
            state = self.by_name.get(name)
            if state is None:
                continue
            index = self.index_of(state)
            if index is None:
                state.free = sorted([*state.free, *gpus])
                state.cpu_free += placement.cpu_per_node
                state.mem_free += placement.mem_per_node
            else:
                index.give(state, gpus, placement.cpu_per_node, placement.mem_per_node)

    def retake(self, placement: Placement) -> None:
        """Undo :meth:`give_back` (the exact GPU indices are taken again)."""
        for name, gpus in placement.gpus.items():
            state = self.by_name.get(name)
            if state is None:
                continue
            index = self.index_of(state)
            if index is None:
                taken = set(gpus)
                state.free = [g for g in state.free if g not in taken]
                state.cpu_free -= placement.cpu_per_node
                state.mem_free -= placement.mem_per_node
                continue
            index.take_exact(state, gpus, placement.cpu_per_node, placement.mem_per_node)

    def hold(self, model: str, states: Iterable[NodeState]) -> None:
        """Move nodes from the open to the held index (a head-of-line reservation)."""
        for state in states:
            if state.ix in self.open[model]:
                self.open[model].remove(state)
                self.held[model].add(state)

    def free_at(self, state: NodeState, gpus: int, cpu: float = 0.0) -> float:
        """Earliest time the node has `gpus` GPUs and `cpu` cores free, from known ends
        (inf when it depends on a workload without an estimate)."""
        missing_gpus = gpus - len(state.free)
        missing_cpu = cpu - state.cpu_free
        if missing_gpus <= 0 and missing_cpu <= 1e-9:
            return self.now
        for end, count, cores in sorted(self.node_jobs[state.ix]):
            if end == INF:
                return INF
            missing_gpus -= count
            missing_cpu -= cores
            if missing_gpus <= 0 and missing_cpu <= 1e-9:
                return max(self.now, end)
        return INF

    def record_start(self, state: NodeState, end: float | None, gpus: int, cpu: float) -> None:
        self.node_jobs[state.ix].append((INF if end is None else end, gpus, cpu))
