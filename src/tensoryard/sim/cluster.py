"""The simulated cluster: a shape like ``64x8`` under leaf switches, and which GPUs are free.

:class:`ClusterState` tracks free GPU indices per node and keeps nodes bucketed by their free
count, so that best-fit placement costs O(GPUs per node) rather than O(nodes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tensoryard.errors import ConfigError

__all__ = [
    "ClusterShape",
    "ClusterState",
    "Placement",
    "gang_shape",
    "parse_cluster_shape",
]

DEFAULT_GPU_MODEL = "gpu"
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 16

# node index -> GPU indices on that node
Placement = dict[int, tuple[int, ...]]

_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*([A-Za-z0-9_.-]+))?\s*$")


@dataclass(frozen=True)
class ClusterShape:
    """``nodes`` identical nodes of ``gpus_per_node`` GPUs, ``nodes_per_switch`` per leaf."""

    nodes: int
    gpus_per_node: int
    nodes_per_switch: int
    gpu_model: str = DEFAULT_GPU_MODEL

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def switches(self) -> int:
        return math.ceil(self.nodes / self.nodes_per_switch)

    def switch_of(self, node: int) -> int:
        """Leaf switch of a node (nodes are numbered switch by switch)."""
        return node // self.nodes_per_switch

    def node_name(self, node: int) -> str:
        return f"node-{node:05d}"

    def switch_name(self, node: int) -> str:
        return f"leaf-{self.switch_of(node):04d}"


def parse_cluster_shape(
    text: str, *, nodes_per_switch: int | None = None, gpu_model: str | None = None
) -> ClusterShape:
    """``'64x8'`` (nodes x GPUs per node, optionally ``':H100'``) -> ClusterShape.

    ``nodes_per_switch`` defaults to 32 nodes (256 GPUs of 8) per leaf switch.
    """
    match = _SHAPE_RE.match(text)
    if not match:
        raise ConfigError(
            f"cluster shape {text!r} is not NODESxGPUS (fix: write it like 64x8 or 64x8:H100)"
        )
    nodes, gpus = int(match.group(1)), int(match.group(2))
    if not 1 <= nodes <= MAX_NODES:
        raise ConfigError(f"cluster shape {text!r}: nodes must be in 1..{MAX_NODES}")
    if not 1 <= gpus <= MAX_GPUS_PER_NODE:
        raise ConfigError(
            f"cluster shape {text!r}: GPUs per node must be in 1..{MAX_GPUS_PER_NODE}"
        )
    per_switch = nodes_per_switch if nodes_per_switch is not None else min(nodes, 32)
    if per_switch < 1:
        raise ConfigError(f"nodes per switch must be at least 1, got {per_switch}")
    model = gpu_model or match.group(3) or DEFAULT_GPU_MODEL
    return ClusterShape(nodes, gpus, min(per_switch, nodes), model)


def gang_shape(num_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for a job: one node when it fits, else a gang of full nodes.

    A request that does not divide into whole nodes is spread evenly and rounded up
    (12 GPUs on 8-GPU nodes -> 2 nodes x 6).
    """
    if num_gpus <= gpus_per_node:
        return 1, num_gpus
    nodes = math.ceil(num_gpus / gpus_per_node)
    return nodes, math.ceil(num_gpus / nodes)


class ClusterState:
    """Which GPUs of a :class:`ClusterShape` are free; allocations are all or nothing."""

    def __init__(self, shape: ClusterShape) -> None:
        self.shape = shape
        full = tuple(range(shape.gpus_per_node))
        self._free: list[list[int]] = [list(full) for _ in range(shape.nodes)]
        # _buckets[f] = nodes with exactly f free GPUs
        self._buckets: list[set[int]] = [set() for _ in range(shape.gpus_per_node + 1)]
        self._buckets[shape.gpus_per_node] = set(range(shape.nodes))
        self.free_gpus = shape.total_gpus

    def clone(self) -> ClusterState:
        """An independent copy (for what-if placement by baselines)."""
        out = ClusterState.__new__(ClusterState)
        out.shape = self.shape
        out._free = [list(f) for f in self._free]
        out._buckets = [set(b) for b in self._buckets]
        out.free_gpus = self.free_gpus
        return out

    def free_on(self, node: int) -> int:
        return len(self._free[node])

    def free_indices(self, node: int) -> tuple[int, ...]:
        return tuple(self._free[node])

    def max_free_on_a_node(self) -> int:
        for f in range(self.shape.gpus_per_node, 0, -1):
            if self._buckets[f]:
                return f
        return 0

    def _move(self, node: int, before: int, after: int) -> None:
        self._buckets[before].discard(node)
        self._buckets[after].add(node)

    def allocate(self, placement: Mapping[int, tuple[int, ...]]) -> None:
        """Take the GPUs of a placement; raises if any is out of range or already taken."""
        for node, gpus in placement.items():
            if not 0 <= node < self.shape.nodes:
                raise ConfigError(
                    f"placement names node {node}, the cluster has {self.shape.nodes}"
                )
            missing = set(gpus) - set(self._free[node])
            if missing or len(set(gpus)) != len(gpus):
                raise ConfigError(
                    f"placement takes GPUs {sorted(gpus)} on node {node}, but only "
                    f"{sorted(self._free[node])} are free (a GPU would be allocated twice)"
                )
        for node, gpus in placement.items():
            before = len(self._free[node])
            taken = set(gpus)
            self._free[node] = [g for g in self._free[node] if g not in taken]
            self._move(node, before, len(self._free[node]))
            self.free_gpus -= len(gpus)

    def release(self, placement: Mapping[int, tuple[int, ...]]) -> None:
        """Give back the GPUs of a placement."""
        for node, gpus in placement.items():
            before = len(self._free[node])
            self._free[node] = sorted(self._free[node] + list(gpus))
            self._move(node, before, len(self._free[node]))
            self.free_gpus += len(gpus)

    def find(self, nodes: int, per_node: int) -> Placement | None:
        """A placement for a gang of ``nodes`` x ``per_node`` GPUs, or None when none fits.

        One node: best fit (the fullest node that still fits), so whole nodes stay free for
        gangs. Several nodes: as few leaf switches as possible, best-fit switch first.
        """
        if nodes * per_node > self.free_gpus:
            return None
        if nodes == 1:
            for f in range(per_node, self.shape.gpus_per_node + 1):
                if self._buckets[f]:
                    node = min(self._buckets[f])
                    return {node: tuple(self._free[node][:per_node])}
            return None
        return self._find_gang(nodes, per_node)

    def _find_gang(self, nodes: int, per_node: int) -> Placement | None:
        by_switch: dict[int, list[int]] = {}
        for f in range(per_node, self.shape.gpus_per_node + 1):
            for node in self._buckets[f]:
                by_switch.setdefault(self.shape.switch_of(node), []).append(node)
        if sum(len(v) for v in by_switch.values()) < nodes:
            return None
        for candidates in by_switch.values():
            candidates.sort(key=lambda n: (len(self._free[n]), n))
        fitting = [s for s, c in by_switch.items() if len(c) >= nodes]
        if fitting:
            switch = min(fitting, key=lambda s: (len(by_switch[s]), s))
            chosen = by_switch[switch][:nodes]
        else:
            chosen = []
            for switch in sorted(by_switch, key=lambda s: (-len(by_switch[s]), s)):
                chosen.extend(by_switch[switch][: nodes - len(chosen)])
                if len(chosen) == nodes:
                    break
        return {n: tuple(self._free[n][:per_node]) for n in sorted(chosen)}
