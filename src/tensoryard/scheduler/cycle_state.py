"""The state of one scheduling cycle, built once from the snapshot (phases 1 to 3).

Everything a cycle reads or changes lives in one :class:`CycleState`: what the snapshot
implies (free capacity, quota usage, victim indexes, the ordered queues) and what the
cycle decides on the way (admissions, preemptions, reservations, per-workload outcomes) with
its bookkeeping (budgets used, failure caches). The concern modules (``admission``,
``placement``, ``preemption``, ``defrag``, ``reservation``, ``ordering``) are functions over
it; none keeps state of its own. Quota usage changes only through :meth:`CycleState.charge`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter

from tensoryard.scheduler.accounting import charge_of, decay_usage, resource_of
from tensoryard.scheduler.config import SchedulerConfig
from tensoryard.scheduler.model import Admission, DecayedUsage, Preemption, Snapshot, Workload
from tensoryard.scheduler.pending import Outcome
from tensoryard.scheduler.quota import QuotaTree
from tensoryard.scheduler.state import CPU_MODEL, INF, ClusterState
from tensoryard.spec.queue import CPU_RESOURCE

__all__ = ["Cost", "CycleState", "Fail", "QueueLine", "build_cycle_state"]

Cost = tuple[float, int, float, str]
"""A victim's cost: (work lost in GPU-seconds, priority, -start time, id); cheapest first."""

_ID = attrgetter("id")
_BY_TIME = attrgetter("submit_time")
_PRIORITY = attrgetter("priority")
_GPUS_PER_NODE = attrgetter("gpus_per_node")
_ATTAINED = attrgetter("attained_service_s")


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
    # min CPU per node over items[i:] (built on first use; see core._no_cpu_room)
    cpu_need_suffix: list[float] | None = None


@dataclass(slots=True)
class Fail:
    """Why one workload could not be admitted on one model (code + facts for its reason)."""

    code: str
    details: dict[str, object]
    model: str | None = None


@dataclass(slots=True, kw_only=True)
class CycleState:
    """Everything one cycle knows and decides. Built by :func:`build_cycle_state`."""

    cfg: SchedulerConfig
    snap: Snapshot
    now: float
    # phase 1: capacity
    state: ClusterState
    gpu_models: list[str]
    capacity: dict[str, float]
    max_gpus_per_node: dict[str, int]
    max_cpu_per_node: dict[str, float]
    max_mem_per_node: dict[str, int]
    # phase 2: quota usage, fair-share history, preemption candidates
    tree: QuotaTree
    history: dict[str, DecayedUsage]
    q_usage: dict[str, dict[str, float]] = field(default_factory=dict)
    by_queue: dict[tuple[str, str], list[Workload]] = field(default_factory=dict)
    pools: dict[tuple[str, str], list[tuple[Cost, Workload]]] = field(default_factory=dict)
    leaving: dict[str, list[Workload]] = field(default_factory=dict)
    q_min_prio: dict[str, int] = field(default_factory=dict)
    q_max_level: dict[str, int] = field(default_factory=dict)
    max_level: int = 0
    # phase 3: ordered queues
    cpu_queues: set[str] = field(default_factory=set)
    has_cpu_pending: bool = False
    # the largest free CPU of any node, open or held, and the cycle state it was read at
    max_cpu_free: float = 0.0
    max_cpu_free_key: tuple[int, int, int] | None = None
    levels: dict[str, int] = field(default_factory=dict)
    lines: dict[str, QueueLine] = field(default_factory=dict)
    # decisions
    admissions: list[Admission] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    reservations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    claims: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    visit_order: list[str] = field(default_factory=list)
    late_admitted: set[str] = field(default_factory=set)
    victims: set[str] = field(default_factory=set)
    backfill_until: dict[str, float] = field(default_factory=dict)
    # Quota charged by this cycle's admissions, per (queue, resource): reclaim looks at what a
    # queue borrows with work that already runs, not with work admitted just now.
    admitted_charge: dict[tuple[str, str], float] = field(default_factory=dict)
    # Quota of victims already chosen this cycle (still charged until they stop), so that two
    # preemptors do not both count the same borrowed GPUs as reclaimable.
    victim_charge: dict[tuple[str, str], float] = field(default_factory=dict)
    # Quota of terminating workloads (still charged until they stop), per (queue, resource):
    # reclaim counts only the borrowing of work that stays.
    leaving_charge: dict[tuple[str, str], float] = field(default_factory=dict)
    # budgets used and failure caches
    cap_fail: dict[str, list[tuple[int, int, float, int, bool]]] = field(default_factory=dict)
    # (GPU model, GPUs per node) -> schedulable nodes of that model with at least that many
    big_nodes: dict[tuple[str, int], int] = field(default_factory=dict)
    quota_fail: dict[tuple[str, str], float] = field(default_factory=dict)
    preempt_attempts: int = 0
    preemptors: int = 0
    node_tries: int = 0
    borrowed_tries: int = 0
    defrag_tries: int = 0
    defrag_failed: dict[str, float] = field(default_factory=dict)
    # Facts behind the last successful preemption / reservation, for its pending reason.
    last_preempt_details: dict[str, object] = field(default_factory=dict)
    last_reserve_details: dict[str, object] = field(default_factory=dict)
    final_quota: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)
    # pending workload id -> when the first borrower it could reclaim, but that has run less
    # than reclaim_min_run_s, becomes reclaimable (for its pending reason and the next wake)
    reclaim_at: dict[str, float] = field(default_factory=dict)

    # --- quota usage -----------------------------------------------------------------------

    def charge(self, queue: str, resource: str, amount: float, cpu: float, gpu: bool) -> None:
        """Add `amount` of `resource` (and `cpu` cores for a GPU workload) to a queue."""
        if not self.tree.has_queue(queue):
            return
        self.tree.add_usage(queue, resource, amount)
        usage = self.q_usage.setdefault(queue, {})
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

    # --- service levels --------------------------------------------------------------------

    def level(self, w: Workload) -> int:
        """Attained-service level of `w` now (0 = least served)."""
        if not self.cfg.service_levels_gpu_s:
            return 0
        return self.cfg.service_level(w.service_s(self.now) * max(1, w.total_gpus))

    def pending_level(self, w: Workload) -> int:
        """Level of pending `w` as computed once in phase 3."""
        return self.levels.get(w.id, 0)


