"""What a cycle serves and what it decides, each part owning its data behind methods.

- :class:`QueueLine` / :class:`Queues` (phase 3): each queue's ordered pending workloads with
  a cursor, the service levels of pending work, which queues hold CPU-only work;
- :class:`Decided` (phase 4): admissions, preemptions, reservations, claims, and the
  :class:`~tensoryard.scheduler.entry.Entry` of every visited workload, in visit order;
- :class:`Budgets` (phase 4): how much of each bounded search the cycle has used, and the
  failure caches that end a search early.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tensoryard.scheduler.config import SchedulerConfig
from tensoryard.scheduler.entry import Entry
from tensoryard.scheduler.model import Admission, Preemption, Workload
from tensoryard.scheduler.pending import Outcome
from tensoryard.scheduler.state import INF

__all__ = ["Budgets", "Decided", "QueueLine", "Queues"]


@dataclass(slots=True)
class QueueLine:
    """One queue's sorted pending workloads and a cursor into them."""

    name: str
    items: list[Workload]
    cursor: int = 0
    admitted: int = 0
    closed: bool = False
    preempt_failed_need: float = INF
    close_code: str = "capacity"
    # min CPU per node over items[i:] (built on first use)
    _cpu_need_suffix: list[float] | None = None

    def take_head(self) -> tuple[Workload, int]:
        """The head of line and its place among those still waiting; the cursor moves on."""
        w = self.items[self.cursor]
        position = self.cursor - self.admitted
        self.cursor += 1
        return w, position

    def after_visit(self, admitted: bool) -> bool:
        """Count the head just visited (`admitted` or not); True while something is left
        to visit and the queue is not closed."""
        if admitted:
            self.admitted += 1
        return self.cursor < len(self.items) and not self.closed

    def close(self, code: str) -> None:
        """Visit nothing more of this queue this cycle ("quota" or "capacity" blocks it)."""
        self.closed = True
        self.close_code = code

    def note_preempt_failed(self, need: float) -> None:
        """Preemption found no room for a workload needing `need`: not for larger ones."""
        self.preempt_failed_need = min(self.preempt_failed_need, need)

    def cpu_need_of_rest(self) -> float:
        """The least CPU per node any workload after the cursor needs."""
        suffix = self._cpu_need_suffix
        if suffix is None:
            suffix = [INF] * (len(self.items) + 1)
            for i in range(len(self.items) - 1, -1, -1):
                suffix[i] = min(suffix[i + 1], self.items[i].cpu_per_node)
            self._cpu_need_suffix = suffix
        return suffix[self.cursor]


@dataclass(slots=True)
class Queues:
    """The ordered queues, the service levels of pending work, the CPU-only queues."""

    lines: dict[str, QueueLine] = field(default_factory=dict)
    levels: dict[str, int] = field(default_factory=dict)
    cpu_queues: set[str] = field(default_factory=set)
    has_cpu_pending: bool = False


@dataclass(slots=True)
class Decided:
    """The cycle's decisions so far, and the entry of every visited workload."""

    admissions: list[Admission] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    reservations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    claims: dict[str, tuple[str, ...]] = field(default_factory=dict)
    entries: dict[str, Entry] = field(default_factory=dict)
    late_admitted: set[str] = field(default_factory=set)
    victims: set[str] = field(default_factory=set)
    backfill_until: dict[str, float] = field(default_factory=dict)
    # pending workload id -> when the first borrower it could reclaim, but that has run less
    # than reclaim_min_run_s, becomes reclaimable (for its pending reason and the next wake)
    reclaim_at: dict[str, float] = field(default_factory=dict)

    def visit(self, entry: Entry) -> None:
        """`entry` is visited now (the visit order is the entries' order)."""
        self.entries[entry.workload.id] = entry

    def admit(self, admission: Admission, late: bool = False) -> None:
        self.admissions.append(admission)
        if late:
            self.late_admitted.add(admission.workload_id)

    def take_victim(self, victim_id: str, preemption: Preemption | None) -> None:
        """`victim_id` makes room for a preemptor (None: it terminates already)."""
        self.victims.add(victim_id)
        if preemption is not None:
            self.preemptions.append(preemption)

    def claim(self, workload_id: str, nodes: tuple[str, ...]) -> None:
        self.claims[workload_id] = nodes

    def reserve(self, workload_id: str, model: str, nodes: tuple[str, ...], start: float) -> None:
        """Hold `nodes` for `workload_id`; held GPUs of `model` go only to work that ends
        before `start` (-INF when unknown)."""
        self.backfill_until[model] = min(self.backfill_until.get(model, INF), start)
        self.reservations[workload_id] = nodes

    def note_reclaim_at(self, workload_id: str, at: float) -> None:
        if at < self.reclaim_at.get(workload_id, INF):
            self.reclaim_at[workload_id] = at

    def outcomes(self) -> dict[str, Outcome]:
        """Workload id -> outcome of every entry left waiting, in visit order."""
        return {k: e.outcome for k, e in self.entries.items() if e.outcome is not None}

    def visit_order(self) -> list[str]:
        return list(self.entries)

    def capacity_key(self) -> tuple[int, int, int]:
        """Changes whenever the cycle takes capacity (admits, reserves or claims)."""
        return (len(self.admissions), len(self.reservations), len(self.claims))

    def with_reclaim(
        self, w: Workload, details: Mapping[str, object], min_run_s: float
    ) -> Mapping[str, object]:
        """`details`, plus when borrowed GPUs `w` could reclaim become reclaimable."""
        at = self.reclaim_at.get(w.id)
        if at is None:
            return details
        return {**details, "reclaim_at": at, "reclaim_min_run_s": min_run_s}


@dataclass(slots=True)
class Budgets:
    """Bounded searches used so far, and failure caches that end them early."""

    cfg: SchedulerConfig
    preempt_attempts: int = 0
    preemptors: int = 0
    node_tries: int = 0
    borrowed_tries: int = 0
    defrag_tries: int = 0
    _defrag_failed: dict[str, float] = field(default_factory=dict)

    def preemption_left(self) -> bool:
        """True while the cycle may still issue preemptions and search for them."""
        return (
            self.preemptors < self.cfg.max_preemptors_per_cycle
            and self.preempt_attempts < self.cfg.max_preempt_attempts
        )

    def spend_preempt_attempt(self) -> None:
        self.preempt_attempts += 1

    def count_preemptor(self) -> None:
        self.preemptors += 1

    def node_try_left(self) -> bool:
        return self.node_tries < self.cfg.node_aware_tries

    def spend_node_try(self) -> None:
        self.node_tries += 1

    def borrowed_try_left(self) -> bool:
        return self.borrowed_tries < self.cfg.borrowed_service_tries

    def spend_borrowed_try(self) -> None:
        self.borrowed_tries += 1

    def defrag_left(self) -> bool:
        return (
            self.preemptors < self.cfg.max_preemptors_per_cycle
            and self.defrag_tries < self.cfg.defrag_tries
        )

    def spend_defrag_try(self) -> None:
        self.defrag_tries += 1

    def defrag_failed_for(self, model: str, gpus_per_node: int) -> bool:
        """A worker at least as wide found no node to clear on `model` this cycle."""
        return gpus_per_node >= self._defrag_failed.get(model, INF)

    def note_defrag_failed(self, model: str, gpus_per_node: int) -> None:
        self._defrag_failed[model] = min(gpus_per_node, self._defrag_failed.get(model, INF))
