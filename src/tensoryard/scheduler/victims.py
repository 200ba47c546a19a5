"""Victim choice: who may be preempted for whom, and at what cost.

A victim is charged the work it loses (GPU-seconds since its last checkpoint); the cheapest
eligible victims go first. Rules (see the package docstring for the ranking they respect):
lower priority in the same queue; the same priority and a higher attained-service level
(``attained-service``, and ``borrowed-service`` for another queue's long runner on borrowed
quota); reclaim of quota a cohort queue borrows with running work (``reclaim``), from
attempts that ran at least ``reclaim_min_run_s``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from operator import itemgetter

from tensoryard.scheduler.accounting import charge_of, resource_of
from tensoryard.scheduler.admission import borrows_running, within_nominal_after
from tensoryard.scheduler.cycle_state import Cost, CycleState
from tensoryard.scheduler.model import Workload

__all__ = [
    "may_preempt",
    "service_of_borrowers_left",
    "still_borrows",
    "victim_cost",
    "victim_pool",
    "victim_queues",
    "victim_reason",
]

_FIRST = itemgetter(0)


def victim_cost(st: CycleState, v: Workload) -> Cost:
    """Work lost (GPU-seconds since the last checkpoint), then priority, then youngest."""
    start = v.start_time if v.start_time is not None else st.now
    mark = max(start, v.last_checkpoint_time or start)
    lost = max(1, v.total_gpus) * max(0.0, st.now - mark)
    return (lost, v.priority, -start, v.id)


def _service_preemptible(st: CycleState, v: Workload) -> bool:
    if not st.cfg.preempt_by_service or v.start_time is None:
        return False
    return st.now - v.start_time >= st.cfg.service_preemption_min_run_s


def may_preempt(st: CycleState, w: Workload, model: str) -> bool:
    """Cheap test: could any rule give `w` a victim on `model`?"""
    cfg = st.cfg
    if st.running.leaving.get(model):
        return True
    if cfg.preempt_lower_priority and st.running.min_priority.get(w.queue, w.priority) < w.priority:
        return True
    if cfg.preempt_by_service and st.running.max_level.get(w.queue, 0) > st.pending_level(w):
        return True
    if service_of_borrowers_left(st) and st.running.top_level > st.pending_level(w):
        return True
    return cfg.reclaim and within_nominal_after(st, w, model or None)


def victim_reason(st: CycleState, w: Workload, v: Workload, within_nominal: bool) -> str | None:
    """The rule that lets `w` preempt `v`, or None."""
    if v.id in st.decided.victims or not v.preemptible or v.placement is None:
        return None
    cfg = st.cfg
    if v.queue == w.queue:
        if cfg.preempt_lower_priority and v.priority < w.priority:
            return "priority"
        if (
            v.priority == w.priority
            and _service_preemptible(st, v)
            and st.level(v) > st.pending_level(w)
        ):
            return "attained-service"
        return None
    resource = resource_of(v, v.placement.gpu_model)
    if (
        cfg.service_preemption_of_borrowers
        and v.priority == w.priority
        and _service_preemptible(st, v)
        and st.level(v) > st.pending_level(w)
        and st.quota.tree.has_queue(v.queue)
        and st.quota.tree.same_tree(w.queue, v.queue)
        and borrows_running(st, v.queue, resource, keep=charge_of(v))
    ):
        return "borrowed-service"
    if (
        cfg.reclaim
        and within_nominal
        and st.quota.tree.has_queue(v.queue)
        and st.quota.tree.same_tree(w.queue, v.queue)
        and borrows_running(st, v.queue, resource)
    ):
        if v.start_time is not None and st.now - v.start_time < cfg.reclaim_min_run_s:
            st.decided.note_reclaim_at(w.id, v.start_time + cfg.reclaim_min_run_s)
            return None
        return "reclaim"
    return None


def still_borrows(st: CycleState, v: Workload, reason: str) -> bool:
    """For a victim taken because its queue borrows: True while that still holds, given the
    victims chosen so far (``borrowed-service`` leaves its queue at least its nominal quota)."""
    if reason not in ("reclaim", "borrowed-service"):
        return True
    assert v.placement is not None
    resource = resource_of(v, v.placement.gpu_model)
    keep = charge_of(v) if reason == "borrowed-service" else 0.0
    return borrows_running(st, v.queue, resource, keep=keep)


def victim_pool(st: CycleState, w: Workload, model: str, within: bool) -> Iterator[Workload]:
    """Running workloads that may be victims of `w`, cheapest first."""
    sources = [_pool(st, model, queue) for queue in victim_queues(st, w, model, within)]
    for _, v in heapq.merge(*sources, key=_FIRST):
        yield v


def victim_queues(st: CycleState, w: Workload, model: str, within: bool) -> list[str]:
    """`w`'s queue, and the borrowing queues of its tree that a rule lets it take from."""
    queues = [w.queue]
    reclaim = st.cfg.reclaim and within
    service = service_of_borrowers_left(st)
    if not (reclaim or service):
        return queues
    level = st.pending_level(w)
    resource = resource_of(w, model or None)
    if service and not reclaim:
        st.budgets.spend_borrowed_try()
    for queue in st.quota.tree.tree_queues(w.queue):
        if queue == w.queue or not (reclaim or st.running.max_level.get(queue, 0) > level):
            continue
        if borrows_running(st, queue, resource):
            queues.append(queue)
    return queues


def service_of_borrowers_left(st: CycleState) -> bool:
    """Whether "borrowed-service" may still be tried this cycle (bounded: each try scans
    other queues' victims)."""
    return (
        st.cfg.service_preemption_of_borrowers
        and st.running.top_level > 0
        and st.budgets.borrowed_try_left()
    )


def _pool(st: CycleState, model: str, queue: str) -> list[tuple[Cost, Workload]]:
    """A queue's running workloads on `model`, cheapest victim first (built on first use)."""
    return st.running.pool(model, queue, lambda v: victim_cost(st, v))