def build_cycle_state(cfg: SchedulerConfig, snap: Snapshot, now: float) -> CycleState:
    """Phases 1-3: capacity from the inventory, quota usage and history, ordered queues."""
    state = ClusterState(snap.nodes, snap.running, now)
    capacity: dict[str, float] = {CPU_RESOURCE: 0.0}
    max_cpu: dict[str, float] = {}
    max_mem: dict[str, int] = {}
    for node in snap.nodes:
        if node.gpu_model:
            capacity[node.gpu_model] = capacity.get(node.gpu_model, 0.0) + node.gpus_total
        capacity[CPU_RESOURCE] += node.cpu_total
        # Largest CPU and memory of one schedulable node per index key: a workload asking
        # more per node can never start there, however long it waits.
        if node.schedulable:
            key = node.gpu_model or CPU_MODEL
            max_cpu[key] = max(max_cpu.get(key, 0.0), node.cpu_total)
            max_mem[key] = max(max_mem.get(key, 0), node.mem_total)
    st = CycleState(
        cfg=cfg,
        snap=snap,
        now=now,
        state=state,
        gpu_models=[m for m in state.open if m != CPU_MODEL],
        capacity=capacity,
        max_gpus_per_node={m: ix.max_gpus for m, ix in state.open.items()},
        max_cpu_per_node=max_cpu,
        max_mem_per_node=max_mem,
        tree=QuotaTree(snap.quotas),
        history=decay_usage(snap.usage_history, snap.running, now, cfg.fair_share_half_life_s),
    )
    _charge_running(st)
    _order_pending(st)
    return st


