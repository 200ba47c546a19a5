"""The state of one scheduling cycle, built once from the snapshot (phases 1 to 3).

A :class:`CycleState` is a few parts, each owning its data behind methods (no module
assigns another part's fields):

- ``cap`` (:class:`~tensoryard.scheduler.views.CapacityView`): free capacity per node and
  model, the largest node per model, placement failure caches;
- ``quota`` (:class:`~tensoryard.scheduler.views.QuotaView`): the quota tree and its usage,
  fair-share history, what this cycle charged (charge / uncharge / recharge);
- ``running`` (:class:`~tensoryard.scheduler.views.RunningIndex`): running work indexed for
  victim searches;
- ``queues`` (:class:`~tensoryard.scheduler.ledger.Queues`): the ordered pending queues;
- ``decided`` (:class:`~tensoryard.scheduler.ledger.Decided`): admissions, preemptions,
  reservations, claims, and one :class:`~tensoryard.scheduler.entry.Entry` per visit;
- ``budgets`` (:class:`~tensoryard.scheduler.ledger.Budgets`): bounded searches used.

The concern modules (``admission``, ``placement``, ``preemption``, ``defrag``,
``reservation``, ``ordering``) are functions over it; none keeps state of its own.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter

from tensoryard.scheduler.accounting import decay_usage
from tensoryard.scheduler.config import SchedulerConfig
from tensoryard.scheduler.entry import Entry, Fail
from tensoryard.scheduler.ledger import Budgets, Decided, QueueLine, Queues
from tensoryard.scheduler.model import Snapshot, Workload
from tensoryard.scheduler.quota import QuotaTree
from tensoryard.scheduler.state import CPU_MODEL, INF
from tensoryard.scheduler.views import CapacityView, Cost, QuotaView, RunningIndex
from tensoryard.spec.queue import CPU_RESOURCE

__all__ = ["Cost", "CycleState", "Fail", "QueueLine", "build_cycle_state"]

_ID = attrgetter("id")
_BY_TIME = attrgetter("submit_time")
_PRIORITY = attrgetter("priority")
_GPUS_PER_NODE = attrgetter("gpus_per_node")
_ATTAINED = attrgetter("attained_service_s")


@dataclass(slots=True, kw_only=True)
class CycleState:
    """Everything one cycle knows and decides, by part. Built by :func:`build_cycle_state`."""

    cfg: SchedulerConfig
    snap: Snapshot
    now: float
    cap: CapacityView
    quota: QuotaView
    running: RunningIndex = field(default_factory=RunningIndex)
    queues: Queues = field(default_factory=Queues)
    decided: Decided = field(default_factory=Decided)
    budgets: Budgets

    # --- service levels --------------------------------------------------------------------

    def level(self, w: Workload) -> int:
        """Attained-service level of `w` now (0 = least served)."""
        if not self.cfg.service_levels_gpu_s:
            return 0
        return self.cfg.service_level(w.service_s(self.now) * max(1, w.total_gpus))

    def pending_level(self, w: Workload) -> int:
        """Level of pending `w` as computed once in phase 3."""
        return self.queues.levels.get(w.id, 0)


def build_cycle_state(cfg: SchedulerConfig, snap: Snapshot, now: float) -> CycleState:
    """Phases 1-3: capacity from the inventory, quota usage and history, ordered queues."""
    st = CycleState(
        cfg=cfg,
        snap=snap,
        now=now,
        cap=CapacityView.build(snap.nodes, snap.running, now),
        quota=QuotaView(
            QuotaTree(snap.quotas),
            decay_usage(snap.usage_history, snap.running, now, cfg.fair_share_half_life_s),
        ),
        budgets=Budgets(cfg),
    )
    st.running = _charge_running(st)
    st.queues = _order_pending(st)
    return st


def _charge_running(st: CycleState) -> RunningIndex:
    """Phase 2: charge running workloads to quotas; index preemption candidates."""
    index = RunningIndex()
    totals: dict[tuple[str, str], float] = {}
    service = st.cfg.preempt_by_service and bool(st.cfg.service_levels_gpu_s)
    min_start = st.now - st.cfg.service_preemption_min_run_s
    # Local names: this loop runs over every running workload.
    total_of = totals.get
    by_queue = index.by_queue
    min_prio = index.min_priority
    leaving = index.leaving
    quota = st.quota
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
            leaving.setdefault(model, []).append(w)
            quota.mark_leaving(w)
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
            index.max_level[queue] = level
    index.top_level = max(index.max_level.values(), default=0)
    for (queue, resource), amount in totals.items():
        quota.charge(queue, resource, amount, 0.0, False)
    return index


def _order_pending(st: CycleState) -> Queues:
    """Phase 3: group pending workloads per queue and sort each queue once."""
    queues = Queues()
    groups: dict[str, list[Workload]] = {}
    known = st.quota.tree.index
    for w in st.snap.pending:
        group = groups.get(w.queue)
        if group is None:
            if w.queue not in known:
                entry = Entry(w, 0)
                entry.conclude("unschedulable", {"queue": w.queue, "missing_queue": True})
                st.decided.visit(entry)
                continue
            group = groups[w.queue] = []
        group.append(w)
    pending = st.snap.pending
    # Cheap C-level scans first: most backlogs have neither CPU-only nor resumed work.
    if pending and min(map(_GPUS_PER_NODE, pending)) == 0:
        queues.cpu_queues = {w.queue for w in pending if w.gpus_per_node == 0}
    queues.has_cpu_pending = bool(queues.cpu_queues)
    leveled: set[str] = set()
    if st.cfg.service_levels_gpu_s and any(map(_ATTAINED, pending)):
        for w in pending:
            if w.attained_service_s > 0:  # fresh submissions are level 0: skip the work
                level = st.level(w)
                if level:
                    queues.levels[w.id] = level
                    leveled.add(w.queue)
    # Two sequential passes over the whole backlog spare a hundred scattered per-queue ones:
    # a queue's items keep the backlog's order, so a backlog in strict submission order (or
    # of one priority) has every queue so too.
    times = list(map(_BY_TIME, pending))
    in_order = all(map(operator.lt, times, islice(times, 1, None)))
    one_priority = len(set(map(_PRIORITY, pending))) <= 1
    queues.lines = {
        q: QueueLine(
            q, _sort_queue(queues, groups[q], q in leveled, in_order, one_priority, st.cfg)
        )
        for q in sorted(groups)
    }
    return queues


def _sort_queue(
    queues: Queues,
    items: list[Workload],
    leveled: bool,
    in_order: bool,
    one_priority: bool,
    cfg: SchedulerConfig,
) -> list[Workload]:
    """(-priority, reclaiming first, level, submit time, id) by stable passes with C-level keys.

    `in_order` / `one_priority`: the items are known to be in strict submission order / of
    one priority already (skips checking them).
    """
    times = [] if in_order else list(map(_BY_TIME, items))
    if not (in_order or all(map(operator.lt, times, islice(times, 1, None)))):
        # Not already listed in strict submission order (the common case skips this).
        if cfg.ordering_tiebreak_by_id and len(set(times)) < len(items):
            items.sort(key=_ID)  # equal submit times: the id decides, whatever the order
        items.sort(key=_BY_TIME)
    if leveled:
        levels = queues.levels
        items.sort(key=lambda w: levels.get(w.id, 0))
    if any(w.reclaiming for w in items):  # the room made for them goes to them
        items.sort(key=lambda w: not w.reclaiming)
    if not one_priority and len(set(map(_PRIORITY, items))) > 1:
        items.sort(key=_PRIORITY, reverse=True)  # reverse=True keeps the sort stable
    return items
