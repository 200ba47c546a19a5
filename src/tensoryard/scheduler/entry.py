"""One pending workload's visit in a cycle, carrying its own assignment and outcome.

As in Kueue's scheduler, each queue head the cycle visits becomes an :class:`Entry`: the
concern modules fill in what they found for it (the models tried and why each failed, the
nodes it would get, the victims and GPUs a preemption frees for it, the nodes held for it)
and the cycle then applies the entry: an admission is committed to capacity and quota, a
preemption is issued, a reservation held, and otherwise only the outcome is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from tensoryard.scheduler.capacity import NodeState
from tensoryard.scheduler.model import Workload
from tensoryard.scheduler.pending import Outcome

__all__ = ["Entry", "Fail", "Held", "Victims"]

Victims = list[tuple[Workload, str]]
"""Victims chosen for a preemptor, each with the rule that allows it."""


_NO_GPUS: Mapping[str, tuple[int, ...]] = MappingProxyType({})


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


class Entry:
    """The visit of one pending workload: what it was found to get, and its outcome."""

    __slots__ = (
        "claimed",
        "fails",
        "held",
        "model",
        "models",
        "nodes",
        "outcome",
        "position",
        "victims",
        "workload",
    )

    def __init__(self, workload: Workload, position: int) -> None:
        self.workload = workload
        self.position = position
        self.models: tuple[str, ...] = ()
        self.fails: Sequence[Fail] = ()
        # an admission: the model and nodes it gets
        self.model: str | None = None
        self.nodes: list[NodeState] | None = None
        # a preemption (or defragmentation) for it: victims, and the GPUs it keeps
        self.victims: Victims | None = None
        self.claimed: Mapping[str, tuple[int, ...]] = _NO_GPUS
        # a head-of-line reservation
        self.held: Held | None = None
        self.outcome: Outcome | None = None

    @property
    def id(self) -> str:
        return self.workload.id

    def consider(self, models: tuple[str, ...]) -> None:
        """The models (index keys) it could ever be placed on, in the order tried."""
        self.models = models

    def fail_on(self, fail: Fail) -> None:
        """It was not admitted on one model, for this reason."""
        self.fails = (*self.fails, fail)

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
