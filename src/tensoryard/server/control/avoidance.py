"""Where a job's next attempt must not go: nodes where two of its attempts failed (see
scheduling.nodes_to_avoid), and for a gang that lost some of its nodes, spares to swap in so
the healthy nodes are kept (partial gang recovery)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.nodes import NodeView
from tensoryard.server.scheduling import (
    EXCLUDE_AFTER_FAILURES,
    NodeCapacity,
    nodes_to_avoid,
    replacement_placement,
)
from tensoryard.spec.states import ACTIVE_STATES
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["NodeAvoidance"]


class NodeAvoidance:
    """Per waiting job: its attempt count when computed, the nodes its next placement avoids,
    and why (read from the attempts once per new attempt count)."""

    def __init__(
        self, *, store: Store, index: JobIndex, nodes: NodeView, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._index = index
        self._nodes = nodes
        self._clock = clock
        self._avoid: dict[int, tuple[int, frozenset[str], str]] = {}

    def reset(self) -> None:
        self._avoid = {}

    def after_failure(
        self, job: JobRecord, attempt: AttemptRecord, state: str, reason: str
    ) -> tuple[frozenset[str], str]:
        """When ending ``attempt`` this way makes nodes of the job's placement ones where two
        of its attempts failed, and the job fits elsewhere: those nodes, and why it goes back
        to the queue (the scheduler then avoids them); empty to restart as usual."""
        history = [
            dataclasses.replace(a, state=state, reason=reason) if a.number == attempt.number else a
            for a in self._store.list_attempts(job.id)
        ]
        avoid, why = nodes_to_avoid(
            history, self._nodes.capacity(self._clock()), self._index.spec(job)
        )
        mine = avoid & set(job.placement)
        if not mine:
            return frozenset(), ""
        return frozenset(mine), f"requeued to be placed elsewhere: {why}"

    def replacement(self, job: JobRecord, gone: frozenset[str]) -> dict[str, list[int]] | None:
        """The job's placement with ``gone`` swapped for spares free now (None: not enough)."""
        others = []
        for other in self._index.in_states(*ACTIVE_STATES):
            spec = self._index.specs.get(other.id) if other.id != job.id else None
            if spec is not None and other.placement:
                others.append((other.placement, spec))
        known = self._avoid.get(job.id)
        return replacement_placement(
            job.placement,
            gone,
            self._index.spec(job),
            self._nodes.capacity(self._clock()),
            others,
            avoid=known[1] if known else frozenset(),
        )

    def for_pending(
        self, pending: list[JobRecord], nodes: tuple[NodeCapacity, ...]
    ) -> dict[int, frozenset[str]]:
        """job -> nodes its next placement avoids; an event says so when the set changes."""
        out: dict[int, frozenset[str]] = {}
        waiting = {j.id for j in pending}
        self._avoid = {k: v for k, v in self._avoid.items() if k in waiting}
        for job in pending:
            if job.attempts < EXCLUDE_AFTER_FAILURES:
                continue
            known = self._avoid.get(job.id)
            if known is None or known[0] != job.attempts:
                spec = self._index.specs.get(job.id)
                if spec is None:
                    continue
                avoid, why = nodes_to_avoid(self._store.list_attempts(job.id), nodes, spec)
                if why and (known is None or (known[1], known[2]) != (avoid, why)):
                    self._store.add_event(job.id, "placement", why)
                known = (job.attempts, avoid, why)
                self._avoid[job.id] = known
            if known[1]:
                out[job.id] = known[1]
        return out
