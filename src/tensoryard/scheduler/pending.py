"""Pending reasons and start-time estimates, built only when someone reads them.

A cycle over 100k pending workloads records a compact outcome per workload it looked at and
stops early when nothing more can start; :class:`PendingView` turns those into sentences and
estimates on access, so the cycle does not pay for text nobody reads.

Start-time estimates use only known expected ends (``start_time + runtime_estimate_s``) of
running and just-admitted workloads. A workload waiting for capacity starts, at the earliest,
when the GPUs released by then cover its own need plus the need of everything ahead of it in
this cycle's order (a fluid estimate: it ignores fragmentation). When the GPUs it needs are
held by workloads without an estimate, the answer is None ("unknown"), never a guess.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from tensoryard.scheduler.model import Admission, PendingInfo, Workload
from tensoryard.scheduler.quota import QuotaTree
from tensoryard.scheduler.state import CPU_MODEL, INF, ClusterState
from tensoryard.spec.queue import CPU_RESOURCE

__all__ = ["Outcome", "PendingView"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the cycle found for one pending workload (code + structured facts)."""

    code: str
    details: Mapping[str, object]
    position: int


Lines = Mapping[str, tuple[list[Workload], int, int]]


class PendingView(Mapping[str, PendingInfo]):
    """workload id -> PendingInfo for every workload left pending by a cycle (read-only)."""

    def __init__(
        self,
        *,
        now: float,
        lines: Lines,
        outcomes: Mapping[str, Outcome],
        visit_order: Sequence[str],
        tree: QuotaTree,
        state: ClusterState,
        running: Sequence[Workload],
        admissions: Sequence[Admission],
        unvisited_reason: Callable[[Workload], tuple[str, dict[str, object]]],
        late_admitted: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        self._late = late_admitted
        self._now = now
        self._lines = lines
        self._outcomes = outcomes
        self._visit_order = visit_order
        self._tree = tree
        self._state = state
        self._running = running
        self._admitted = {a.workload_id for a in admissions}
        self._late_count = len(late_admitted)
        self._unvisited_reason = unvisited_reason
        self._where: dict[str, tuple[str, int]] | None = None
        self._etas: dict[str, float | None] | None = None
        self._eta_walk: Iterator[tuple[str, float | None]] = iter(())
        self._workloads: dict[str, Workload] | None = None
        self._by_queue_releases: dict[str, tuple[list[float], list[float]]] | None = None
        self._memo: dict[str, Outcome] = {}
        self._available: dict[str, float] = {}

    @property
    def visited(self) -> tuple[str, ...]:
        """The workloads this cycle visited and left waiting (their reasons are fresh facts;
        an unvisited workload's reason only restates its place behind them)."""
        return tuple(k for k in self._outcomes if k not in self._admitted)

    # --- Mapping ---------------------------------------------------------------------------

    def __len__(self) -> int:
        unvisited = sum(len(items) - cursor for items, cursor, _ in self._lines.values())
        return len(self._outcomes) + unvisited - self._late_count

    def __iter__(self) -> Iterator[str]:
        yield from self._outcomes
        for items, cursor, _ in self._lines.values():
            for w in items[cursor:]:
                if w.id not in self._late:
                    yield w.id

    def __contains__(self, key: object) -> bool:
        if key in self._outcomes:
            return True
        return isinstance(key, str) and key in self._locate()

    def __getitem__(self, key: str) -> PendingInfo:
        outcome = self._outcome(key)
        w = self._workload(key)
        return PendingInfo(
            reason=render_reason(outcome, w, self._now),
            code=outcome.code,
            position=outcome.position,
            eta_s=self._eta(key),
            details=outcome.details,
        )

    # --- lookups ---------------------------------------------------------------------------

    def _locate(self) -> dict[str, tuple[str, int]]:
        if self._where is None:
            self._where = {}
            for queue, (items, cursor, _) in self._lines.items():
                for i in range(cursor, len(items)):
                    if items[i].id not in self._late:
                        self._where[items[i].id] = (queue, i)
        return self._where

    def _workload(self, key: str) -> Workload | None:
        if self._workloads is None:
            self._workloads = {w.id: w for items, _, _ in self._lines.values() for w in items}
        return self._workloads.get(key)

    def _outcome(self, key: str) -> Outcome:
        found = self._outcomes.get(key)
        if found is not None:
            return found
        place = self._locate().get(key)
        if place is None:
            raise KeyError(key)
        memo = self._memo.get(key)
        if memo is None:
            queue, i = place
            items, _, admitted = self._lines[queue]
            code, details = self._unvisited_reason(items[i])
            memo = self._memo[key] = Outcome(code, details, i - admitted)
        return memo

    # --- estimates -------------------------------------------------------------------------

    def _eta(self, key: str) -> float | None:
        """Estimates are cumulative along the waiting order, so they are computed in that
        order only as far as the one asked for (the head's cost little in a deep backlog)."""
        if self._etas is None:
            self._etas = {}
            self._eta_walk = self._estimate_all()
        etas = self._etas
        while key not in etas:
            found = next(self._eta_walk, None)
            if found is None:
                break
            etas[found[0]] = found[1]
        return etas.get(key)

    def _ordered_waiting(self) -> list[Workload]:
        """Pending workloads in this cycle's order: visited first, then each queue's rest."""
        out = [w for k in self._visit_order if (w := self._workload(k)) and k not in self._admitted]
        for items, cursor, _ in self._lines.values():
            out.extend(w for w in items[cursor:] if w.id not in self._late)
        return out

    def _releases(self) -> dict[str, tuple[list[float], list[float]]]:
        """Per GPU model: sorted known end times and cumulative GPUs released by then."""
        events: dict[str, list[tuple[float, int]]] = {}
        for state in self._state.states:
            model = state.gpu_model or CPU_MODEL
            for end, gpus, _ in self._state.node_jobs[state.ix]:
                if end != INF:
                    events.setdefault(model, []).append((max(end, self._now), gpus))
        out: dict[str, tuple[list[float], list[float]]] = {}
        for model, items in events.items():
            items.sort()
            out[model] = ([t for t, _ in items], list(accumulate(float(g) for _, g in items)))
        return out

    def _free_now(self, model: str) -> float:
        open_ix, held_ix = self._state.open.get(model), self._state.held.get(model)
        return float(
            (open_ix.total_free if open_ix else 0) + (held_ix.total_free if held_ix else 0)
        )

    def _estimate_all(self) -> Iterator[tuple[str, float | None]]:
        """(workload id, estimated start) for every waiting workload, in the waiting order."""
        releases = self._releases()
        demand: dict[str, float] = {}
        queue_demand: dict[str, float] = {}
        for w in self._ordered_waiting():
            if w.gpus_per_node == 0 and w.id not in self._outcomes:
                # CPU work the cycle never reached waits for "capacity" (or can never run):
                # no estimate, and no need to build its reason to know that
                yield w.id, None
                continue
            outcome = self._outcome(w.id)
            if outcome.code == "reserved":
                at = outcome.details.get("eta")
                eta = float(at) if isinstance(at, int | float) else None
                model = str(outcome.details.get("model") or "")
                demand[model] = demand.get(model, 0.0) + w.total_gpus  # it goes first
            elif outcome.code == "preempting":
                grace = outcome.details.get("grace_s", 0.0)
                eta = self._now + (float(grace) if isinstance(grace, int | float) else 0.0)
            elif outcome.code == "capacity" and w.gpus_per_node > 0:
                model = str(outcome.details.get("model") or w.gpu_model or "")
                demand[model] = demand.get(model, 0.0) + w.total_gpus
                missing = demand[model] - self._free_now(model)
                eta = _time_released(releases.get(model), max(missing, 1.0), self._now)
            elif outcome.code == "quota":
                eta = self._quota_eta(w, outcome, queue_demand)
            else:
                eta = None
            yield w.id, eta

    def _quota_eta(
        self, w: Workload, outcome: Outcome, queue_demand: dict[str, float]
    ) -> float | None:
        resource = str(outcome.details.get("resource", CPU_RESOURCE))
        key = f"{w.queue}\0{resource}"
        need = outcome.details.get("need", 0.0)
        queue_demand[key] = queue_demand.get(key, 0.0) + (
            float(need) if isinstance(need, int | float) else 0.0
        )
        available = self._available.get(key)
        if available is None:  # the cycle is over: a queue's headroom no longer changes
            available = self._available[key] = max(0.0, self._tree.available(w.queue, resource))
        missing = queue_demand[key] - available
        return _time_released(self._queue_releases().get(key), max(missing, 1e-9), self._now)

    def _queue_releases(self) -> dict[str, tuple[list[float], list[float]]]:
        """Per queue and resource: known end times of its running workloads, cumulated."""
        if self._by_queue_releases is None:
            events: dict[str, list[tuple[float, float]]] = {}
            for r in self._running:
                end = r.expected_end()
                if r.placement is None or end is None:
                    continue
                resource = r.placement.gpu_model if r.gpus_per_node > 0 else CPU_RESOURCE
                amount = float(r.total_gpus if r.gpus_per_node > 0 else r.total_cpu)
                key = f"{r.queue}\0{resource}"
                events.setdefault(key, []).append((max(end, self._now), amount))
            self._by_queue_releases = {}
            for key, items in events.items():
                items.sort()
                self._by_queue_releases[key] = (
                    [t for t, _ in items],
                    list(accumulate(a for _, a in items)),
                )
        return self._by_queue_releases


def _time_released(
    table: tuple[list[float], list[float]] | None, amount: float, now: float
) -> float | None:
    """Earliest known time by which `amount` has been released; None when never (known)."""
    if table is None:
        return None
    times, cumulative = table
    i = bisect.bisect_left(cumulative, amount - 1e-9)
    if i >= len(times):
        return None
    return max(now, times[i])


# --- sentences -------------------------------------------------------------------------------


def _n(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _ahead(position: int, queue: str) -> str:
    """The place in line: exact up to 100, then at least N with N cut to two significant
    digits ("at least 12,000 jobs ahead"), so one admission at the head of a deep backlog
    changes a few hundred stored reasons, not every one of them."""
    if position == 0:
        return f"first in queue {queue}"
    if position < 100:
        return f"{position} job{'s' if position != 1 else ''} ahead in queue {queue}"
    step = 10 ** (len(str(position)) - 2)
    return f"at least {position // step * step:,} jobs ahead in queue {queue}"


def render_reason(outcome: Outcome, w: Workload | None, now: float) -> str:
    """One sentence a person can act on, from an outcome's structured details."""
    text = _render(outcome, w, now)
    at = outcome.details.get("reclaim_at")
    if isinstance(at, int | float) and outcome.code in ("quota", "capacity", "reserved"):
        text += (
            f"; GPUs other queues borrow become reclaimable in {max(0.0, at - now):.0f} s "
            f"(a borrower runs at least {_n(outcome.details.get('reclaim_min_run_s'))} s "
            "before reclaim stops it)"
        )
    return text


def _render(outcome: Outcome, w: Workload | None, now: float) -> str:
    d = outcome.details
    queue = w.queue if w is not None else str(d.get("queue", "?"))
    if outcome.code == "quota":
        res = str(d["resource"])
        unit = "CPU cores" if res == CPU_RESOURCE else res
        cohort = d.get("cohort")
        lends = f"cohort {cohort} lends {_n(d['cohort_lends'])}" if cohort else "no cohort"
        text = (
            f"needs {_n(d['need'])} {unit}; queue {d['queue']} uses {_n(d['used'])} of its "
            f"{_n(d['nominal'])}; {lends}"
        )
        if d.get("borrowing_limit") is not None:
            text += f" (borrowing limit {_n(d['borrowing_limit'])})"
        return f"{text}; {_ahead(outcome.position, queue)}"
    if outcome.code == "capacity":
        model = d.get("model")
        if w is not None and w.gpus_per_node == 0:
            shape = f"{w.nodes} node(s) x {_n(w.cpu_per_node)} CPU cores"
            return f"needs {shape}; no node has that much free; {_ahead(outcome.position, queue)}"
        shape = f"{d['nodes']} node(s) x {d['gpus_per_node']} {model}"
        where = " under as few switches as required" if d.get("topology") == "required" else ""
        return (
            f"needs {shape}; quota allows it but only {d['free_gpus']} {model} GPUs are free "
            f"and no placement{where} fits ({d['held_gpus']} more held for the head of line); "
            f"{_ahead(outcome.position, queue)}"
        )
    if outcome.code == "reserved":
        eta = d.get("eta")
        when = (
            f"expected in {(float(eta) - now) / 60:.0f} min"
            if isinstance(eta, int | float)
            else "start unknown: the running jobs there have no runtime estimate"
        )
        held = list(d.get("held_nodes") or [])  # type: ignore[call-overload]
        names = ", ".join(str(h) for h in held[:4]) + (" ..." if len(held) > 4 else "")
        return f"next in line: nodes {names} are held for it; {when}"
    if outcome.code == "preempting":
        return (
            f"room is being made: waiting for {len(d.get('victims') or [])} workload(s) "  # type: ignore[arg-type]
            f"to checkpoint and stop (grace {_n(d.get('grace_s'))} s)"
        )
    if outcome.code == "unschedulable":
        return _unschedulable(d, w)
    return outcome.code


_AS_IT_IS = "cannot fit the cluster as it is"


def _short_of_nodes(w: Workload, fitting: int, model: object) -> str:
    """A gang larger than every node there is (busy, cordoned or NotReady ones counted)."""
    if w.gpus_per_node == 0:
        shape, has = f"{w.nodes} nodes", f"the cluster has {fitting}"
    else:
        kind = f"{model} " if model else ""
        shape = f"{w.nodes} nodes of {w.gpus_per_node} {kind}GPUs"
        has = f"the cluster has {fitting} node(s) with {w.gpus_per_node} or more {kind}GPUs"
    fix = f"ask for at most {fitting} nodes" if fitting else "ask for fewer GPUs per node"
    return (
        f"{_AS_IT_IS}: needs {shape}; {has} (short by {w.nodes - fitting}); it starts when "
        f"nodes are added (fix: {fix})"
    )


def _unschedulable(d: Mapping[str, object], w: Workload | None) -> str:
    if d.get("missing_queue"):
        return (
            f"queue {d.get('queue')} does not exist (fix: submit to an existing queue or "
            "ask an admin to create it)"
        )
    if w is None:
        return "cannot run on this cluster"
    total = d.get("total_nodes", 0)
    if d.get("schedulable_nodes") == 0 and isinstance(total, int) and total > 0:
        return (
            f"all {total} node(s) are cordoned or draining (`tyard nodes list` says why); "
            "it starts when an admin uncordons one"
        )
    if w.gpu_model and not d.get("model_known"):
        return (
            f"{_AS_IT_IS}: no schedulable node has GPU model {w.gpu_model}; it starts when "
            "such nodes are added (fix: choose another model)"
        )
    largest = d.get("largest_node_gpus", 0)
    if isinstance(largest, int) and w.gpus_per_node > largest:
        return (
            f"{_AS_IT_IS}: needs {w.gpus_per_node} GPUs per node but the largest node has "
            f"{largest}; it starts when such nodes are added (fix: use more nodes with fewer "
            "GPUs each)"
        )
    fitting = d.get("fitting_nodes")
    if isinstance(fitting, int) and fitting < w.nodes:
        return _short_of_nodes(w, fitting, d.get("fitting_model"))
    cpu = d.get("largest_node_cpu")
    if isinstance(cpu, int | float) and w.cpu_per_node > cpu:
        return (
            f"needs {_n(w.cpu_per_node)} CPU per node but the largest node has {_n(cpu)}: it can "
            "never start as specified (fix: ask for fewer CPUs per node)"
        )
    mem = d.get("largest_node_mem")
    if isinstance(mem, int) and mem > 0 and w.mem_per_node > mem:
        return (
            f"needs {w.mem_per_node / 2**30:.1f} GiB per node but the largest node has "
            f"{mem / 2**30:.1f} GiB: it can never start as specified (fix: ask for less memory)"
        )
    quota_max = d.get("quota_max")
    if isinstance(quota_max, int | float) and w.total_gpus > quota_max:
        return (
            f"needs {w.total_gpus} {w.gpu_model} but queue {w.queue} can never hold more than "
            f"{_n(quota_max)} (nominal plus borrowing); fix: ask for fewer GPUs or more quota"
        )
    usable = d.get("schedulable_nodes")
    if isinstance(usable, int) and isinstance(total, int) and usable < w.nodes <= total:
        return (
            f"needs {w.nodes} node(s) but only {usable} of {total} are schedulable now (the "
            "others are cordoned, draining or NotReady: `tyard nodes list` says why); it starts "
            "when enough are back"
        )
    return (
        f"needs {w.nodes} node(s) x {w.gpus_per_node} GPUs and no GPU model with quota for "
        f"queue {w.queue} has that many schedulable nodes (fix: shrink the gang or add quota)"
    )
