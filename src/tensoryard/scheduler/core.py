"""The scheduling cycle: snapshot in, decisions out (see the package docstring for the phases).

The cycle is an orchestrator over one :class:`~tensoryard.scheduler.cycle_state.CycleState`;
each concern is a module of functions over that state: ``admission`` (quota, borrowing),
``placement`` (models, nodes, topology, best fit), ``victims`` and ``preemption`` (victim
choice, reclaim, what-if removal), ``defrag`` (clearing whole nodes), ``reservation``
(head-of-line reservation, backfill) and ``ordering`` (which queue head goes next).
"""

from __future__ import annotations

import gc
import heapq

from tensoryard.scheduler import admission, ordering, placement, preemption, reservation
from tensoryard.scheduler.accounting import charge_of, decay_usage, resource_of
from tensoryard.scheduler.config import SchedulerConfig
from tensoryard.scheduler.cycle_state import CycleState, Fail, QueueLine, build_cycle_state
from tensoryard.scheduler.defrag import try_defrag
from tensoryard.scheduler.model import Decisions, Snapshot, Workload
from tensoryard.scheduler.pending import Outcome, PendingView
from tensoryard.scheduler.state import CPU_MODEL, INF

__all__ = ["Cycle", "Scheduler", "charge_of", "decay_usage", "resource_of"]


class Scheduler:
    """Runs one pure scheduling cycle per call.

    It holds nothing but its config, so one instance may serve any number of snapshots.
    Cycles are fastest when `snapshot.pending` is listed in submission order (as a store
    returns it): the per-queue sorts then run in linear time.
    """

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()

    def schedule(self, snapshot: Snapshot, now: float) -> Decisions:
        """Decide admissions, preemptions and pending reasons for `snapshot` at time `now`.

        Python's cyclic garbage collector is paused for the cycle (and restored after): a
        cycle creates no reference cycles, and a full collection over a 100k-workload backlog
        landing inside it would otherwise set the tail latency.
        """
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return Cycle(self.config, snapshot, now).run()
        finally:
            if paused:
                gc.enable()


class Cycle:
    """One scheduling cycle. Build, call :meth:`run` once."""

    def __init__(self, config: SchedulerConfig, snapshot: Snapshot, now: float) -> None:
        self.cfg = config
        self.snap = snapshot
        self.now = now

    def run(self) -> Decisions:
        # phases 1-3: capacity, quota usage and history, ordered queues
        st = build_cycle_state(self.cfg, self.snap, self.now)
        # phase 4: serve queue heads best-first, then offer held GPUs to short work
        _admit_loop(st)
        reservation.backfill_pass(st)
        # phase 5: decisions
        return _decisions(st)


def _admit_loop(st: CycleState) -> None:
    """Serve queue heads best-first until nothing more can start."""
    heap = [ordering.heap_key(st, line) for line in st.lines.values()]
    heapq.heapify(heap)
    while heap:
        if _nothing_can_start(st):
            break
        *_, name = heapq.heappop(heap)
        line = st.lines[name]
        w = line.items[line.cursor]
        position = line.cursor - line.admitted
        line.cursor += 1
        if _visit(st, w, line, position):
            line.admitted += 1
        if line.cursor < len(line.items) and not line.closed:
            heapq.heappush(heap, ordering.heap_key(st, line))


def _visit(st: CycleState, w: Workload, line: QueueLine, position: int) -> bool:
    """Admit, backfill, preempt for, or reserve for `w`; record why it still waits."""
    st.visit_order.append(w.id)
    models = placement.models_for(st, w)
    if not models:
        st.outcomes[w.id] = Outcome("unschedulable", placement.unfit_details(st, w), position)
        return False
    fails: list[Fail] = []
    for model in models:
        fail = _try_admit(st, w, model)
        if fail is None:
            return True
        fails.append(fail)
    fail = admission.most_telling(fails)
    if fail.code in ("quota", "capacity") and preemption.try_preempt(st, w, line, fails):
        st.outcomes[w.id] = Outcome("preempting", st.last_preempt_details, position)
        return False
    capacity = fail.code == "capacity" and fail.model is not None
    if capacity and try_defrag(st, w, fail.model or ""):
        st.outcomes[w.id] = Outcome("preempting", st.last_preempt_details, position)
        return False
    if capacity and reservation.try_reserve(st, w, fail.model or ""):
        details = _with_reclaim(st, w, st.last_reserve_details)
        st.outcomes[w.id] = Outcome("reserved", details, position)
        return False
    st.outcomes[w.id] = Outcome(fail.code, _with_reclaim(st, w, fail.details), position)
    _maybe_close(st, line, w)
    return False


def _with_reclaim(st: CycleState, w: Workload, details: dict[str, object]) -> dict[str, object]:
    """`details`, plus when borrowed GPUs `w` could reclaim become reclaimable (if any)."""
    at = st.reclaim_at.get(w.id)
    if at is None:
        return details
    return {**details, "reclaim_at": at, "reclaim_min_run_s": st.cfg.reclaim_min_run_s}


def _try_admit(st: CycleState, w: Workload, model: str) -> Fail | None:
    """Admit `w` on `model` within quota, on open nodes or (backfill) held ones."""
    quota_fail = admission.check_quota(st, w, resource_of(w, model or None))
    if quota_fail is not None:
        return quota_fail
    nodes = placement.place(st, st.state.open[model], w, model, cache=model)
    if nodes is None and reservation.may_backfill(st, w, model):
        nodes = placement.place(st, st.state.held[model], w, model, cache=f"held:{model}")
    if nodes is None:
        return Fail("capacity", placement.capacity_details(st, w, model), model)
    admission.commit(st, w, model, nodes)
    return None


