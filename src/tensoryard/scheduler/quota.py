"""Quota accounting over the queue/cohort tree: nominal, lending, borrowing, usage.

Each tree node (queue or cohort) has, per resource r (a GPU model, or "cpu"):

* ``subtree[r]``: its own nominal plus what its children lend up to it;
* ``guaranteed[r]``: the part of ``subtree`` it keeps for itself (``subtree - lending_limit``,
  or 0 when it lends everything it does not use);
* ``usage[r]``: its own usage plus the children's usage beyond their guaranteed part.

A node may use its guaranteed part freely, and beyond that what its parent still has,
capped by its borrowing limit: so a queue never exceeds ``nominal + borrowing_limit`` and a
cohort never hands out more than its members lend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensoryard.spec.queue import CPU_RESOURCE, CohortSpec, QueueSpec, QuotaConfig

__all__ = ["QuotaTree"]


@dataclass(slots=True)
class _TreeNode:
    name: str
    parent: int
    is_queue: bool
    nominal: dict[str, float]
    lending: dict[str, float | None]
    borrowing: dict[str, float | None]
    subtree: dict[str, float] = field(default_factory=dict)
    guaranteed: dict[str, float] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)


class QuotaTree:
    """Mutable quota state for one cycle, built from a QuotaConfig (call :meth:`copy` to reuse)."""

    def __init__(self, config: QuotaConfig) -> None:
        self.resources = (*config.gpu_models, CPU_RESOURCE)
        self._known = frozenset(self.resources)
        self._max_ever: dict[tuple[str, str], float] = {}
        self.cpu_limited: set[str] = {q.name for q in config.queues if q.cpu is not None}
        self._nodes: list[_TreeNode] = []
        self.index: dict[str, int] = {}
        cohort_ix: dict[str, int] = {}
        for cohort in config.cohorts:
            cohort_ix[cohort.name] = self._add(cohort.name, False, cohort)
        for queue in config.queues:
            self.index[queue.name] = self._add(queue.name, True, queue)
        for cohort in config.cohorts:
            if cohort.parent is not None:
                self._nodes[cohort_ix[cohort.name]].parent = cohort_ix[cohort.parent]
        for queue in config.queues:
            if queue.cohort is not None:
                self._nodes[self.index[queue.name]].parent = cohort_ix[queue.cohort]
        self.weights = {q.name: q.weight for q in config.queues}
        self._compute_subtrees()
        self._root_of = [self._root(i) for i in range(len(self._nodes))]
        self._members: dict[int, list[str]] = {}
        for queue in config.queues:
            self._members.setdefault(self._root_of[self.index[queue.name]], []).append(queue.name)

    def _add(self, name: str, is_queue: bool, spec: QueueSpec | CohortSpec) -> int:
        nominal: dict[str, float] = {r: float(spec.nominal.get(r, 0)) for r in self.resources}
        nominal[CPU_RESOURCE] = float(spec.cpu or 0.0)
        lending: dict[str, float | None] = {}
        borrowing: dict[str, float | None] = {}
        for r in self.resources:
            if r == CPU_RESOURCE:
                lending[r], borrowing[r] = None, None
                continue
            lend, borrow = spec.lending_limit_for(r), spec.borrowing_limit_for(r)
            lending[r] = None if lend is None else float(lend)
            borrowing[r] = None if borrow is None else float(borrow)
        self._nodes.append(_TreeNode(name, -1, is_queue, nominal, lending, borrowing))
        return len(self._nodes) - 1

    def _root(self, i: int) -> int:
        while self._nodes[i].parent >= 0:
            i = self._nodes[i].parent
        return i

    def _depth_order(self) -> list[int]:
        def depth(i: int) -> int:
            d = 0
            while self._nodes[i].parent >= 0:
                i, d = self._nodes[i].parent, d + 1
            return d

        return sorted(range(len(self._nodes)), key=depth, reverse=True)

    def _compute_subtrees(self) -> None:
        for node in self._nodes:
            node.subtree = dict(node.nominal)
            node.usage = dict.fromkeys(self.resources, 0.0)
        for i in self._depth_order():  # children before parents
            node = self._nodes[i]
            for r in self.resources:
                lend = node.lending[r]
                node.guaranteed[r] = max(0.0, node.subtree[r] - lend) if lend is not None else 0.0
                if node.parent >= 0:
                    self._nodes[node.parent].subtree[r] += node.subtree[r] - node.guaranteed[r]

    # --- queries ---------------------------------------------------------------------------

    def has_queue(self, queue: str) -> bool:
        return queue in self.index

    def available(self, queue: str, resource: str) -> float:
        """How much of `resource` the queue may still take (own quota plus borrowable)."""
        if resource == CPU_RESOURCE and queue not in self.cpu_limited:
            return float("inf")
        if resource not in self._known:
            return 0.0
        return self._available(self.index[queue], resource)

    def _available(self, i: int, r: str) -> float:
        node = self._nodes[i]
        if node.parent < 0:
            return node.subtree.get(r, 0.0) - node.usage.get(r, 0.0)
        g, u = node.guaranteed[r], node.usage[r]
        from_parent = self._available(node.parent, r)
        limit = node.borrowing[r]
        if limit is not None:
            from_parent = min(from_parent, (node.subtree[r] - g) - max(0.0, u - g) + limit)
        return max(0.0, g - u) + from_parent

    def usage(self, queue: str, resource: str) -> float:
        return self._nodes[self.index[queue]].usage.get(resource, 0.0)

    def nominal(self, queue: str, resource: str) -> float:
        return self._nodes[self.index[queue]].nominal.get(resource, 0.0)

    def borrowing_limit(self, queue: str, resource: str) -> float | None:
        return self._nodes[self.index[queue]].borrowing.get(resource)

    def borrowing(self, queue: str, resource: str) -> bool:
        """True when the queue uses more than its nominal quota of `resource`."""
        node = self._nodes[self.index[queue]]
        return node.usage.get(resource, 0.0) > node.nominal.get(resource, 0.0) + 1e-9

    def cohort_total(self, queue: str, resource: str) -> float:
        """Quota of `resource` in the queue's top-level cohort (the queue's own if alone)."""
        return self._nodes[self._root_of[self.index[queue]]].subtree.get(resource, 0.0)

    def cohort_of(self, queue: str) -> str | None:
        parent = self._nodes[self.index[queue]].parent
        return self._nodes[parent].name if parent >= 0 else None

    def same_tree(self, a: str, b: str) -> bool:
        """True when queues a and b share a top-level cohort (so they lend to each other)."""
        return self._root_of[self.index[a]] == self._root_of[self.index[b]]

    def tree_queues(self, queue: str) -> list[str]:
        """Every queue sharing the queue's top-level cohort (itself included)."""
        return self._members[self._root_of[self.index[queue]]]

    def max_ever(self, queue: str, resource: str) -> float:
        """The most of `resource` the queue could hold with the whole tree idle (cached)."""
        if resource == CPU_RESOURCE and queue not in self.cpu_limited:
            return float("inf")
        if resource not in self._known:
            return 0.0
        key = (queue, resource)
        found = self._max_ever.get(key)
        if found is None:
            found = self._max_ever[key] = self._idle_available(self.index[queue], resource)
        return found

    def _idle_available(self, i: int, r: str) -> float:
        node = self._nodes[i]
        if node.parent < 0:
            return node.subtree.get(r, 0.0)
        g = node.guaranteed[r]
        from_parent = self._idle_available(node.parent, r)
        limit = node.borrowing[r]
        if limit is not None:
            from_parent = min(from_parent, (node.subtree[r] - g) + limit)
        return g + from_parent

    # --- updates ---------------------------------------------------------------------------

    def add_usage(self, queue: str, resource: str, amount: float) -> None:
        """Charge (amount > 0) or refund (amount < 0) the queue and propagate upwards."""
        if (resource == CPU_RESOURCE and queue not in self.cpu_limited) or (
            resource not in self._known
        ):
            return
        i = self.index[queue]
        delta = amount
        while i >= 0 and delta != 0.0:
            node = self._nodes[i]
            old = node.usage.get(resource, 0.0)
            new = old + delta
            node.usage[resource] = new
            g = node.guaranteed.get(resource, 0.0)
            delta = max(0.0, new - g) - max(0.0, old - g)
            i = node.parent
