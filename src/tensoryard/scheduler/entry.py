"""One pending workload's visit in a cycle, carrying its own assignment and outcome.

As in Kueue's scheduler, each queue head the cycle visits becomes an :class:`Entry`: the
concern modules fill in what they found for it (the models tried and why each failed, the
nodes it would get, the victims and GPUs a preemption frees for it, the nodes held for it)
and the cycle then applies the entry: an admission is committed to capacity and quota, a
preemption is issued, a reservation held, and otherwise only the outcome is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tensoryard.scheduler.capacity import NodeState
from tensoryard.scheduler.model import Workload
from tensoryard.scheduler.pending import Outcome

__all__ = ["Entry", "Fail", "Held", "Victims"]

Victims = list[tuple[Workload, str]]
"""Victims chosen for a preemptor, each with the rule that allows it."""


@dataclass(slots=True)
class Fail:
    """Why one workload could not be admitted on one model (code + facts for its reason)."""

    code: str
    details: dict[str, object]
    model: str | None = None


@dataclass(slots=True)
class Held:
    """Nodes to hold for a head-of-line workload, and when the last of them frees up."""

    model: str
    nodes: list[NodeState]
    start: float


@dataclass(slots=True)
class Entry:
    """The visit of one pending workload: what it was found to get, and its outcome."""

    workload: Workload
    position: int
    models: list[str] = field(default_factory=list)
    fails: list[Fail] = field(default_factory=list)
    # an admission: the model and nodes it gets
    model: str | None = None
    nodes: list[NodeState] | None = None
    # a preemption (or defragmentation) for it: victims, and the GPUs it keeps
    victims: Victims | None = None
    claimed: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # a head-of-line reservation
    held: Held | None = None
    outcome: Outcome | None = None

    @property
    def id(self) -> str:
        return self.workload.id

    def assign(self, model: str, nodes: list[NodeState]) -> None:
        """It fits: on `model`, on `nodes`."""
        self.model, self.nodes = model, nodes

    def preempt(self, victims: Victims, claimed: Mapping[str, tuple[int, ...]]) -> None:
        """It makes room by preempting `victims`; it keeps `claimed` (free already)."""
        self.victims, self.claimed = victims, claimed

    def hold(self, held: Held) -> None:
        """Nodes that free up first are held for it."""
        self.held = held

    def conclude(self, code: str, details: Mapping[str, object]) -> None:
        """It still waits: why, with the facts behind it."""
        self.outcome = Outcome(code, details, self.position)