# --- stopping early --------------------------------------------------------------------------


def _nothing_can_start(st: CycleState) -> bool:
    """True when no open GPU is free, no CPU job waits, and preemption is used up."""
    return _no_gpu_free(st) and not preemption.budget_left(st)


def _no_gpu_free(st: CycleState) -> bool:
    """True when no CPU-only work waits and no open GPU is free (held GPUs are offered to
    short work by the backfill pass)."""
    if st.has_cpu_pending:
        return False
    return not any(st.state.open[m].total_free > 0 for m in st.gpu_models)


def _maybe_close(st: CycleState, line: QueueLine, w: Workload) -> None:
    """Stop visiting a queue once nothing behind `w` could start or preempt this cycle.

    That is the case when every remaining workload needs at least as many GPUs as a request
    that already failed quota for every model (quota only shrinks within a cycle), or when no
    GPU is free at all; and no preemption could help.
    """
    # The smallest request that failed quota, per model the queue could use at all; the
    # queue is quota-blocked when every remaining request is at least that, on every model.
    threshold = max(
        (
            st.quota_fail.get((line.name, m), INF) if st.tree.max_ever(line.name, m) > 0 else 0.0
            for m in st.gpu_models
        ),
        default=INF,
    )
    quota_blocked = threshold < INF and _rest_needs_at_least(st, line, threshold)
    if not (quota_blocked or _no_gpu_free(st) or _no_cpu_room(st, line)):
        return
    if not _rest_needs_at_least(st, line, line.preempt_failed_need) and (
        preemption.may_preempt_any(st, w, placement.models_for(st, w))
    ):
        return
    line.closed = True
    line.close_code = "quota" if quota_blocked else "capacity"


def _no_cpu_room(st: CycleState, line: QueueLine) -> bool:
    """True when every workload after the cursor needs more CPU per node than any node has
    free, open or held (so neither admission nor backfill can place it this cycle).

    This is what closes a queue of CPU-only work behind a full cluster: without it a deep
    backlog of CPU jobs (the embedded default's) is visited job by job every cycle. The
    largest free CPU is cached until the cycle admits or reserves again (capacity only
    shrinks in between, so a stale value can only keep a queue open, never close it)."""
    if line.name not in st.cpu_queues or line.cursor >= len(line.items):
        return False
    suffix = line.cpu_need_suffix
    if suffix is None:
        suffix = [INF] * (len(line.items) + 1)
        for i in range(len(line.items) - 1, -1, -1):
            suffix[i] = min(suffix[i + 1], line.items[i].cpu_per_node)
        line.cpu_need_suffix = suffix
    key = (len(st.admissions), len(st.reservations), len(st.claims))
    if st.max_cpu_free_key != key:
        st.max_cpu_free_key = key
        st.max_cpu_free = max(
            (
                node.cpu_free
                for indexes in (st.state.open, st.state.held)
                for index in indexes.values()
                for node in index.nodes.values()
            ),
            default=0.0,
        )
    return suffix[line.cursor] > st.max_cpu_free + 1e-9


def _rest_needs_at_least(st: CycleState, line: QueueLine, threshold: float) -> bool:
    """True when every workload after the cursor needs >= `threshold` GPUs."""
    if threshold == INF:
        return False
    if line.name in st.cpu_queues:
        return False  # CPU-only work needs no GPU at all: never skip it
    if threshold <= 1:
        return True  # GPU workloads need at least one GPU each
    return all(x.total_gpus >= threshold for x in line.items[line.cursor :])


# --- phase 5 ---------------------------------------------------------------------------------


def _decisions(st: CycleState) -> Decisions:
    pending = PendingView(
        now=st.now,
        lines={q: (line.items, line.cursor, line.admitted) for q, line in st.lines.items()},
        outcomes=st.outcomes,
        visit_order=st.visit_order,
        tree=st.tree,
        state=st.state,
        running=st.snap.running,
        admissions=st.admissions,
        unvisited_reason=lambda w: _unvisited_reason(st, w),
        late_admitted=st.late_admitted,
    )
    return Decisions(
        admissions=tuple(st.admissions),
        preemptions=tuple(st.preemptions),
        pending=pending,
        usage_history=st.history,
        reservations={**st.reservations, **st.claims},
        wake_at=min(st.reclaim_at.values(), default=None),
    )


def _unvisited_reason(st: CycleState, w: Workload) -> tuple[str, dict[str, object]]:
    """Reason for a workload the cycle stopped before reaching."""
    model = w.gpu_model or (st.gpu_models[0] if st.gpu_models else CPU_MODEL)
    if w.gpus_per_node == 0:
        model = CPU_MODEL if CPU_MODEL in st.state.open else model
    if model not in st.state.open:
        return "unschedulable", placement.unfit_details(st, w)
    line = st.lines.get(w.queue)
    if line is not None and line.close_code == "quota" and w.gpus_per_node > 0:
        # The cycle is over, so a queue's quota facts are the same for all its waiters.
        key = (w.queue, resource_of(w, model))
        base = st.final_quota.get(key)
        if base is None:
            base = st.final_quota[key] = admission.quota_fail(st, w, key[1], 0.0).details
        return "quota", {**base, "need": charge_of(w)}
    return "capacity", placement.capacity_details(st, w, model)
