"""Record every decision of the scheduling core over whole replays, as one digest per scenario.

Used to prove that a refactoring of the core changes no decision: every admission (with its
placement and borrowing flag), every preemption (victim, preemptor, reason, work lost,
message), every reservation and, for every workload left pending, its reason, code, position
and estimated start, cycle after cycle, are serialised in order and hashed.

Scenarios:

- ``synthetic-*``: seeded multi-cycle worlds built here (two GPU models, CPU-only work,
  priorities, required topology, cordoned nodes, non-preemptible work, checkpoints, runtime
  estimates, nested cohorts); decisions are carried out between cycles.
- ``philly-*``: Philly trace windows replayed by the simulator's default policy (skipped when
  the shared traces folder is absent).

Run as a script to print the digests of the code in the working tree:

    PYTHONPATH=src python tests/unit/scheduler/decision_log.py [--write FILE]
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from tensoryard.scheduler import (
    Decisions,
    Node,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tensoryard.scheduler.config import RECLAIM_MEMORY_S
from tensoryard.spec.queue import CohortSpec, QueueSpec, QuotaConfig

BASELINE = Path(__file__).with_name("decisions_baseline.json")
PHILLY_WINDOWS = {
    "philly-40000-40500-12x8": ((40_000, 40_500), "12x8"),
    "philly-50000-50600-12x8": ((50_000, 50_600), "12x8"),
    "philly-70000-70300-8x8": ((70_000, 70_300), "8x8"),
}
SYNTHETIC_SEEDS = (1, 2, 3, 4, 5, 6)


class DecisionLog:
    """Accumulates a canonical text of decisions and hashes it."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.cycles = 0
        self.admissions = 0
        self.preemptions = 0
        self.pending_infos = 0

    def add(self, now: float, decisions: Decisions, pending_ids: list[str]) -> None:
        self.cycles += 1
        out: list[Any] = [repr(now)]
        for a in decisions.admissions:
            gpus = sorted((n, list(ix)) for n, ix in a.placement.gpus.items())
            out.append(["A", a.workload_id, a.placement.gpu_model, gpus, a.borrowing])
        for p in decisions.preemptions:
            out.append(
                ["P", p.workload_id, p.preemptor_id, p.reason, p.grace_s, repr(p.work_lost_gpu_s)]
            )
            out.append(["M", p.message])
        for wid, held in sorted(decisions.reservations.items()):
            out.append(["R", wid, list(held)])
        info = decisions.pending
        for wid in sorted(pending_ids):
            if wid not in info:
                continue
            i = info[wid]
            out.append(["W", wid, i.code, i.position, repr(i.eta_s), i.reason])
            self.pending_infos += 1
        self.admissions += len(decisions.admissions)
        self.preemptions += len(decisions.preemptions)
        self._hash.update(json.dumps(out, sort_keys=True).encode())
        self._hash.update(b"\n")

    def summary(self) -> dict[str, Any]:
        return {
            "digest": self._hash.hexdigest(),
            "cycles": self.cycles,
            "admissions": self.admissions,
            "preemptions": self.preemptions,
            "pending_infos": self.pending_infos,
        }


# --- synthetic multi-cycle worlds ----------------------------------------------------------


def _world(rng: random.Random) -> tuple[tuple[Node, ...], QuotaConfig, SchedulerConfig]:
    nodes: list[Node] = []
    for i in range(12):
        model = "H100" if i < 8 else "A100"
        nodes.append(
            Node(
                f"n{i:02d}",
                model,
                8,
                64.0,
                mem_total=1 << 40,
                switch=f"s{i // 4}",
                cordoned=i == 5,
                unavailable_gpus=(7,) if i == 9 else (),
            )
        )
    nodes += [Node(f"c{i}", None, 0, 32.0, switch="cpu") for i in range(2)]
    queues = [
        QueueSpec(name="a", cohort="left", nominal={"H100": 24, "A100": 8}, cpu=40.0),
        QueueSpec(name="b", cohort="left", nominal={"H100": 16}, borrowing_limit=16),
        QueueSpec(name="c", cohort="right", nominal={"H100": 24, "A100": 8}, weight=2.0),
        QueueSpec(name="d", cohort="right", nominal={"A100": 8}, lending_limit=4),
    ]
    cohorts = [
        CohortSpec(name="root"),
        CohortSpec(name="left", parent="root"),
        CohortSpec(name="right", parent="root"),
    ]
    config = SchedulerConfig(
        max_reservations=rng.choice([1, 2]),
        max_preemptors_per_cycle=rng.choice([2, 32]),
        service_preemption_min_run_s=rng.choice([0.0, 600.0]),
        preemption_grace_s=30.0,
    )
    return tuple(nodes), QuotaConfig.build(queues, cohorts), config


def _job(rng: random.Random, i: int, t: float) -> Workload:
    queue = rng.choice("abcd")
    if rng.random() < 0.08:
        return Workload(
            id=f"w{i:05d}",
            queue=queue,
            gpus_per_node=0,
            cpu_per_node=rng.choice([2.0, 8.0]),
            submit_time=t,
            runtime_estimate_s=rng.choice([None, 200.0]),
        )
    gpus = rng.choice([1, 1, 1, 2, 4, 8])
    nodes = rng.choice([1, 1, 2, 3]) if gpus == 8 else 1
    return Workload(
        id=f"w{i:05d}",
        queue=queue,
        nodes=nodes,
        gpus_per_node=gpus,
        cpu_per_node=rng.choice([1.0, 4.0]),
        mem_per_node=rng.choice([0, 1 << 30]),
        gpu_model=rng.choice([None, None, None, "H100", "A100"]),
        priority=rng.choice([0, 0, 0, 1, 5]),
        submit_time=t,
        preemptible=rng.random() > 0.1,
        topology=rng.choice(["none", "preferred", "required"]),
        runtime_estimate_s=rng.choice([None, 300.0, 1800.0, 7200.0]),
        attained_service_s=rng.choice([0.0, 0.0, 0.0, 500.0, 5000.0]),
    )


