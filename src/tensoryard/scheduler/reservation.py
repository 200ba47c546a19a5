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
from tensoryard.scheduler.model import Workload
from tensoryard.scheduler.placement import models_for, place
from tensoryard.scheduler.state import INF

__all__ = ["backfill_pass", "may_backfill", "try_reserve"]

_Timed = tuple[float, int, int, NodeState]


def may_backfill(st: CycleState, w: Workload, model: str) -> bool:
    """`w` may use GPUs held on `model`: its estimate ends before the reserved start."""
    if st.state.held[model].total_free <= 0 and w.gpus_per_node > 0:
        return False
    until = st.backfill_until.get(model)
    if until is None or w.runtime_estimate_s is None:
        return False
    return st.now + w.runtime_estimate_s <= until


def try_reserve(st: CycleState, w: Workload, model: str) -> bool:
    """Hold the nodes that free up first for `w` (head of line); others may only backfill."""
    if len(st.reservations) >= st.cfg.max_reservations:
        return False
    open_index = st.state.open[model]
    g = w.gpus_per_node
    timed = [
        (st.state.free_at(s, g, w.cpu_per_node), -len(s.free), s.ix, s)
        for s in open_index.nodes.values()
    ]
    chosen = _choose_reserved(timed, w)
    if not chosen:
        return False
    start = max(t for t, *_ in chosen)
    states = [s for *_, s in chosen]
    st.state.hold(model, states)
    known = start if start != INF else -INF
    st.backfill_until[model] = min(st.backfill_until.get(model, INF), known)
    st.reservations[w.id] = tuple(s.name for s in states)
    st.last_reserve_details = {
        "nodes": w.nodes,
        "gpus_per_node": w.gpus_per_node,
        "model": model or None,
        "held_nodes": [s.name for s in states],
        "eta": None if start == INF else start,
    }
    return True


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
        for m, until in st.backfill_until.items()
        if until > st.now and st.state.held[m].total_free > 0
    }
    if not windows:
        return
    latest = max(windows.values()) - st.now
    depth = max(1, st.cfg.backfill_depth // max(1, len(st.lines)))
    for line in st.lines.values():
        for w in islice(line.items, line.cursor, line.cursor + depth):
            estimate = w.runtime_estimate_s
            if estimate is None or estimate > latest or w.gpus_per_node == 0:
                continue
            if _backfill_one(st, w, windows):
                st.late_admitted.add(w.id)
            if not any(st.state.held[m].total_free > 0 for m in windows):
                return


def _backfill_one(st: CycleState, w: Workload, windows: Mapping[str, float]) -> bool:
    assert w.runtime_estimate_s is not None
    for model in models_for(st, w):
        held = st.state.held.get(model)
        if model not in windows or held is None or held.total_free < w.gpus_per_node:
            continue
        if st.now + w.runtime_estimate_s > windows[model]:
            continue
        if check_quota(st, w, resource_of(w, model)) is not None:
            continue
        nodes = place(st, held, w, model, cache=f"held:{model}")
        if nodes is not None:
            commit(st, w, model, nodes)
            return True
    return False
