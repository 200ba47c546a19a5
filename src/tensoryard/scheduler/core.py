"""The scheduling cycle: snapshot in, decisions out (see the package docstring for the phases)."""

from __future__ import annotations

import gc
import heapq
import math
import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter, itemgetter

from tensoryard.scheduler.capacity import CapacityIndex, NodeState
from tensoryard.scheduler.config import SchedulerConfig
from tensoryard.scheduler.model import (
    Admission,
    DecayedUsage,
    Decisions,
    Placement,
    Preemption,
    Snapshot,
    Workload,
)
from tensoryard.scheduler.pending import Outcome, PendingView
from tensoryard.scheduler.quota import QuotaTree
from tensoryard.scheduler.state import CPU_MODEL, INF, ClusterState
from tensoryard.spec.queue import CPU_RESOURCE

__all__ = ["Cycle", "Scheduler", "decay_usage"]

_CAP_CACHE_LIMIT = 32
# Node-by-node victim search (when the cheapest victims are scattered): at most this many per
# cycle, looking at the cheapest nodes for the gang plus this many spare ones.
_NODE_AWARE_TRIES = 1
_NODE_AWARE_SPARE = 4
# Preemption attempts per cycle that look at other queues' long runners ("borrowed-service").
_BORROWED_TRIES = 8
# Defragmentation searches (each looks at every node of a model) per cycle.
_DEFRAG_TRIES = 1
_ID = attrgetter("id")
_FIRST = itemgetter(0)
_Cost = tuple[float, int, float, str]
_BY_TIME = attrgetter("submit_time")
_PRIORITY = attrgetter("priority")
_GPUS_PER_NODE = attrgetter("gpus_per_node")
_ATTAINED = attrgetter("attained_service_s")


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


def resource_of(w: Workload, model: str | None) -> str:
    """The quota resource a workload is charged in: its GPU model, or "cpu"."""
    return model if (w.gpus_per_node > 0 and model) else CPU_RESOURCE


def charge_of(w: Workload) -> float:
    return float(w.total_gpus) if w.gpus_per_node > 0 else w.total_cpu


def decay_usage(
    history: Mapping[str, DecayedUsage],
    running: Iterable[Workload],
    now: float,
    half_life_s: float,
) -> dict[str, DecayedUsage]:
    """Decay every queue's GPU-seconds to `now` and add what running workloads used since.

    A workload that ran at rate u since t0 adds ``u * h/ln2 * (1 - 2**(-(now - t0)/h))``,
    the exact integral of its exponentially decayed usage.
    """
    if half_life_s <= 0:
        return {}
    out: dict[str, dict[str, float]] = {}
    for queue, record in history.items():
        factor = 0.5 ** (max(0.0, now - record.as_of) / half_life_s)
        out[queue] = {r: v * factor for r, v in record.gpu_seconds.items()}
    # Sum rates per (queue, resource, since) first: most running work shares one `since`
    # (the previous cycle), so the exponential is computed once per queue, not per workload.
    rates: dict[tuple[str, str, float], float] = {}
    for w in running:
        placement = w.placement
        if placement is None or w.start_time is None:
            continue
        since = w.start_time
        prev = history.get(w.queue)
        if prev is not None and prev.as_of > since:
            since = prev.as_of
        if since >= now:
            continue
        # resource_of / charge_of, inlined: this loop runs over every running workload
        model = placement.gpu_model
        if w.gpus_per_node > 0:
            key = (w.queue, model or CPU_RESOURCE, since)
            charge = float(w.nodes * w.gpus_per_node)
        else:
            key = (w.queue, CPU_RESOURCE, since)
            charge = w.nodes * w.cpu_per_node
        rates[key] = rates.get(key, 0.0) + charge
    scale = half_life_s / math.log(2)
    for (queue, resource, since), rate in rates.items():
        amount = rate * scale * (1.0 - 0.5 ** ((now - since) / half_life_s))
        bucket = out.setdefault(queue, {})
        bucket[resource] = bucket.get(resource, 0.0) + amount
    return {q: DecayedUsage(gpu_seconds=v, as_of=now) for q, v in out.items()}


@dataclass(slots=True)
class _QueueLine:
    """One queue's sorted pending workloads and a cursor into them."""

    name: str
    items: list[Workload]
    cursor: int = 0
    admitted: int = 0
    closed: bool = False
    preempt_failed_need: float = INF
    close_code: str = "capacity"


@dataclass(slots=True)
class _Fail:
    code: str
    details: dict[str, object]
    model: str | None = None