def _charge_running(st: CycleState) -> None:
    """Phase 2: charge running workloads to quotas; index preemption candidates."""
    totals: dict[tuple[str, str], float] = {}
    service = st.cfg.preempt_by_service and bool(st.cfg.service_levels_gpu_s)
    min_start = st.now - st.cfg.service_preemption_min_run_s
    # Local names: this loop runs over every running workload.
    total_of = totals.get
    by_queue = st.by_queue
    min_prio = st.q_min_prio
    most_served: dict[str, float] = {}
    now = st.now
    for w in st.snap.running:
        placement = w.placement
        if placement is None:
            continue
        model = placement.gpu_model or CPU_MODEL
        queue = w.queue
        if w.gpus_per_node > 0 and model:
            key = (queue, model)
            totals[key] = total_of(key, 0.0) + w.nodes * w.gpus_per_node
            if w.cpu_per_node:
                key = (queue, CPU_RESOURCE)
                totals[key] = total_of(key, 0.0) + w.nodes * w.cpu_per_node
        else:
            key = (queue, CPU_RESOURCE)
            totals[key] = total_of(key, 0.0) + w.nodes * w.cpu_per_node
        if w.terminating:
            st.leaving.setdefault(model, []).append(w)
            key = (queue, resource_of(w, placement.gpu_model))
            st.leaving_charge[key] = st.leaving_charge.get(key, 0.0) + charge_of(w)
            continue
        key = (model, queue)
        pool = by_queue.get(key)
        if pool is None:
            pool = by_queue[key] = []
        pool.append(w)
        if w.preemptible:
            if w.priority < min_prio.get(queue, w.priority + 1):
                min_prio[queue] = w.priority
            start = w.start_time
            if service and start is not None and start <= min_start:
                # st.level(w) is monotone in these GPU-seconds: keep each queue's
                # largest and take its level once, after the loop.
                served = (w.attained_service_s + max(0.0, now - start)) * max(
                    1, w.nodes * w.gpus_per_node
                )
                if served > most_served.get(queue, -INF):
                    most_served[queue] = served
    for queue, served in most_served.items():
        level = st.cfg.service_level(served)
        if level > 0:
            st.q_max_level[queue] = level
    st.max_level = max(st.q_max_level.values(), default=0)
    for (queue, resource), amount in totals.items():
        st.charge(queue, resource, amount, 0.0, False)


def _order_pending(st: CycleState) -> None:
    """Phase 3: group pending workloads per queue and sort each queue once."""
    groups: dict[str, list[Workload]] = {}
    known = st.tree.index
    for w in st.snap.pending:
        group = groups.get(w.queue)
        if group is None:
            if w.queue not in known:
                st.outcomes[w.id] = Outcome(
                    "unschedulable", {"queue": w.queue, "missing_queue": True}, 0
                )
                continue
            group = groups[w.queue] = []
        group.append(w)
    pending = st.snap.pending
    # Cheap C-level scans first: most backlogs have neither CPU-only nor resumed work.
    if pending and min(map(_GPUS_PER_NODE, pending)) == 0:
        st.cpu_queues = {w.queue for w in pending if w.gpus_per_node == 0}
    st.has_cpu_pending = bool(st.cpu_queues)
    leveled: set[str] = set()
    if st.cfg.service_levels_gpu_s and any(map(_ATTAINED, pending)):
        for w in pending:
            if w.attained_service_s > 0:  # fresh submissions are level 0: skip the work
                level = st.level(w)
                if level:
                    st.levels[w.id] = level
                    leveled.add(w.queue)
    # Two sequential passes over the whole backlog spare a hundred scattered per-queue ones:
    # a queue's items keep the backlog's order, so a backlog in strict submission order (or
    # of one priority) has every queue so too.
    times = list(map(_BY_TIME, pending))
    in_order = all(map(operator.lt, times, islice(times, 1, None)))
    one_priority = len(set(map(_PRIORITY, pending))) <= 1
    st.lines = {
        q: QueueLine(q, _sort_queue(st, groups[q], q in leveled, in_order, one_priority))
        for q in sorted(groups)
    }


def _sort_queue(
    st: CycleState, items: list[Workload], leveled: bool, in_order: bool, one_priority: bool
) -> list[Workload]:
    """(-priority, reclaiming first, level, submit time, id) by stable passes with C-level keys.

    `in_order` / `one_priority`: the items are known to be in strict submission order / of
    one priority already (skips checking them).
    """
    times = [] if in_order else list(map(_BY_TIME, items))
    if not (in_order or all(map(operator.lt, times, islice(times, 1, None)))):
        # Not already listed in strict submission order (the common case skips this).
        if st.cfg.ordering_tiebreak_by_id and len(set(times)) < len(items):
            items.sort(key=_ID)  # equal submit times: the id decides, whatever the order
        items.sort(key=_BY_TIME)
    if leveled:
        levels = st.levels
        items.sort(key=lambda w: levels.get(w.id, 0))
    if any(w.reclaiming for w in items):  # the room made for them goes to them
        items.sort(key=lambda w: not w.reclaiming)
    if not one_priority and len(set(map(_PRIORITY, items))) > 1:
        items.sort(key=_PRIORITY, reverse=True)  # reverse=True keeps the sort stable
    return items