def run_synthetic(seed: int, cycles: int = 150) -> DecisionLog:
    """A seeded world: jobs arrive, run for a drawn time, get preempted, finish."""
    rng = random.Random(seed)
    nodes, quotas, config = _world(rng)
    scheduler = Scheduler(config)
    log = DecisionLog()
    pending: list[Workload] = []
    running: dict[str, Workload] = {}
    true_end: dict[str, float] = {}
    stop_at: dict[str, float] = {}
    reclaiming: dict[str, float] = {}  # preemptor -> when its preemptions were made
    history: dict[str, Any] = {}
    now = 0.0
    next_id = 0
    for _ in range(cycles):
        now += rng.choice([10.0, 60.0, 300.0])
        for wid in [w for w, end in true_end.items() if end <= now and w in running]:
            del running[wid]
        for wid in [w for w, at in stop_at.items() if at <= now]:
            del stop_at[wid]
            w = running.pop(wid, None)
            if w is not None:
                ran = now - (w.start_time or now)
                pending.append(
                    replace(
                        w,
                        placement=None,
                        start_time=None,
                        last_checkpoint_time=None,
                        terminating=False,
                        attained_service_s=w.attained_service_s + ran,
                    )
                )
        for _ in range(rng.choice([0, 2, 5, 12])):
            pending.append(_job(rng, next_id, now))
            next_id += 1
        running = {
            wid: (
                replace(w, last_checkpoint_time=now - 50.0)
                if rng.random() < 0.3 and not w.terminating
                else w
            )
            for wid, w in running.items()
        }
        # As the server seam and the simulator's adapter do: a workload preemptions were made
        # for keeps first pick of the room made for it (RECLAIM_MEMORY_S at most).
        reclaiming = {w: at for w, at in reclaiming.items() if now - at < RECLAIM_MEMORY_S}
        pending = [replace(w, reclaiming=w.id in reclaiming) for w in pending]
        snap = Snapshot(nodes, quotas, tuple(pending), tuple(running.values()), history)
        decisions = scheduler.schedule(snap, now)
        log.add(now, decisions, [w.id for w in pending])
        history = dict(decisions.usage_history)
        admitted = decisions.admitted
        for w in pending:
            if w.id in admitted:
                running[w.id] = replace(w, placement=admitted[w.id], start_time=now)
                true_end[w.id] = now + rng.choice([100.0, 900.0, 4000.0, 20_000.0])
        pending = [w for w in pending if w.id not in admitted]
        for wid in admitted:
            reclaiming.pop(wid, None)
        for p in decisions.preemptions:
            w = running[p.workload_id]
            running[p.workload_id] = replace(w, terminating=True, preempted_for=p.preemptor_id)
            stop_at[p.workload_id] = now + p.grace_s
            reclaiming.setdefault(p.preemptor_id, now)
    return log


# --- trace replays -------------------------------------------------------------------------


def run_philly(window: tuple[int, int], cluster: str, shared: Path) -> DecisionLog:
    from tensoryard.sim import SimConfig, SimRequest, run_request
    from tensoryard.sim.engine import SimContext
    from tensoryard.sim.policies.default import DefaultPolicy
    from tensoryard.sim.trace import load_trace, select_window

    log = DecisionLog()

    class Recording(DefaultPolicy):
        def cycle(self, ctx: SimContext) -> float | None:
            before = self.last_decisions
            ids = [self.workload_id(j) for j in ctx.pending()]
            wake = super().cycle(ctx)
            if self.last_decisions is not None and self.last_decisions is not before:
                log.add(ctx.now, self.last_decisions, ids)
            return wake

    trace = str(shared / "traces/philly/philly.csv")
    jobs = select_window(load_trace(trace), start=window[0], end=window[1])
    request = SimRequest(
        trace=trace,
        cluster=cluster,
        nodes_per_switch=4,
        config=SimConfig(checkpoint_interval_s=600.0, grace_s=30.0),
    )
    policy = Recording(SchedulerConfig(preemption_grace_s=30.0))
    run_request(request, policy=policy, jobs=jobs)
    return log


def scenarios(shared: Path | None) -> Iterator[tuple[str, Callable[[], DecisionLog]]]:
    for seed in SYNTHETIC_SEEDS:
        yield f"synthetic-{seed}", lambda seed=seed: run_synthetic(seed)  # type: ignore[misc]
    if shared is None:
        return
    for name, (window, cluster) in PHILLY_WINDOWS.items():
        yield name, lambda w=window, c=cluster: run_philly(w, c, shared)  # type: ignore[misc]


def main(argv: list[str]) -> int:
    from tensoryard.sim import find_shared_dir

    out: dict[str, Any] = {}
    for name, make in scenarios(find_shared_dir()):
        out[name] = make().summary()
        print(name, json.dumps(out[name]), flush=True)
    if len(argv) == 2 and argv[0] == "--write":
        Path(argv[1]).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