class Cycle:
    """One scheduling cycle. Build, call :meth:`run` once."""

    def __init__(self, config: SchedulerConfig, snapshot: Snapshot, now: float) -> None:
        self.cfg = config
        self.snap = snapshot
        self.now = now
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.reservations: dict[str, tuple[str, ...]] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.visit_order: list[str] = []
        self.victims: set[str] = set()
        self.backfill_until: dict[str, float] = {}
        self.cap_fail: dict[str, list[tuple[int, int, float, int, bool]]] = {}
        self.quota_fail: dict[tuple[str, str], float] = {}
        self.preempt_attempts = 0
        self.preemptors = 0
        self.late_admitted: set[str] = set()
        self.claims: dict[str, tuple[str, ...]] = {}
        # Quota charged by this cycle's admissions, per (queue, resource): reclaim looks at
        # what a queue borrows with work that already runs, not with work admitted just now.
        self.admitted_charge: dict[tuple[str, str], float] = {}
        # Quota of victims already chosen this cycle (still charged until they stop), so that
        # two preemptors do not both count the same borrowed GPUs as reclaimable.
        self.victim_charge: dict[tuple[str, str], float] = {}
        self.node_tries = 0
        self.borrowed_tries = 0
        self.defrag_tries = 0
        self.defrag_failed: dict[str, float] = {}
        # Facts behind the last successful preemption / reservation, for its pending reason.
        self._last_preempt_details: dict[str, object] = {}
        self._last_reserve_details: dict[str, object] = {}
        self._final_quota: dict[tuple[str, str], dict[str, object]] = {}

    # --- the cycle -------------------------------------------------------------------------

    def run(self) -> Decisions:
        self._phase1_capacity()
        self._phase2_quota_and_share()
        self._phase3_order()
        self._phase4_admit()
        return self._phase5_decisions()

    def _phase1_capacity(self) -> None:
        """Free capacity per node = inventory minus running placements, indexed per model."""
        self.state = ClusterState(self.snap.nodes, self.snap.running, self.now)
        self.gpu_models = [m for m in self.state.open if m != CPU_MODEL]
        self.capacity: dict[str, float] = {CPU_RESOURCE: 0.0}
        for node in self.snap.nodes:
            if node.gpu_model:
                self.capacity[node.gpu_model] = (
                    self.capacity.get(node.gpu_model, 0.0) + node.gpus_total
                )
            self.capacity[CPU_RESOURCE] += node.cpu_total
        self.max_gpus_per_node = {m: ix.max_gpus for m, ix in self.state.open.items()}
        # Largest CPU and memory of one schedulable node per index key: a workload asking
        # more per node can never start there, however long it waits.
        self.max_cpu_per_node: dict[str, float] = {}
        self.max_mem_per_node: dict[str, int] = {}
        for node in self.snap.nodes:
            if node.schedulable:
                key = node.gpu_model or CPU_MODEL
                self.max_cpu_per_node[key] = max(
                    self.max_cpu_per_node.get(key, 0.0), node.cpu_total
                )
                self.max_mem_per_node[key] = max(self.max_mem_per_node.get(key, 0), node.mem_total)

    def _phase2_quota_and_share(self) -> None:
        """Charge running workloads to quotas; decay history; index preemption candidates."""
        self.tree = QuotaTree(self.snap.quotas)
        self.q_usage: dict[str, dict[str, float]] = {}
        self.by_queue: dict[tuple[str, str], list[Workload]] = {}
        self.pools: dict[tuple[str, str], list[tuple[_Cost, Workload]]] = {}
        self.leaving: dict[str, list[Workload]] = {}
        self.q_min_prio: dict[str, int] = {}
        self.q_max_level: dict[str, int] = {}
        totals: dict[tuple[str, str], float] = {}
        service = self.cfg.preempt_by_service and bool(self.cfg.service_levels_gpu_s)
        min_start = self.now - self.cfg.service_preemption_min_run_s
        # Local names: this loop runs over every running workload.
        total_of = totals.get
        by_queue = self.by_queue
        min_prio = self.q_min_prio
        most_served: dict[str, float] = {}
        now = self.now
        for w in self.snap.running:
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
                self.leaving.setdefault(model, []).append(w)
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
                    # self._level(w) is monotone in these GPU-seconds: keep each queue's
                    # largest and take its level once, after the loop.
                    served = (w.attained_service_s + max(0.0, now - start)) * max(
                        1, w.nodes * w.gpus_per_node
                    )
                    if served > most_served.get(queue, -INF):
                        most_served[queue] = served
        for queue, served in most_served.items():
            level = self.cfg.service_level(served)
            if level > 0:
                self.q_max_level[queue] = level
        self.max_level = max(self.q_max_level.values(), default=0)
        for (queue, resource), amount in totals.items():
            self._charge(queue, resource, amount, 0.0, False)
        self.history = decay_usage(
            self.snap.usage_history, self.snap.running, self.now, self.cfg.fair_share_half_life_s
        )

    def _phase3_order(self) -> None:
        """Group pending workloads per queue and sort each queue once."""
        groups: dict[str, list[Workload]] = {}
        known = self.tree.index
        for w in self.snap.pending:
            group = groups.get(w.queue)
            if group is None:
                if w.queue not in known:
                    self.outcomes[w.id] = Outcome(
                        "unschedulable", {"queue": w.queue, "missing_queue": True}, 0
                    )
                    continue
                group = groups[w.queue] = []
            group.append(w)
        pending = self.snap.pending
        # Cheap C-level scans first: most backlogs have neither CPU-only nor resumed work.
        self.cpu_queues: set[str] = set()
        if pending and min(map(_GPUS_PER_NODE, pending)) == 0:
            self.cpu_queues = {w.queue for w in pending if w.gpus_per_node == 0}
        self.has_cpu_pending = bool(self.cpu_queues)
        self.levels: dict[str, int] = {}
        leveled: set[str] = set()
        if self.cfg.service_levels_gpu_s and any(map(_ATTAINED, pending)):
            for w in pending:
                if w.attained_service_s > 0:  # fresh submissions are level 0: skip the work
                    level = self._level(w)
                    if level:
                        self.levels[w.id] = level
                        leveled.add(w.queue)
        # Two sequential passes over the whole backlog spare a hundred scattered per-queue
        # ones: a queue's items keep the backlog's order, so a backlog in strict submission
        # order (or of one priority) has every queue so too.
        times = list(map(_BY_TIME, pending))
        in_order = all(map(operator.lt, times, islice(times, 1, None)))
        one_priority = len(set(map(_PRIORITY, pending))) <= 1
        ordered = {
            q: self._sorted(groups[q], q in leveled, in_order, one_priority) for q in sorted(groups)
        }
        self.lines = {q: _QueueLine(q, items) for q, items in ordered.items()}

    def _phase4_admit(self) -> None:
        """Serve queue heads best-first until nothing more can start."""
        heap = [self._heap_key(line) for line in self.lines.values()]
        heapq.heapify(heap)
        while heap:
            if self._nothing_can_start():
                break
            *_, name = heapq.heappop(heap)
            line = self.lines[name]
            w = line.items[line.cursor]
            position = line.cursor - line.admitted
            line.cursor += 1
            if self._visit(w, line, position):
                line.admitted += 1
            if line.cursor < len(line.items) and not line.closed:
                heapq.heappush(heap, self._heap_key(line))
        self._phase4b_backfill()

    def _phase4b_backfill(self) -> None:
        """Offer reserved GPUs to unvisited work whose estimate ends before the reserved start.

        The main loop stops visiting a queue once nothing more could start in open capacity;
        this pass looks at the next `backfill_depth` waiting workloads (shared among queues,
        like Slurm's bf_max_job_test) with a runtime estimate short enough to backfill.
        """
        windows = {
            m: until
            for m, until in self.backfill_until.items()
            if until > self.now and self.state.held[m].total_free > 0
        }
        if not windows:
            return
        latest = max(windows.values()) - self.now
        tries = 0
        depth = max(1, self.cfg.backfill_depth // max(1, len(self.lines)))
        for line in self.lines.values():
            for w in islice(line.items, line.cursor, line.cursor + depth):
                estimate = w.runtime_estimate_s
                if estimate is None or estimate > latest or w.gpus_per_node == 0:
                    continue
                tries += 1
                if self._backfill_one(w, windows):
                    self.late_admitted.add(w.id)
                if not any(self.state.held[m].total_free > 0 for m in windows):
                    return

    def _backfill_one(self, w: Workload, windows: Mapping[str, float]) -> bool:
        assert w.runtime_estimate_s is not None
        for model in self._models_for(w):
            held = self.state.held.get(model)
            if model not in windows or held is None or held.total_free < w.gpus_per_node:
                continue
            if self.now + w.runtime_estimate_s > windows[model]:
                continue
            if self._check_quota(w, resource_of(w, model)) is not None:
                continue
            nodes = self._place(held, w, model, cache=f"held:{model}")
            if nodes is not None:
                self._commit(w, model, nodes)
                return True
        return False

    def _phase5_decisions(self) -> Decisions:
        pending = PendingView(
            now=self.now,
            lines={q: (line.items, line.cursor, line.admitted) for q, line in self.lines.items()},
            outcomes=self.outcomes,
            visit_order=self.visit_order,
            tree=self.tree,
            state=self.state,
            running=self.snap.running,
            admissions=self.admissions,
            unvisited_reason=self._unvisited_reason,
            late_admitted=self.late_admitted,
        )
        return Decisions(
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            pending=pending,
            usage_history=self.history,
            reservations={**self.reservations, **self.claims},
        )

    # --- ordering --------------------------------------------------------------------------

    def _level(self, w: Workload) -> int:
        if not self.cfg.service_levels_gpu_s:
            return 0
        return self.cfg.service_level(w.service_s(self.now) * max(1, w.total_gpus))

    def _sorted(
        self, items: list[Workload], leveled: bool, in_order: bool, one_priority: bool
    ) -> list[Workload]:
        """(-priority, level, submit time, id) by stable passes with C-level keys.

        `in_order` / `one_priority`: the items are known to be in strict submission order /
        of one priority already (skips checking them).
        """
        times = [] if in_order else list(map(_BY_TIME, items))
        if not (in_order or all(map(operator.lt, times, islice(times, 1, None)))):
            # Not already listed in strict submission order (the common case skips this).
            if self.cfg.ordering_tiebreak_by_id and len(set(times)) < len(items):
                items.sort(key=_ID)  # equal submit times: the id decides, whatever the order
            items.sort(key=_BY_TIME)
        if leveled:
            levels = self.levels
            items.sort(key=lambda w: levels.get(w.id, 0))
        if not one_priority and len(set(map(_PRIORITY, items))) > 1:
            items.sort(key=_PRIORITY, reverse=True)  # reverse=True keeps the sort stable
        return items

    def _pending_level(self, w: Workload) -> int:
        return self.levels.get(w.id, 0)

    def _heap_key(self, line: _QueueLine) -> tuple[int, bool, int, float, float, str, str]:
        w = line.items[line.cursor]
        level = self.levels.get(w.id, 0) if self.cfg.service_level_across_queues else 0
        borrows = self.cfg.nominal_first and not self._fits_nominal(w)
        share = self._share(line.name)
        return (-w.priority, borrows, level, share, w.submit_time, w.id, line.name)

    def _fits_nominal(self, w: Workload) -> bool:
        """True when `w` fits in its queue's own nominal quota (no borrowing needed)."""
        if w.gpus_per_node == 0:
            return self._within_nominal_after(w, None) or w.queue not in self.tree.cpu_limited
        models = [w.gpu_model] if w.gpu_model else self.gpu_models
        return any(self._within_nominal_after(w, m) for m in models)

    def _share(self, queue: str) -> float:
        """Weighted dominant share: max over resources of effective usage / capacity."""
        usage = self.q_usage.get(queue, {})
        past = self.history.get(queue)
        alpha = self.cfg.history_weight if past is not None else 0.0
        half_life = self.cfg.fair_share_half_life_s
        dominant = 0.0
        for resource in set(usage) | (set(past.gpu_seconds) if past else set()):
            cap = self.capacity.get(resource, 0.0)
            if cap <= 0:
                continue
            now_part = usage.get(resource, 0.0)
            hist_part = now_part
            if past is not None and half_life > 0:
                hist_part = past.gpu_seconds.get(resource, 0.0) * math.log(2) / half_life
            dominant = max(dominant, ((1 - alpha) * now_part + alpha * hist_part) / cap)
        return dominant / self.tree.weights.get(queue, 1.0)

    # --- accounting ------------------------------------------------------------------------

    def _charge(self, queue: str, resource: str, amount: float, cpu: float, gpu: bool) -> None:
        if not self.tree.has_queue(queue):
            return
        self.tree.add_usage(queue, resource, amount)
        usage = self.q_usage.setdefault(queue, {})
        usage[resource] = usage.get(resource, 0.0) + amount
        if gpu and cpu:
            self.tree.add_usage(queue, CPU_RESOURCE, cpu)
            usage[CPU_RESOURCE] = usage.get(CPU_RESOURCE, 0.0) + cpu

    def _uncharge(self, w: Workload) -> None:
        assert w.placement is not None
        resource = resource_of(w, w.placement.gpu_model)
        self._charge(w.queue, resource, -charge_of(w), -w.total_cpu, w.gpus_per_node > 0)

    def _recharge(self, w: Workload) -> None:
        assert w.placement is not None
        resource = resource_of(w, w.placement.gpu_model)
        self._charge(w.queue, resource, charge_of(w), w.total_cpu, w.gpus_per_node > 0)

    # --- one workload ----------------------------------------------------------------------

    def _visit(self, w: Workload, line: _QueueLine, position: int) -> bool:
        """Admit, backfill, preempt for, or reserve for `w`; record why it still waits."""
        self.visit_order.append(w.id)
        models = self._models_for(w)
        if not models:
            self.outcomes[w.id] = Outcome("unschedulable", self._unfit_details(w), position)
            return False
        fails: list[_Fail] = []
        for model in models:
            fail = self._try_admit(w, model)
            if fail is None:
                return True
            fails.append(fail)
        fail = self._most_telling(fails)
        if fail.code in ("quota", "capacity") and self._try_preempt(w, line, fails):
            self.outcomes[w.id] = Outcome("preempting", self._last_preempt_details, position)
            return False
        if fail.code == "capacity" and fail.model is not None and self._try_defrag(w, fail.model):
            self.outcomes[w.id] = Outcome("preempting", self._last_preempt_details, position)
            return False
        if fail.code == "capacity" and fail.model is not None and self._try_reserve(w, fail.model):
            self.outcomes[w.id] = Outcome("reserved", self._last_reserve_details, position)
            return False
        self.outcomes[w.id] = Outcome(fail.code, fail.details, position)
        self._maybe_close(line, w)
        return False

    def _models_for(self, w: Workload) -> list[str]:
        """Index keys (GPU models, or CPU_MODEL) the workload could ever be placed on."""
        if w.gpus_per_node == 0:
            keys = [CPU_MODEL] if CPU_MODEL in self.state.open else []
            if self.cfg.cpu_on_gpu_nodes:
                keys += self.gpu_models
            return [
                k
                for k in keys
                if self.state.schedulable_nodes.get(k, 0) >= w.nodes and self._node_fits(w, k)
            ]
        candidates = [w.gpu_model] if w.gpu_model else self.gpu_models
        return [
            m
            for m in candidates
            if m in self.state.open
            and self._node_fits(w, m)
            and self.max_gpus_per_node[m] >= w.gpus_per_node
            and self.state.schedulable_nodes.get(m, 0) >= w.nodes
            and self.tree.max_ever(w.queue, m) >= w.total_gpus
        ]

    def _node_fits(self, w: Workload, key: str) -> bool:
        """The largest node under `key` has the CPU and memory one worker of `w` needs."""
        mem = self.max_mem_per_node.get(key, 0)
        return self.max_cpu_per_node.get(key, 0.0) >= w.cpu_per_node - 1e-9 and (
            w.mem_per_node <= 0 or mem <= 0 or mem >= w.mem_per_node
        )

    def _unfit_details(self, w: Workload) -> dict[str, object]:
        largest = max((v for k, v in self.max_gpus_per_node.items() if k), default=0)
        model_known = w.gpu_model is None or w.gpu_model in self.state.open
        models = [w.gpu_model] if w.gpu_model else self.gpu_models
        quota_max = (
            max((self.tree.max_ever(w.queue, m) for m in models), default=0.0)
            if w.gpus_per_node > 0 and self.tree.has_queue(w.queue)
            else None
        )
        return {
            "nodes": w.nodes,
            "gpus_per_node": w.gpus_per_node,
            "gpu_model": w.gpu_model,
            "model_known": model_known,
            "largest_node_gpus": largest,
            "largest_node_cpu": max(self.max_cpu_per_node.values(), default=0.0),
            "largest_node_mem": max(self.max_mem_per_node.values(), default=0),
            "schedulable_nodes": sum(self.state.schedulable_nodes.values()),
            "queue": w.queue,
            "quota_max": quota_max,
        }

    def _try_admit(self, w: Workload, model: str) -> _Fail | None:
        resource = resource_of(w, model or None)
        quota_fail = self._check_quota(w, resource)
        if quota_fail is not None:
            return quota_fail
        nodes = self._place(self.state.open[model], w, model, cache=model)
        if nodes is None and self._may_backfill(w, model):
            nodes = self._place(self.state.held[model], w, model, cache=f"held:{model}")
        if nodes is None:
            return _Fail("capacity", self._capacity_details(w, model), model)
        self._commit(w, model, nodes)
        return None

    def _check_quota(self, w: Workload, resource: str) -> _Fail | None:
        need = charge_of(w)
        checks = [(resource, need)]
        if resource != CPU_RESOURCE and w.total_cpu > 0:
            checks.append((CPU_RESOURCE, w.total_cpu))
        for res, amount in checks:
            key = (w.queue, res)
            if amount >= self.quota_fail.get(key, INF):
                return self._quota_fail(w, res, amount)
            if amount > self.tree.available(w.queue, res) + 1e-9:
                self.quota_fail[key] = min(amount, self.quota_fail.get(key, INF))
                return self._quota_fail(w, res, amount)
        return None

    def _quota_fail(self, w: Workload, resource: str, need: float) -> _Fail:
        used = self.tree.usage(w.queue, resource)
        nominal = self.tree.nominal(w.queue, resource)
        available = max(0.0, self.tree.available(w.queue, resource))
        details: dict[str, object] = {
            "queue": w.queue,
            "resource": resource,
            "need": need,
            "used": used,
            "nominal": nominal,
            "cohort": self.tree.cohort_of(w.queue),
            "cohort_lends": max(0.0, available - max(0.0, nominal - used)),
            "borrowing_limit": self.tree.borrowing_limit(w.queue, resource),
        }
        return _Fail("quota", details, None if resource == CPU_RESOURCE else resource)

    def _capacity_details(self, w: Workload, model: str) -> dict[str, object]:
        return {
            "nodes": w.nodes,
            "gpus_per_node": w.gpus_per_node,
            "cpu_per_node": w.cpu_per_node,
            "model": model or None,
            "free_gpus": self.state.open[model].total_free,
            "held_gpus": self.state.held[model].total_free,
            "topology": w.topology,
        }

    def _max_switches(self, w: Workload, model: str) -> int | None:
        if w.topology != "required" or w.nodes <= 1:
            return None
        per_switch = max(1, self.state.max_nodes_per_switch.get(model, 1))
        return -(-w.nodes // per_switch)

    def _place(
        self, index: CapacityIndex, w: Workload, model: str, *, cache: str | None
    ) -> list[NodeState] | None:
        """Nodes for `w` in `index`, or None. `cache` names a shape-failure cache that stays
        valid while that index only loses capacity (None: what-if checks, no caching)."""
        strict = w.topology == "required" and w.nodes > 1
        shape = (w.nodes, w.gpus_per_node, w.cpu_per_node, w.mem_per_node, strict)
        failed = self.cap_fail.setdefault(cache, []) if cache is not None else []
        for n, g, c, m, s in failed:
            covered = n <= shape[0] and g <= shape[1] and c <= shape[2] and m <= shape[3]
            if covered and ((not s) or strict):
                return None
        if w.nodes == 1:
            node = index.best_node(w.gpus_per_node, w.cpu_per_node, w.mem_per_node)
            nodes = [node] if node is not None else None
        else:
            nodes = index.gang(
                w.nodes,
                w.gpus_per_node,
                w.cpu_per_node,
                w.mem_per_node,
                self._max_switches(w, model),
            )
        if nodes is None and cache is not None and len(failed) < _CAP_CACHE_LIMIT:
            failed.append(shape)
        return nodes

    def _commit(self, w: Workload, model: str, nodes: list[NodeState]) -> None:
        gpus: dict[str, tuple[int, ...]] = {}
        end = None if w.runtime_estimate_s is None else self.now + w.runtime_estimate_s
        for node in nodes:
            gpus[node.name] = self.state.take(node, w.gpus_per_node, w.cpu_per_node, w.mem_per_node)
            self.state.record_start(node, end, w.gpus_per_node, w.cpu_per_node)
        gpu_model = model if (model and w.gpus_per_node > 0) else None
        placement = Placement(gpu_model, gpus, w.cpu_per_node, w.mem_per_node)
        resource = resource_of(w, gpu_model)
        self._charge(w.queue, resource, charge_of(w), w.total_cpu, w.gpus_per_node > 0)
        borrowing = self.tree.borrowing(w.queue, resource)
        key = (w.queue, resource)
        self.admitted_charge[key] = self.admitted_charge.get(key, 0.0) + charge_of(w)
        self.admissions.append(Admission(w.id, placement, borrowing))

    def _most_telling(self, fails: list[_Fail]) -> _Fail:
        """Capacity (quota was fine) says more than quota; the first model breaks ties."""
        for fail in fails:
            if fail.code == "capacity":
                return fail
        return fails[0]

    # --- backfill and reservations -----------------------------------------------------------

    def _may_backfill(self, w: Workload, model: str) -> bool:
        if self.state.held[model].total_free <= 0 and w.gpus_per_node > 0:
            return False
        until = self.backfill_until.get(model)
        if until is None or w.runtime_estimate_s is None:
            return False
        return self.now + w.runtime_estimate_s <= until

    def _try_reserve(self, w: Workload, model: str) -> bool:
        """Hold the nodes that free up first for `w` (head of line); others may only backfill."""
        if len(self.reservations) >= self.cfg.max_reservations:
            return False
        open_index = self.state.open[model]
        g = w.gpus_per_node
        timed = [
            (self.state.free_at(s, g, w.cpu_per_node), -len(s.free), s.ix, s)
            for s in open_index.nodes.values()
        ]
        chosen = self._choose_reserved(timed, w)
        if not chosen:
            return False
        start = max(t for t, *_ in chosen)
        states = [s for *_, s in chosen]
        self.state.hold(model, states)
        known = start if start != INF else -INF
        self.backfill_until[model] = min(self.backfill_until.get(model, INF), known)
        self.reservations[w.id] = tuple(s.name for s in states)
        self._last_reserve_details = {
            "nodes": w.nodes,
            "gpus_per_node": w.gpus_per_node,
            "model": model or None,
            "held_nodes": [s.name for s in states],
            "eta": None if start == INF else start,
        }
        return True

    def _choose_reserved(
        self, timed: list[tuple[float, int, int, NodeState]], w: Workload
    ) -> list[tuple[float, int, int, NodeState]]:
        if w.topology == "required" and w.nodes > 1:
            by_switch: dict[int, list[tuple[float, int, int, NodeState]]] = {}
            for item in timed:
                by_switch.setdefault(item[3].switch, []).append(item)
            best: list[tuple[float, int, int, NodeState]] = []
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

    # --- preemption ------------------------------------------------------------------------

    def _victim_cost(self, v: Workload) -> _Cost:
        """Work lost (GPU-seconds since the last checkpoint), then priority, then youngest."""
        start = v.start_time if v.start_time is not None else self.now
        mark = max(start, v.last_checkpoint_time or start)
        lost = max(1, v.total_gpus) * max(0.0, self.now - mark)
        return (lost, v.priority, -start, v.id)

    def _service_preemptible(self, v: Workload) -> bool:
        if not self.cfg.preempt_by_service or v.start_time is None:
            return False
        return self.now - v.start_time >= self.cfg.service_preemption_min_run_s

    def _try_preempt(self, w: Workload, line: _QueueLine, fails: list[_Fail]) -> bool:
        if self.preemptors >= self.cfg.max_preemptors_per_cycle:
            return False
        if self.preempt_attempts >= 4 * max(1, self.cfg.max_preemptors_per_cycle):
            return False
        need = charge_of(w)
        if need >= line.preempt_failed_need:
            return False
        for fail in fails:
            model = fail.model if w.gpus_per_node > 0 else CPU_MODEL
            if model is None or not self._may_preempt(w, model):
                continue
            self.preempt_attempts += 1
            if self._preempt_on(w, model):
                self.preemptors += 1
                return True
        line.preempt_failed_need = min(line.preempt_failed_need, need)
        return False

    def _may_preempt(self, w: Workload, model: str) -> bool:
        """Cheap test: could any rule give `w` a victim on `model`?"""
        if self.leaving.get(model):
            return True
        if (
            self.cfg.preempt_lower_priority
            and self.q_min_prio.get(w.queue, w.priority) < w.priority
        ):
            return True
        if self.cfg.preempt_by_service and self.q_max_level.get(w.queue, 0) > self._pending_level(
            w
        ):
            return True
        if self._service_of_borrowers_left() and self.max_level > self._pending_level(w):
            return True
        return self.cfg.reclaim and self._within_nominal_after(w, model or None)

    def _within_nominal_after(self, w: Workload, model: str | None) -> bool:
        resource = resource_of(w, model)
        nominal = self.tree.nominal(w.queue, resource)
        return nominal > 0 and self.tree.usage(w.queue, resource) + charge_of(w) <= nominal + 1e-9

    def _victim_reason(self, w: Workload, v: Workload, within_nominal: bool) -> str | None:
        if v.id in self.victims or not v.preemptible or v.placement is None:
            return None
        if v.queue == w.queue:
            if self.cfg.preempt_lower_priority and v.priority < w.priority:
                return "priority"
            if (
                v.priority == w.priority
                and self._service_preemptible(v)
                and self._level(v) > self._pending_level(w)
            ):
                return "attained-service"
            return None
        resource = resource_of(v, v.placement.gpu_model)
        if (
            self.cfg.service_preemption_of_borrowers
            and v.priority == w.priority
            and self._service_preemptible(v)
            and self._level(v) > self._pending_level(w)
            and self.tree.has_queue(v.queue)
            and self.tree.same_tree(w.queue, v.queue)
            and self._borrows_running(v.queue, resource, keep=charge_of(v))
        ):
            return "borrowed-service"
        if (
            self.cfg.reclaim
            and within_nominal
            and self.tree.has_queue(v.queue)
            and self.tree.same_tree(w.queue, v.queue)
            and self._borrows_running(v.queue, resource)
        ):
            return "reclaim"
        return None

    def _borrows_running(self, queue: str, resource: str, keep: float = 0.0) -> bool:
        """True when the queue's running work (not this cycle's admissions) exceeds its
        nominal quota: only then may reclaim take that work back. With `keep` > 0: True when
        it still uses at least its nominal quota after giving `keep` back."""
        key = (queue, resource)
        used = self.tree.usage(queue, resource) - self.admitted_charge.get(key, 0.0)
        used -= self.victim_charge.get(key, 0.0)
        nominal = self.tree.nominal(queue, resource)
        if keep > 0:
            return used - keep >= nominal - 1e-9
        return used > nominal + 1e-9

    def _preempt_on(self, w: Workload, model: str) -> bool:
        """What-if: remove the cheapest eligible victims until `w` fits, then keep the fewest."""
        within = self._within_nominal_after(w, model or None)
        candidates: list[tuple[Workload, str]] = [
            (v, "terminating") for v in self.leaving.get(model, []) if v.id not in self.victims
        ]
        for v in self._victim_pool(w, model, within):
            reason = self._victim_reason(w, v, within)
            if reason is not None:
                candidates.append((v, reason))
                if len(candidates) >= self.cfg.max_victim_candidates:
                    break
        if not candidates:
            return False
        removed: list[tuple[Workload, str]] = []
        fits = False
        for v, reason in candidates:
            if reason in ("reclaim", "borrowed-service"):
                assert v.placement is not None
                resource = resource_of(v, v.placement.gpu_model)
                keep = charge_of(v) if reason == "borrowed-service" else 0.0
                if not self._borrows_running(v.queue, resource, keep=keep):
                    continue
            self._vacate(v)
            removed.append((v, reason))
            if self._fits(w, model):
                fits = True
                break
        if not fits and w.gpus_per_node > 1 and self.node_tries < _NODE_AWARE_TRIES:
            # The cheapest victims were scattered over nodes: clear whole nodes instead.
            self.node_tries += 1
            for v, _ in reversed(removed):
                self._unvacate(v)
            removed = self._victims_by_node(w, model, within)
            fits = bool(removed)
        claim: dict[str, tuple[int, ...]] = {}
        if fits:
            removed = self._fewest(w, model, removed)
            nodes = self._place(self.state.open[model], w, model, cache=None) or []
            # The GPUs `w` would take in the world after the preemption (take() picks the
            # lowest free indices).
            claim = {n.name: tuple(n.free[: w.gpus_per_node]) for n in nodes}
        for v, _ in removed:  # victims keep running through their grace period
            self._unvacate(v)
        if not fits:
            return False
        self._issue(w, removed)
        self._claim(w, claim)
        return True

    def _victims_by_node(self, w: Workload, model: str, within: bool) -> list[tuple[Workload, str]]:
        """Clear the nodes that are cheapest to clear (work lost) for one worker of `w` each,
        until `w` fits. Returns the victims, left vacated, or [] (nothing changed)."""
        index = self.state.open[model]
        on_node = self.state.running_on
        allowed = set(self._victim_queues(w, model, within))
        leaving: dict[str, list[Workload]] = {}
        for v in self.leaving.get(model, []):
            if v.id not in self.victims and v.placement is not None:
                for name in v.placement.gpus:
                    leaving.setdefault(name, []).append(v)
        options: list[tuple[float, int, int, list[tuple[Workload, str]]]] = []
        for state in index.nodes.values():
            missing = w.gpus_per_node - len(state.free)
            if missing <= 0 or state.gpus_total < w.gpus_per_node:
                continue
            chosen: list[tuple[Workload, str]] = []
            for v in leaving.get(state.name, ()):
                assert v.placement is not None
                chosen.append((v, "terminating"))
                missing -= len(v.placement.gpus[state.name])
            eligible: list[tuple[_Cost, Workload, str]] = []
            for v in on_node[state.ix]:
                if v.queue not in allowed:
                    continue
                reason = self._victim_reason(w, v, within)
                if reason is not None:
                    eligible.append((self._victim_cost(v), v, reason))
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
        removed: list[tuple[Workload, str]] = []
        seen: set[str] = set()
        for _, _, _, chosen in options[: w.nodes + _NODE_AWARE_SPARE]:
            for v, reason in chosen:
                if v.id in seen:
                    continue
                if reason in ("reclaim", "borrowed-service"):
                    assert v.placement is not None
                    resource = resource_of(v, v.placement.gpu_model)
                    keep = charge_of(v) if reason == "borrowed-service" else 0.0
                    if not self._borrows_running(v.queue, resource, keep=keep):
                        continue
                seen.add(v.id)
                self._vacate(v)
                removed.append((v, reason))
            if self._fits(w, model):
                return removed
        for v, _ in reversed(removed):
            self._unvacate(v)
        return []

    # --- defragmentation ---------------------------------------------------------------------

    def _try_defrag(self, w: Workload, model: str) -> bool:
        """Free whole nodes for a gang that fails on placement alone (fragmentation).

        Only when enough GPUs are free in total: single-node workloads that ran at least
        ``defrag_min_run_s`` and do not outrank `w` (priority, then service level) are moved,
        cheapest work lost first, and only as many as the GPUs left free after `w` starts can
        take back at once, so a victim is migrated, not displaced.
        """
        cfg = self.cfg
        if not cfg.defragment or w.gpus_per_node == 0 or not model:
            return False
        if self.preemptors >= cfg.max_preemptors_per_cycle or self.defrag_tries >= _DEFRAG_TRIES:
            return False
        index = self.state.open[model]
        spare = index.total_free - w.total_gpus
        if spare <= 0 or w.gpus_per_node <= 1:
            return False
        if w.gpus_per_node >= self.defrag_failed.get(model, INF):
            return False  # a worker as wide found no node to clear this cycle
        self.defrag_tries += 1
        options = self._defrag_options(w, index)
        if not options:
            self.defrag_failed[model] = min(w.gpus_per_node, self.defrag_failed.get(model, INF))
            return False
        removed: list[tuple[Workload, str]] = []
        moved = 0
        fits = False
        for _, gpus, _, victims in options:
            if moved + gpus > spare:
                continue
            for v in victims:
                self._vacate(v)
                removed.append((v, "defragment"))
            moved += gpus
            if self._fits(w, model):
                fits = True
                break
        claim: dict[str, tuple[int, ...]] = {}
        if fits:
            nodes = self._place(self.state.open[model], w, model, cache=None) or []
            claim = {n.name: tuple(n.free[: w.gpus_per_node]) for n in nodes}
            fits = bool(claim) and self._victims_replace(index, claim, [v for v, _ in removed])
        for v, _ in removed:
            self._unvacate(v)
        if not fits:
            return False
        self.preemptors += 1
        self._issue(w, removed)
        self._claim(w, claim)
        return True

    def _victims_replace(
        self, index: CapacityIndex, claim: Mapping[str, tuple[int, ...]], victims: list[Workload]
    ) -> bool:
        """What-if: with `claim` taken, every victim finds a node elsewhere (best fit)."""
        undo: list[tuple[NodeState, tuple[int, ...]]] = []
        ok = True
        for name, gpus in claim.items():
            state = self.state.by_name[name]
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

    def _defrag_options(
        self, w: Workload, index: CapacityIndex
    ) -> list[tuple[float, int, int, list[Workload]]]:
        """Per node short of room for one worker of `w`: (work lost, GPUs moved, node, victims)
        to clear it, cheapest first."""
        on_node = self.state.running_on
        level = self._pending_level(w)
        min_start = self.now - self.cfg.defrag_min_run_s
        options: list[tuple[float, int, int, list[Workload]]] = []
        for state in index.nodes.values():
            missing = w.gpus_per_node - len(state.free)
            # Only partly free nodes: clearing a full one moves more work (and is slower to
            # search in a big, busy cluster).
            if missing <= 0 or missing == w.gpus_per_node or state.gpus_total < w.gpus_per_node:
                continue
            eligible = sorted(
                (
                    (self._victim_cost(v), v)
                    for v in on_node[state.ix]
                    if v.nodes == 1
                    and v.gpus_per_node < w.gpus_per_node
                    and v.preemptible
                    and v.id not in self.victims
                    and v.priority <= w.priority
                    and v.start_time is not None
                    and v.start_time <= min_start
                    and self._level(v) >= level
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

    def _claim(self, w: Workload, gpus: Mapping[str, tuple[int, ...]]) -> None:
        """Keep for `w` the GPUs it will use that are free already.

        Those are GPUs next to the victims, or a victim's that finished early during its
        grace period. Without this they go to whoever comes next and the preemption repeats.
        Quota needs no such hold: the victims stay charged until they stop, and `w` comes
        first once they have (see ``SchedulerConfig.nominal_first``).
        """
        for name, indices in gpus.items():
            state = self.state.by_name[name]
            index = self.state.index_of(state)
            free_now = tuple(i for i in indices if i in state.free)
            if index is None or not free_now:
                continue
            whole = len(free_now) == len(indices)
            cpu, mem = (w.cpu_per_node, w.mem_per_node) if whole else (0.0, 0)
            index.take_exact(state, free_now, cpu, mem)
        self.claims[w.id] = tuple(gpus)

    def _victim_pool(self, w: Workload, model: str, within: bool) -> Iterator[Workload]:
        """Running workloads that may be victims of `w`, cheapest first."""
        sources = [self._pool(model, queue) for queue in self._victim_queues(w, model, within)]
        for _, v in heapq.merge(*sources, key=_FIRST):
            yield v

    def _victim_queues(self, w: Workload, model: str, within: bool) -> list[str]:
        """`w`'s queue, and the borrowing queues of its tree that a rule lets it take from."""
        queues = [w.queue]
        reclaim = self.cfg.reclaim and within
        service = self._service_of_borrowers_left()
        if not (reclaim or service):
            return queues
        level = self._pending_level(w)
        resource = resource_of(w, model or None)
        if service and not reclaim:
            self.borrowed_tries += 1
        for queue in self.tree.tree_queues(w.queue):
            if queue == w.queue or not (reclaim or self.q_max_level.get(queue, 0) > level):
                continue
            if self._borrows_running(queue, resource):
                queues.append(queue)
        return queues

    def _service_of_borrowers_left(self) -> bool:
        """Whether "borrowed-service" may still be tried this cycle (bounded: each try scans
        other queues' victims)."""
        return (
            self.cfg.service_preemption_of_borrowers
            and self.max_level > 0
            and self.borrowed_tries < _BORROWED_TRIES
        )

    def _pool(self, model: str, queue: str) -> list[tuple[_Cost, Workload]]:
        """A queue's running workloads on `model`, cheapest victim first (built on first use)."""
        key = (model, queue)
        pool = self.pools.get(key)
        if pool is None:
            pool = sorted(
                ((self._victim_cost(v), v) for v in self.by_queue.get(key, [])), key=_FIRST
            )
            self.pools[key] = pool
        return pool

    def _fewest(
        self, w: Workload, model: str, removed: list[tuple[Workload, str]]
    ) -> list[tuple[Workload, str]]:
        """Put back every victim that is not needed, most expensive first."""
        kept = list(removed)
        for item in reversed(removed[:-1]):
            v, _ = item
            self._unvacate(v)
            if self._fits(w, model):
                kept.remove(item)
            else:
                self._vacate(v)
        return kept

    def _vacate(self, v: Workload) -> None:
        assert v.placement is not None
        self._uncharge(v)
        self.state.give_back(v.placement)

    def _unvacate(self, v: Workload) -> None:
        assert v.placement is not None
        self.state.retake(v.placement)
        self._recharge(v)

    def _fits(self, w: Workload, model: str) -> bool:
        resource = resource_of(w, model or None)
        if charge_of(w) > self.tree.available(w.queue, resource) + 1e-9:
            return False
        if resource != CPU_RESOURCE and w.total_cpu > self.tree.available(w.queue, CPU_RESOURCE):
            return False
        return self._place(self.state.open[model], w, model, cache=None) is not None

    def _issue(self, w: Workload, removed: list[tuple[Workload, str]]) -> None:
        grace = self.cfg.preemption_grace_s
        issued = 0
        for v, reason in removed:
            self.victims.add(v.id)
            if reason == "terminating":
                continue
            assert v.placement is not None
            key = (v.queue, resource_of(v, v.placement.gpu_model))
            self.victim_charge[key] = self.victim_charge.get(key, 0.0) + charge_of(v)
            lost = self._victim_cost(v)[0]
            self.preemptions.append(
                Preemption(
                    workload_id=v.id,
                    preemptor_id=w.id,
                    reason=reason,
                    grace_s=grace,
                    work_lost_gpu_s=lost,
                    message=_preemption_message(v, w, reason, grace),
                )
            )
            issued += 1
        self._last_preempt_details = {
            "victims": [v.id for v, _ in removed],
            "issued": issued,
            "grace_s": grace,
        }

    # --- stopping early ----------------------------------------------------------------------

    def _nothing_can_start(self) -> bool:
        """True when no open GPU is free, no CPU job waits, and preemption is used up."""
        if not self._no_gpu_free():
            return False
        budget_left = self.preemptors < self.cfg.max_preemptors_per_cycle and (
            self.preempt_attempts < 4 * max(1, self.cfg.max_preemptors_per_cycle)
        )
        return not budget_left

    def _no_gpu_free(self) -> bool:
        """True when no CPU-only work waits and no open GPU is free (held GPUs are offered to
        short work by the backfill pass)."""
        if self.has_cpu_pending:
            return False
        return not any(self.state.open[m].total_free > 0 for m in self.gpu_models)

    def _maybe_close(self, line: _QueueLine, w: Workload) -> None:
        """Stop visiting a queue once nothing behind `w` could start or preempt this cycle.

        That is the case when every remaining workload needs at least as many GPUs as a
        request that already failed quota for every model (quota only shrinks within a
        cycle), or when no GPU is free at all; and no preemption could help.
        """
        # The smallest request that failed quota, per model the queue could use at all; the
        # queue is quota-blocked when every remaining request is at least that, on every model.
        threshold = max(
            (
                self.quota_fail.get((line.name, m), INF)
                if self.tree.max_ever(line.name, m) > 0
                else 0.0
                for m in self.gpu_models
            ),
            default=INF,
        )
        quota_blocked = threshold < INF and self._rest_needs_at_least(line, threshold)
        if not (quota_blocked or self._no_gpu_free()):
            return
        if not self._rest_needs_at_least(line, line.preempt_failed_need) and (
            self._may_preempt_any(w)
        ):
            return
        line.closed = True
        line.close_code = "quota" if quota_blocked else "capacity"

    def _rest_needs_at_least(self, line: _QueueLine, threshold: float) -> bool:
        """True when every workload after the cursor needs >= `threshold` GPUs."""
        if threshold == INF:
            return False
        if line.name in self.cpu_queues:
            return False  # CPU-only work needs no GPU at all: never skip it
        if threshold <= 1:
            return True  # GPU workloads need at least one GPU each
        return all(x.total_gpus >= threshold for x in line.items[line.cursor :])

    def _may_preempt_any(self, w: Workload) -> bool:
        if self.preemptors >= self.cfg.max_preemptors_per_cycle:
            return False
        if self.preempt_attempts >= 4 * max(1, self.cfg.max_preemptors_per_cycle):
            return False  # _try_preempt would refuse: do not keep the queue open for it
        return any(self._may_preempt(w, m) for m in self._models_for(w))

    def _unvisited_reason(self, w: Workload) -> tuple[str, dict[str, object]]:
        """Reason for a workload the cycle stopped before reaching."""
        model = w.gpu_model or (self.gpu_models[0] if self.gpu_models else CPU_MODEL)
        if w.gpus_per_node == 0:
            model = CPU_MODEL if CPU_MODEL in self.state.open else model
        if model not in self.state.open:
            return "unschedulable", self._unfit_details(w)
        line = self.lines.get(w.queue)
        if line is not None and line.close_code == "quota" and w.gpus_per_node > 0:
            # The cycle is over, so a queue's quota facts are the same for all its waiters.
            key = (w.queue, resource_of(w, model))
            base = self._final_quota.get(key)
            if base is None:
                base = self._final_quota[key] = self._quota_fail(w, key[1], 0.0).details
            return "quota", {**base, "need": charge_of(w)}
        return "capacity", self._capacity_details(w, model)


def _preemption_message(v: Workload, w: Workload, reason: str, grace: float) -> str:
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
