"""Head-of-line reservation and backfill.

The first ``max_reservations`` workloads that fit quota but not capacity get the nodes that
free up first held for them (their estimated start is when the last of those frees up).
Held GPUs go only to work whose runtime estimate ends before that start (backfill), during
the cycle and in a final pass over the next waiting workloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice

from tensoryard.scheduler.accounting import resource_of
from tensoryard.scheduler.admission import check_quota, commit
from tensoryard.scheduler.capacity import NodeState
from tensoryard.scheduler.cycle_state import CycleState
from tensoryard.scheduler.entry import Entry, Held
from tensoryard.scheduler.model import Workload
from tensoryard.scheduler.placement import models_for, place
from tensoryard.scheduler.state import INF

__all__ = ["apply", "backfill_pass", "may_backfill", "try_reserve"]

_Timed = tuple[float, int, int, NodeState]


def may_backfill(st: CycleState, w: Workload, model: str) -> bool:
    """`w` may use GPUs held on `model`: its estimate ends before the reserved start."""
    if st.cap.state.held[model].total_free <= 0 and w.gpus_per_node > 0:
        return False
    until = st.decided.backfill_until.get(model)
    if until is None or w.runtime_estimate_s is None:
        return False
    return st.now + w.runtime_estimate_s <= until


def try_reserve(st: CycleState, entry: Entry, model: str) -> bool:
    """Choose the nodes that free up first to hold for the entry's workload (head of line;
    others may only backfill them); :func:`apply` holds them."""
    w = entry.workload
    if len(st.decided.reservations) >= st.cfg.max_reservations:
        return False
    open_index = st.cap.state.open[model]
    g = w.gpus_per_node
    timed = [
        (st.cap.state.free_at(s, g, w.cpu_per_node), -len(s.free), s.ix, s)
        for s in open_index.nodes.values()
    ]
    chosen = _choose_reserved(timed, w)
    if not chosen:
        return False
    entry.hold(Held(model, [s for *_, s in chosen], max(t for t, *_ in chosen)))
    return True


def apply(st: CycleState, entry: Entry) -> None:
    """Hold the nodes the entry carries; its outcome says "reserved", with when."""
    w, held = entry.workload, entry.held
    assert held is not None
    st.cap.state.hold(held.model, held.nodes)
    start = held.start
    names = tuple(s.name for s in held.nodes)
    st.decided.reserve(w.id, held.model, names, start if start != INF else -INF)
    details = {
        "nodes": w.nodes,
        "gpus_per_node": w.gpus_per_node,
        "model": held.model or None,
        "held_nodes": list(names),
        "eta": None if start == INF else start,
    }
    entry.conclude("reserved", st.decided.with_reclaim(w, details, st.cfg.reclaim_min_run_s))


def _choose_reserved(timed: list[_Timed], w: Workload) -> list[_Timed]:
    if w.topology == "required" and w.nodes > 1:
        by_switch: dict[int, list[_Timed]] = {}
        for item in timed:
            by_switch.setdefault(item[3].switch, []).append(item)
        best: list[_Timed] = []
        best_t = INF
        for items in by_switch.values():
            if len(items) < w.nodes:
                continue
            items.sort(key=lambda t: t[:3])
            t = items[w.nodes - 1][0]
            if not best or t < best_t:
                best, best_t = items[: w.nodes], t
        return best
    if len(timed) < w.nodes:
        return []
    timed.sort(key=lambda t: t[:3])
    return timed[: w.nodes]


def backfill_pass(st: CycleState) -> None:
    """Offer reserved GPUs to unvisited work whose estimate ends before the reserved start.

    The main loop stops visiting a queue once nothing more could start in open capacity;
    this pass looks at the next `backfill_depth` waiting workloads (shared among queues,
    like Slurm's bf_max_job_test) with a runtime estimate short enough to backfill.
    """
    windows = {
        m: until
        for m, until in st.decided.backfill_until.items()
        if until > st.now and st.cap.state.held[m].total_free > 0
    }
    if not windows:
        return
    latest = max(windows.values()) - st.now
    depth = max(1, st.cfg.backfill_depth // max(1, len(st.queues.lines)))
    for line in st.queues.lines.values():
        for w in islice(line.items, line.cursor, line.cursor + depth):
            estimate = w.runtime_estimate_s
            if estimate is None or estimate > latest or w.gpus_per_node == 0:
                continue
            _backfill_one(st, w, windows)
            if not any(st.cap.state.held[m].total_free > 0 for m in windows):
                return


def _backfill_one(st: CycleState, w: Workload, windows: Mapping[str, float]) -> bool:
    assert w.runtime_estimate_s is not None
    for model in models_for(st, w):
        held = st.cap.state.held.get(model)
        if model not in windows or held is None or held.total_free < w.gpus_per_node:
            continue
        if st.now + w.runtime_estimate_s > windows[model]:
            continue
        if check_quota(st, w, resource_of(w, model)) is not None:
            continue
        nodes = place(st, held, w, model, cache=f"held:{model}")
        if nodes is not None:
            commit(st, w, model, nodes, late=True)
            return True
    return False
