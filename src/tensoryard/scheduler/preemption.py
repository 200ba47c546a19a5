"""Preemption: find the fewest, cheapest victims that make room for a workload, and issue.

Every search is a what-if on the cycle state: victims are removed (their GPUs given back,
their quota uncharged) until the preemptor fits, the ones not needed are put back, and then
all are restored, because victims keep running through their grace period. The preemptor
keeps (claims) the GPUs it will use that are free already.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter

from tensoryard.scheduler.accounting import charge_of
from tensoryard.scheduler.admission import within_nominal_after
from tensoryard.scheduler.cycle_state import Cost, CycleState, QueueLine
from tensoryard.scheduler.entry import Entry, Victims
from tensoryard.scheduler.model import Preemption, Workload
from tensoryard.scheduler.placement import claim_gpus, fits
from tensoryard.scheduler.state import CPU_MODEL
from tensoryard.scheduler.victims import (
    may_preempt,
    still_borrows,
    victim_cost,
    victim_pool,
    victim_queues,
    victim_reason,
)

__all__ = ["claim", "issue", "may_preempt_any", "try_preempt", "unvacate", "vacate"]

_FIRST = itemgetter(0)
Removed = Victims


def budget_left(st: CycleState) -> bool:
    """True while the cycle may still issue preemptions and search for them."""
    return st.budgets.preemption_left()


def may_preempt_any(st: CycleState, w: Workload, models: tuple[str, ...]) -> bool:
    """Could preemption still help `w` on one of `models` this cycle?"""
    if not budget_left(st):
        return False  # try_preempt would refuse: do not keep the queue open for it
    return any(may_preempt(st, w, m) for m in models)


def try_preempt(st: CycleState, entry: Entry, line: QueueLine) -> bool:
    """Find victims for the entry's workload on the first model where they make it fit
    (the entry carries them and the GPUs it keeps; :func:`apply` issues them)."""
    w = entry.workload
    if not budget_left(st):
        return False
    need = charge_of(w)
    if need >= line.preempt_failed_need:
        return False
    for fail in entry.fails:
        model = fail.model if w.gpus_per_node > 0 else CPU_MODEL
        if model is None or not may_preempt(st, w, model):
            continue
        st.budgets.spend_preempt_attempt()
        if _preempt_on(st, entry, model):
            st.budgets.count_preemptor()
            return True
    line.note_preempt_failed(need)
    return False


def apply(st: CycleState, entry: Entry) -> None:
    """Issue the preemptions the entry carries and keep its GPUs for it; its outcome
    says "preempting", with the victims."""
    w = entry.workload
    assert entry.victims is not None
    details = issue(st, w, entry.victims)
    claim(st, w, entry.claimed)
    entry.conclude("preempting", details)


def _preempt_on(st: CycleState, entry: Entry, model: str) -> bool:
    """What-if: remove the cheapest eligible victims until `w` fits, then keep the fewest."""
    w = entry.workload
    within = within_nominal_after(st, w, model or None)
    candidates: Removed = [(v, "terminating") for v in _leaving_for(st, w, model)]
    for v in victim_pool(st, w, model, within):
        reason = victim_reason(st, w, v, within)
        if reason is not None:
            candidates.append((v, reason))
            if len(candidates) >= st.cfg.max_victim_candidates:
                break
    if not candidates:
        return False
    removed: Removed = []
    fit = False
    for v, reason in candidates:
        if not still_borrows(st, v, reason):
            continue
        vacate(st, v)
        removed.append((v, reason))
        if fits(st, w, model):
            fit = True
            break
    if not fit and w.gpus_per_node > 1 and st.budgets.node_try_left():
        # The cheapest victims were scattered over nodes: clear whole nodes instead.
        st.budgets.spend_node_try()
        for v, _ in reversed(removed):
            unvacate(st, v)
        removed = _victims_by_node(st, w, model, within)
        fit = bool(removed)
    gpus: dict[str, tuple[int, ...]] = {}
    if fit:
        removed = _fewest(st, w, model, removed)
        gpus = claim_gpus(st, w, model)  # in the world after the preemption
    for v, _ in removed:  # victims keep running through their grace period
        unvacate(st, v)
    if not fit:
        return False
    entry.preempt(removed, gpus)
    return True


def _victims_by_node(st: CycleState, w: Workload, model: str, within: bool) -> Removed:
    """Clear the nodes that are cheapest to clear (work lost) for one worker of `w` each,
    until `w` fits. Returns the victims, left vacated, or [] (nothing changed)."""
    index = st.cap.state.open[model]
    on_node = st.cap.state.running_on
    allowed = set(victim_queues(st, w, model, within))
    leaving: dict[str, list[Workload]] = {}
    for v in _leaving_for(st, w, model):
        if v.placement is not None:
            for name in v.placement.gpus:
                leaving.setdefault(name, []).append(v)
    options: list[tuple[float, int, int, Removed]] = []
    for state in index.nodes.values():
        missing = w.gpus_per_node - len(state.free)
        if missing <= 0 or state.gpus_total < w.gpus_per_node:
            continue
        chosen: Removed = []
        for v in leaving.get(state.name, ()):
            assert v.placement is not None
            chosen.append((v, "terminating"))
            missing -= len(v.placement.gpus[state.name])
        eligible: list[tuple[Cost, Workload, str]] = []
        for v in on_node[state.ix]:
            if v.queue not in allowed:
                continue
            reason = victim_reason(st, w, v, within)
            if reason is not None:
                eligible.append((victim_cost(st, v), v, reason))
        eligible.sort(key=_FIRST)
        lost = 0.0
        for cost, v, reason in eligible:
            if missing <= 0:
                break
            assert v.placement is not None
            chosen.append((v, reason))
            lost += cost[0]
            missing -= len(v.placement.gpus[state.name])
        if missing <= 0:
            options.append((lost, len(chosen), state.ix, chosen))
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    removed: Removed = []
    seen: set[str] = set()
    for _, _, _, chosen in options[: w.nodes + st.cfg.node_aware_spare_nodes]:
        for v, reason in chosen:
            if v.id in seen or not still_borrows(st, v, reason):
                continue
            seen.add(v.id)
            vacate(st, v)
            removed.append((v, reason))
        if fits(st, w, model):
            return removed
    for v, _ in reversed(removed):
        unvacate(st, v)
    return []


def _leaving_for(st: CycleState, w: Workload, model: str) -> list[Workload]:
    """Terminating workloads on `model` whose resources `w` may count on: not taken by
    another preemptor this cycle, and not preempted for another pending workload."""
    return [
        v
        for v in st.running.leaving.get(model, [])
        if v.id not in st.decided.victims and v.preempted_for in (None, w.id)
    ]


def _fewest(st: CycleState, w: Workload, model: str, removed: Removed) -> Removed:
    """Put back every victim that is not needed, most expensive first."""
    kept = list(removed)
    for item in reversed(removed[:-1]):
        v, _ = item
        unvacate(st, v)
        if fits(st, w, model):
            kept.remove(item)
        else:
            vacate(st, v)
    return kept


def vacate(st: CycleState, v: Workload) -> None:
    """What-if removal of running `v`: its GPUs free, its quota uncharged."""
    assert v.placement is not None
    st.quota.uncharge(v)
    st.cap.state.give_back(v.placement)


def unvacate(st: CycleState, v: Workload) -> None:
    """Undo :func:`vacate`."""
    assert v.placement is not None
    st.cap.state.retake(v.placement)
    st.quota.recharge(v)


def issue(st: CycleState, w: Workload, removed: Removed) -> dict[str, object]:
    """Record the preemptions of `removed` for `w` (terminating ones are only counted);
    returns the facts for its pending reason."""
    grace = st.cfg.preemption_grace_s
    issued = 0
    for v, reason in removed:
        if reason == "terminating":
            st.decided.take_victim(v.id, None)
            continue
        st.quota.mark_victim(v)
        st.decided.take_victim(
            v.id,
            Preemption(
                workload_id=v.id,
                preemptor_id=w.id,
                reason=reason,
                grace_s=grace,
                work_lost_gpu_s=victim_cost(st, v)[0],
                message=_message(v, w, reason, grace),
            ),
        )
        issued += 1
    return {
        "victims": [v.id for v, _ in removed],
        "issued": issued,
        "grace_s": grace,
    }


def claim(st: CycleState, w: Workload, gpus: Mapping[str, tuple[int, ...]]) -> None:
    """Keep for `w` the GPUs it will use that are free already.

    Those are GPUs next to the victims, or a victim's that finished early during its grace
    period. Without this they go to whoever comes next and the preemption repeats. Quota
    needs no such hold: the victims stay charged until they stop, and `w` comes first once
    they have (see ``SchedulerConfig.nominal_first``).
    """
    for name, indices in gpus.items():
        state = st.cap.state.by_name[name]
        index = st.cap.state.index_of(state)
        free_now = tuple(i for i in indices if i in state.free)
        if index is None or not free_now:
            continue
        whole = len(free_now) == len(indices)
        cpu, mem = (w.cpu_per_node, w.mem_per_node) if whole else (0.0, 0)
        index.take_exact(state, free_now, cpu, mem)
    st.decided.claim(w.id, tuple(gpus))


def _message(v: Workload, w: Workload, reason: str, grace: float) -> str:
    why = {
        "reclaim": f"queue {v.queue} borrowed GPUs that queue {w.queue} needs back",
        "priority": f"higher-priority workload {w.id} (priority {w.priority}) needs the room",
        "defragment": (
            f"gang {w.id} of queue {w.queue} needs whole nodes; it restarts at once from its "
            "checkpoint on GPUs free elsewhere"
        ),
        "borrowed-service": (
            f"it has run long on GPUs its queue {v.queue} borrowed; newcomer {w.id} of queue "
            f"{w.queue} gets a turn (it resumes from its checkpoint)"
        ),
        "attained-service": (
            f"it has run long; newcomer {w.id} of queue {w.queue} gets a turn "
            "(it resumes from its checkpoint)"
        ),
    }[reason]
    return f"preempted: {why}; checkpoint within {grace:.0f} s"
