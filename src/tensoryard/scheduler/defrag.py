"""Defragmentation: clear whole nodes for a gang that fails on placement alone.

Only when enough GPUs are free in total: single-node workloads that ran at least
``defrag_min_run_s`` and do not outrank the gang (priority, then service level) are moved,
cheapest work lost first, and only as many as the GPUs left free after the gang starts can
take back at once, so a victim is migrated, not displaced (reason "defragment").
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter, itemgetter

from tensoryard.scheduler.capacity import CapacityIndex, NodeState
from tensoryard.scheduler.cycle_state import CycleState
from tensoryard.scheduler.entry import Entry
from tensoryard.scheduler.model import Workload
from tensoryard.scheduler.placement import claim_gpus, fits
from tensoryard.scheduler.preemption import unvacate, vacate
from tensoryard.scheduler.victims import victim_cost

__all__ = ["try_defrag"]

_FIRST = itemgetter(0)
_GPUS_PER_NODE = attrgetter("gpus_per_node")


def try_defrag(st: CycleState, entry: Entry, model: str) -> bool:
    """Move small jobs off partly free nodes so that the entry's workload gets whole nodes;
    True if found (the entry carries the moves, issued as preemptions when applied)."""
    w = entry.workload
    if not st.cfg.defragment or w.gpus_per_node == 0 or not model:
        return False
    if not st.budgets.defrag_left():
        return False
    index = st.cap.state.open[model]
    spare = index.total_free - w.total_gpus
    if spare <= 0 or w.gpus_per_node <= 1:
        return False
    if st.budgets.defrag_failed_for(model, w.gpus_per_node):
        return False  # a worker as wide found no node to clear this cycle
    st.budgets.spend_defrag_try()
    options = _options(st, w, index)
    if not options:
        st.budgets.note_defrag_failed(model, w.gpus_per_node)
        return False
    removed: list[tuple[Workload, str]] = []
    moved = 0
    fit = False
    for _, gpus, _, victims in options:
        if moved + gpus > spare:
            continue
        for v in victims:
            vacate(st, v)
            removed.append((v, "defragment"))
        moved += gpus
        if fits(st, w, model):
            fit = True
            break
    gpus_claimed: dict[str, tuple[int, ...]] = {}
    if fit:
        gpus_claimed = claim_gpus(st, w, model)
        fit = bool(gpus_claimed) and _victims_replace(
            st, index, gpus_claimed, [v for v, _ in removed]
        )
    for v, _ in removed:
        unvacate(st, v)
    if not fit:
        return False
    st.budgets.count_preemptor()
    entry.preempt(removed, gpus_claimed)
    return True


def _victims_replace(
    st: CycleState,
    index: CapacityIndex,
    claimed: Mapping[str, tuple[int, ...]],
    victims: list[Workload],
) -> bool:
    """What-if: with `claimed` taken, every victim finds a node elsewhere (best fit)."""
    undo: list[tuple[NodeState, tuple[int, ...]]] = []
    ok = True
    for name, gpus in claimed.items():
        state = st.cap.state.by_name[name]
        index.take_exact(state, gpus, 0.0, 0)
        undo.append((state, gpus))
    for v in sorted(victims, key=_GPUS_PER_NODE, reverse=True):
        node = index.best_node(v.gpus_per_node, v.cpu_per_node, v.mem_per_node)
        if node is None:
            ok = False
            break
        undo.append((node, index.take(node, v.gpus_per_node, 0.0, 0)))
    for state, gpus in reversed(undo):
        index.give(state, gpus, 0.0, 0)
    return ok


def _options(
    st: CycleState, w: Workload, index: CapacityIndex
) -> list[tuple[float, int, int, list[Workload]]]:
    """Per node short of room for one worker of `w`: (work lost, GPUs moved, node, victims)
    to clear it, cheapest first."""
    on_node = st.cap.state.running_on
    level = st.pending_level(w)
    min_start = st.now - st.cfg.defrag_min_run_s
    options: list[tuple[float, int, int, list[Workload]]] = []
    for state in index.nodes.values():
        missing = w.gpus_per_node - len(state.free)
        # Only partly free nodes: clearing a full one moves more work (and is slower to
        # search in a big, busy cluster).
        if missing <= 0 or missing == w.gpus_per_node or state.gpus_total < w.gpus_per_node:
            continue
        eligible = sorted(
            (
                (victim_cost(st, v), v)
                for v in on_node[state.ix]
                if v.nodes == 1
                and v.gpus_per_node < w.gpus_per_node
                and v.preemptible
                and v.id not in st.decided.victims
                and v.priority <= w.priority
                and v.start_time is not None
                and v.start_time <= min_start
                and st.level(v) >= level
            ),
            key=_FIRST,
        )
        victims: list[Workload] = []
        lost = 0.0
        for cost, v in eligible:
            victims.append(v)
            lost += cost[0]
            missing -= v.gpus_per_node
            if missing <= 0:
                break
        if missing > 0:
            continue
        gpus = sum(v.gpus_per_node for v in victims)
        options.append((lost, gpus, state.ix, victims))
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    return options
