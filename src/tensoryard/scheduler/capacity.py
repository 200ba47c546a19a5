"""Free-capacity index of one GPU model: nodes bucketed by free GPUs, per leaf switch.

``buckets[s][k]`` holds the nodes of switch ``s`` with exactly ``k`` free GPUs (an insertion-
ordered dict used as an ordered set, so iteration is reproducible). Finding a best-fit node for
a g-GPU worker, or the switches that can hold an n-node gang, costs O(switches x GPUs per node),
independent of how many workloads are pending.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CapacityIndex", "NodeState"]


@dataclass(slots=True)
class NodeState:
    """Mutable free capacity of one node during a cycle."""

    ix: int
    name: str
    gpu_model: str | None
    switch: int
    gpus_total: int
    free: list[int]
    cpu_free: float
    mem_free: int
    mem_tracked: bool

    def fits(self, gpus: int, cpu: float, mem: int) -> bool:
        if len(self.free) < gpus or self.cpu_free + 1e-9 < cpu:
            return False
        return not (self.mem_tracked and mem > 0 and self.mem_free < mem)


class CapacityIndex:
    """Nodes of one GPU model (or the CPU-only nodes) that may take new work."""

    def __init__(
        self, n_switches: int, max_gpus: int, switch_block: list[int] | None = None
    ) -> None:
        self.max_gpus = max_gpus
        self.switch_block = switch_block or [0] * n_switches
        self.buckets: list[list[dict[int, None]]] = [
            [{} for _ in range(max_gpus + 1)] for _ in range(n_switches)
        ]
        self.switch_free = [0] * n_switches
        self.switch_nodes = [0] * n_switches
        self.total_free = 0
        self.nodes: dict[int, NodeState] = {}

    # --- membership ------------------------------------------------------------------------

    def add(self, node: NodeState) -> None:
        self.nodes[node.ix] = node
        k = len(node.free)
        self.buckets[node.switch][k][node.ix] = None
        self.switch_free[node.switch] += k
        self.switch_nodes[node.switch] += 1
        self.total_free += k

    def remove(self, node: NodeState) -> None:
        del self.nodes[node.ix]
        k = len(node.free)
        del self.buckets[node.switch][k][node.ix]
        self.switch_free[node.switch] -= k
        self.switch_nodes[node.switch] -= 1
        self.total_free -= k

    def __contains__(self, ix: int) -> bool:
        return ix in self.nodes

    # --- changes ---------------------------------------------------------------------------

    def take(self, node: NodeState, gpus: int, cpu: float, mem: int) -> tuple[int, ...]:
        """Allocate on a member node; returns the GPU indices taken (lowest first)."""
        k = len(node.free)
        taken = tuple(node.free[:gpus])
        del node.free[:gpus]
        node.cpu_free -= cpu
        node.mem_free -= mem
        self._move(node, k)
        return taken

    def give(self, node: NodeState, gpus: tuple[int, ...], cpu: float, mem: int) -> None:
        """Return an allocation to a member node (what-if preemption restores with this)."""
        k = len(node.free)
        node.free.extend(gpus)
        node.free.sort()
        node.cpu_free += cpu
        node.mem_free += mem
        self._move(node, k)

    def take_exact(self, node: NodeState, gpus: tuple[int, ...], cpu: float, mem: int) -> None:
        """Allocate exactly these GPU indices on a member node (undoes :meth:`give`)."""
        k = len(node.free)
        taken = set(gpus)
        node.free = [g for g in node.free if g not in taken]
        node.cpu_free -= cpu
        node.mem_free -= mem
        self._move(node, k)

    def _move(self, node: NodeState, old_k: int) -> None:
        new_k = len(node.free)
        if new_k == old_k:
            return
        s = node.switch
        del self.buckets[s][old_k][node.ix]
        self.buckets[s][new_k][node.ix] = None
        self.switch_free[s] += new_k - old_k
        self.total_free += new_k - old_k

    # --- queries ---------------------------------------------------------------------------

    def best_node(
        self, gpus: int, cpu: float, mem: int, avoid: frozenset[str] = frozenset()
    ) -> NodeState | None:
        """The fullest node that still fits (best fit), preferring the fullest switch; never
        one named in `avoid`."""
        for k in range(gpus, self.max_gpus + 1):
            best: NodeState | None = None
            best_free = 0
            for s, bucket in enumerate(self.buckets):
                if not bucket[k]:
                    continue
                if best is not None and self.switch_free[s] >= best_free:
                    continue
                for ix in bucket[k]:
                    node = self.nodes[ix]
                    if node.fits(gpus, cpu, mem) and node.name not in avoid:
                        best, best_free = node, self.switch_free[s]
                        break
            if best is not None:
                return best
        return None

    def nodes_fitting(self, s: int, gpus: int) -> int:
        """How many nodes of switch s have at least `gpus` free GPUs."""
        bucket = self.buckets[s]
        return sum(len(bucket[k]) for k in range(gpus, self.max_gpus + 1))

    def pick_in_switch(
        self,
        s: int,
        count: int,
        gpus: int,
        cpu: float,
        mem: int,
        avoid: frozenset[str] = frozenset(),
    ) -> list[NodeState]:
        """Up to `count` best-fit nodes of switch s with room for one worker each (none named
        in `avoid`)."""
        chosen: list[NodeState] = []
        bucket = self.buckets[s]
        for k in range(gpus, self.max_gpus + 1):
            for ix in bucket[k]:
                node = self.nodes[ix]
                if node.fits(gpus, cpu, mem) and node.name not in avoid:
                    chosen.append(node)
                    if len(chosen) == count:
                        return chosen
        return chosen

    def _spread_order(self, fitting: list[tuple[int, int]], count: int) -> list[int]:
        """Switches to fill, fullest first, starting with the spine block that holds the gang
        on the fewest switches (cross-block traffic is the slowest)."""
        order = sorted(fitting, key=lambda t: (-t[0], t[1]))
        by_block: dict[int, list[int]] = {}
        room: dict[int, list[int]] = {}
        for n, s in order:
            block = self.switch_block[s]
            by_block.setdefault(block, []).append(s)
            room.setdefault(block, []).append(n)
        best: tuple[int, int] | None = None
        for block, sizes in room.items():
            total = 0
            for used, n in enumerate(sizes, start=1):
                total += n
                if total >= count:
                    if best is None or (used, block) < best:
                        best = (used, block)
                    break
        if best is None:
            return [s for _, s in order]
        first = by_block[best[1]]
        return first + [s for _, s in order if self.switch_block[s] != best[1]]

    def gang(
        self,
        count: int,
        gpus: int,
        cpu: float,
        mem: int,
        max_switches: int | None,
        avoid: frozenset[str] = frozenset(),
    ) -> list[NodeState] | None:
        """Nodes for a gang of `count` workers on as few switches as possible, none of them
        named in `avoid` (the switch counts below include avoided nodes: with `avoid`, a
        switch that looked big enough may fall short and the gang spreads, or fails).

        With `max_switches` set, fail rather than spread over more switches than that.
        """
        fitting = [(self.nodes_fitting(s, gpus), s) for s in range(len(self.buckets))]
        fitting = [(n, s) for n, s in fitting if n > 0]
        if sum(n for n, _ in fitting) < count:
            return None
        single = [(n, self.switch_free[s], s) for n, s in fitting if n >= count]
        if single:
            _, _, s = min(single)  # the tightest switch that holds the whole gang
            chosen = self.pick_in_switch(s, count, gpus, cpu, mem, avoid)
            if len(chosen) == count:
                return chosen
        chosen = []
        for used, s in enumerate(self._spread_order(fitting, count)):
            if max_switches is not None and used >= max_switches:
                return None
            chosen.extend(self.pick_in_switch(s, count - len(chosen), gpus, cpu, mem, avoid))
            if len(chosen) == count:
                return chosen
        return None
