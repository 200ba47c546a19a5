"""The scheduling cycle: snapshot in, decisions out (see the package docstring for the phases).

The cycle is an orchestrator over one :class:`~tensoryard.scheduler.cycle_state.CycleState`.
Each visit of a queue head is an :class:`~tensoryard.scheduler.entry.Entry` that the concern
modules fill in (its assignment, victims, held nodes, or why it waits) and the cycle then
applies. Each concern is a module of functions over that state: ``admission`` (quota, borrowing),
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
from tensoryard.scheduler.entry import Entry
from tensoryard.scheduler.model import Decisions, Snapshot, Workload
from tensoryard.scheduler.pending import PendingView
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
    heap = [ordering.heap_key(st, line) for line in st.queues.lines.values()]
    heapq.heapify(heap)
    while heap:
        if _nothing_can_start(st):
            break
        *_, name = heapq.heappop(heap)
        line = st.queues.lines[name]
        w, position = line.take_head()
        if line.after_visit(_visit(st, w, line, position)):
            heapq.heappush(heap, ordering.heap_key(st, line))


def _visit(st: CycleState, w: Workload, line: QueueLine, position: int) -> bool:
    """One visit of a queue head: its entry is filled in, then applied. True if admitted."""
    entry = Entry(w, position)
    st.decided.visit(entry)
    _decide(st, entry, line)
    return _apply(st, entry)


def _decide(st: CycleState, entry: Entry, line: QueueLine) -> None:
    """Fill in the entry: the first model it fits on; else victims to preempt, nodes to
    defragment or to hold for it; else why it still waits."""
    w = entry.workload
    entry.consider(placement.models_for(st, w))
    if not entry.models:
        entry.conclude("unschedulable", placement.unfit_details(st, w))
        return
    for model in entry.models:
        fail = _try_admit(st, entry, model)
        if fail is None:
            return
        entry.fail_on(fail)
    fail = admission.most_telling(entry.fails)
    if fail.code in ("quota", "capacity") and preemption.try_preempt(st, entry, line):
        return
    capacity = fail.code == "capacity" and fail.model is not None
    if capacity and try_defrag(st, entry, fail.model or ""):
        return
    if capacity and reservation.try_reserve(st, entry, fail.model or ""):
        return
    entry.conclude(fail.code, st.decided.with_reclaim(w, fail.details, st.cfg.reclaim_min_run_s))
    _maybe_close(st, line, w)


def _apply(st: CycleState, entry: Entry) -> bool:
    """Carry out what the entry found: commit an admission (True), issue a preemption, hold
    a reservation; an entry that only waits has its outcome already."""
    if entry.nodes is not None:
        assert entry.model is not None
        admission.commit(st, entry.workload, entry.model, entry.nodes)
        return True
    if entry.victims is not None:
        preemption.apply(st, entry)
    elif entry.held is not None:
        reservation.apply(st, entry)
    return False


def _try_admit(st: CycleState, entry: Entry, model: str) -> Fail | None:
    """Find room for the entry's workload on `model` within quota, on open nodes or
    (backfill) held ones; the entry carries it."""
    w = entry.workload
    quota_fail = admission.check_quota(st, w, resource_of(w, model or None))
    if quota_fail is not None:
        return quota_fail
    nodes = placement.place(st, st.cap.state.open[model], w, model, cache=model)
    if nodes is None and reservation.may_backfill(st, w, model):
        nodes = placement.place(st, st.cap.state.held[model], w, model, cache=f"held:{model}")
    if nodes is None:
        return Fail("capacity", placement.capacity_details(st, w, model), model)
    entry.assign(model, nodes)
    return None


# --- stopping early --------------------------------------------------------------------------


def _nothing_can_start(st: CycleState) -> bool:
    """True when no open GPU is free, no CPU job waits, and preemption is used up."""
    return _no_gpu_free(st) and not preemption.budget_left(st)


def _no_gpu_free(st: CycleState) -> bool:
    """True when no CPU-only work waits and no open GPU is free (held GPUs are offered to
    short work by the backfill pass)."""
    if st.queues.has_cpu_pending:
        return False
    return not st.cap.any_gpu_free(st.decided.capacity_key())


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
            st.quota.failed_need((line.name, m))
            if st.quota.tree.max_ever(line.name, m) > 0
            else 0.0
            for m in st.cap.gpu_models
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
    line.close("quota" if quota_blocked else "capacity")


def _no_cpu_room(st: CycleState, line: QueueLine) -> bool:
    """True when every workload after the cursor needs more CPU per node than any node has
    free, open or held (so neither admission nor backfill can place it this cycle).

    This is what closes a queue of CPU-only work behind a full cluster: without it a deep
    backlog of CPU jobs (the embedded default's) is visited job by job every cycle. The
    largest free CPU is cached until the cycle admits or reserves again (capacity only
    shrinks in between, so a stale value can only keep a queue open, never close it)."""
    if line.name not in st.queues.cpu_queues or line.cursor >= len(line.items):
        return False
    return line.cpu_need_of_rest() > st.cap.max_cpu_free(st.decided.capacity_key()) + 1e-9


def _rest_needs_at_least(st: CycleState, line: QueueLine, threshold: float) -> bool:
    """True when every workload after the cursor needs >= `threshold` GPUs."""
    if threshold == INF:
        return False
    if line.name in st.queues.cpu_queues:
        return False  # CPU-only work needs no GPU at all: never skip it
    if threshold <= 1:
        return True  # GPU workloads need at least one GPU each
    return all(x.total_gpus >= threshold for x in line.items[line.cursor :])


# --- phase 5 ---------------------------------------------------------------------------------


def _decisions(st: CycleState) -> Decisions:
    pending = PendingView(
        now=st.now,
        lines={q: (line.items, line.cursor, line.admitted) for q, line in st.queues.lines.items()},
        outcomes=st.decided.outcomes(),
        visit_order=st.decided.visit_order(),
        tree=st.quota.tree,
        state=st.cap.state,
        running=st.snap.running,
        admissions=st.decided.admissions,
        unvisited_reason=lambda w: _unvisited_reason(st, w),
        late_admitted=st.decided.late_admitted,
    )
    return Decisions(
        admissions=tuple(st.decided.admissions),
        preemptions=tuple(st.decided.preemptions),
        pending=pending,
        usage_history=st.quota.history,
        reservations={**st.decided.reservations, **st.decided.claims},
        wake_at=min(st.decided.reclaim_at.values(), default=None),
    )


def _unvisited_reason(st: CycleState, w: Workload) -> tuple[str, dict[str, object]]:
    """Reason for a workload the cycle stopped before reaching."""
    model = w.gpu_model or (st.cap.gpu_models[0] if st.cap.gpu_models else CPU_MODEL)
    if w.gpus_per_node == 0:
        model = CPU_MODEL if CPU_MODEL in st.cap.state.open else model
    if model not in st.cap.state.open:
        return "unschedulable", placement.unfit_details(st, w)
    line = st.queues.lines.get(w.queue)
    if line is not None and line.close_code == "quota" and w.gpus_per_node > 0:
        # The cycle is over, so a queue's quota facts are the same for all its waiters.
        key = (w.queue, resource_of(w, model))
        base = st.quota.final_facts(key, lambda: admission.quota_fail(st, w, key[1], 0.0).details)
        return "quota", {**base, "need": charge_of(w)}
    return "capacity", placement.capacity_details(st, w, model)
