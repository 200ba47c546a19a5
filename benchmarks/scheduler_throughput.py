"""Scheduler throughput: gang admissions per second and cycle time at 1k..100k pending.

Setup (the issue's): 1,024 nodes x 8 GPUs under 32 leaf switches, 100 team queues in 10
cohorts, pending workloads with Philly's job-size mix (GPU counts read from
``../shared/traces/philly/philly.csv`` when present, else the built-in mix below, which is the
same trace's published counts). Gangs above 8 GPUs use whole 8-GPU nodes.

Method: for each pending level P, start from an empty cluster with P pending workloads, run a
first cycle (the initial fill, reported on its own as ``fill_*``), then ``WARMUP`` cycles
that top the cluster up (not measured), then `cycles` steady-state cycles; before each, 5% of
the running workloads finish (seeded choice), the clock advances 60 s and new submissions
keep P constant, so the cluster stays full and admissions balance completions
(``steady_gpu_utilization`` and ``steady_admitted_per_completed`` show it).
``admissions_per_s`` = gang admissions / CPU time inside ``Scheduler.schedule`` over the
steady-state cycles only, at 50k pending; cycle times are CPU time of the scheduling thread
(one core), because these 2-core machines are shared and wall time there measures the
neighbours. Wall times are reported beside them. Reading every pending reason and estimate
(built lazily) is measured separately as ``read_all_pending_reasons_ms``.

No other scheduler runs in this benchmark (none of them runs on this machine without a
cluster), so it reports no ratio to one: earlier versions divided by rates said to be published
for Kueue, kube-scheduler, Slurm and Volcano, with no source and measured on other setups, and
those ratios were dropped. The same-run comparisons with Kueue are in k8s_admission.py.

    python benchmarks/scheduler_throughput.py       # JSON in benchmarks/results/, row in RESULTS.md
    python benchmarks/scheduler_throughput.py --quick --no-results-line --json PATH
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.progress import Progress

from tensoryard.scheduler import (
    Node,
    Placement,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tensoryard.spec.queue import CohortSpec, QueueSpec, QuotaConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import benchmark_main, provenance

ROOT = Path(__file__).resolve().parents[1]
PHILLY = ROOT.parent / "shared" / "traces" / "philly" / "philly.csv"
NAME = "scheduler_throughput"

# Philly's GPU-count mix (../shared/traces/README.md): used when the trace is absent.
BUILTIN_MIX = {1: 76627, 2: 1818, 4: 1870, 8: 1643, 12: 7, 16: 199, 24: 7, 32: 67, 64: 6, 128: 3}

GOAL_ADMISSIONS_PER_S = 2000.0
GOAL_P99_MS = 200.0

NODES, GPUS, SWITCHES, QUEUES, COHORTS = 1024, 8, 32, 100, 10
WARMUP = 3  # cycles after the fill before steady state is measured


def size_mix() -> tuple[dict[int, int], str]:
    """GPU count -> number of jobs, and where the mix came from."""
    if not PHILLY.exists():
        return dict(BUILTIN_MIX), "built-in Philly mix (trace not found)"
    counts: dict[int, int] = {}
    with PHILLY.open(newline="") as handle:
        for row in csv.DictReader(handle):
            g = int(float(row["num_gpus"]))
            counts[g] = counts.get(g, 0) + 1
    return counts, str(PHILLY.relative_to(ROOT.parent))


def make_cluster() -> tuple[tuple[Node, ...], QuotaConfig]:
    per_switch = NODES // SWITCHES
    nodes = tuple(
        Node(f"n{i:04d}", "H100", GPUS, 96.0, switch=f"sw{i // per_switch:02d}")
        for i in range(NODES)
    )
    total = NODES * GPUS
    queues = [
        QueueSpec(
            name=f"team-{i:03d}",
            cohort=f"cohort-{i % COHORTS:02d}",
            nominal={"H100": total // QUEUES + (1 if i < total % QUEUES else 0)},
        )
        for i in range(QUEUES)
    ]
    cohorts = [CohortSpec(name=f"cohort-{c:02d}") for c in range(COHORTS)]
    return nodes, QuotaConfig.build(queues, cohorts)


class Workloads:
    """Seeded generator of pending workloads with the Philly size mix."""

    def __init__(self, mix: dict[int, int], seed: int) -> None:
        self.rng = random.Random(seed)
        self.sizes = list(mix)
        self.weights = [mix[s] for s in self.sizes]
        self.counter = 0

    def make(self, submit_time: float) -> Workload:
        gpus = self.rng.choices(self.sizes, self.weights)[0]
        nodes = max(1, -(-gpus // GPUS))
        per_node = gpus // nodes if gpus % nodes == 0 else GPUS
        self.counter += 1
        return Workload(
            id=f"w{self.counter:07d}",
            queue=f"team-{self.rng.randrange(QUEUES):03d}",
            nodes=nodes,
            gpus_per_node=min(per_node, GPUS),
            cpu_per_node=1.0,
            submit_time=submit_time,
            runtime_estimate_s=self.rng.choice([None, 1800.0, 7200.0]),
        )


def run_level(
    pending_target: int,
    cycles: int,
    seed: int,
    progress: Progress | None,
    mix: dict[int, int] | None = None,
) -> dict[str, Any]:
    nodes, quotas = make_cluster()
    gen = Workloads(mix or size_mix()[0], seed)
    rng = random.Random(seed + 1)
    scheduler = Scheduler(SchedulerConfig())
    now = 1_000_000.0
    # A backlog that built up over the last hour, listed in submission order (as a store
    # returns it); later submissions arrive during each 60 s step.
    pending = {
        w.id: w
        for w in (gen.make(now - 3600 + 3600 * i / pending_target) for i in range(pending_target))
    }
    running: dict[str, Workload] = {}
    history: Any = {}
    times: list[float] = []  # CPU seconds of this thread: one core, whatever else runs
    walls: list[float] = []
    admitted = first_admissions = completed = 0
    total_gpus = NODES * GPUS
    utilization: list[float] = []
    per_cycle: list[tuple[int, int]] = []  # (admitted, completed before it)
    total = cycles + 1 + WARMUP
    task = progress.add_task(f"{pending_target} pending", total=total) if progress else None
    for cycle in range(total):
        done: list[str] = []
        if cycle > 0:
            now += 60.0
            done = rng.sample(sorted(running), k=len(running) // 20)
            for wid in done:
                del running[wid]
            arrivals = pending_target - len(pending)
            for i in range(arrivals):
                w = gen.make(now - 60 + 60 * i / arrivals)
                pending[w.id] = w
        snap = Snapshot(
            nodes=nodes,
            quotas=quotas,
            pending=tuple(pending.values()),
            running=tuple(running.values()),
            usage_history=history,
        )
        t0, c0 = time.perf_counter(), time.thread_time()
        decisions = scheduler.schedule(snap, now)
        times.append(time.thread_time() - c0)
        walls.append(time.perf_counter() - t0)
        history = decisions.usage_history
        for adm in decisions.admissions:
            w = pending.pop(adm.workload_id)
            running[w.id] = _started(w, adm.placement, now)
        admitted += len(decisions.admissions)
        if cycle == 0:
            first_admissions = len(decisions.admissions)
        for pre in decisions.preemptions:  # victims stop at once in this benchmark
            running.pop(pre.workload_id, None)
        per_cycle.append((len(decisions.admissions), len(done)))
        if cycle > WARMUP:
            utilization.append(sum(w.total_gpus for w in running.values()) / total_gpus)
        if progress is not None and task is not None:
            progress.advance(task)
    c0 = time.thread_time()
    reasons = sum(1 for info in decisions.pending.values() if info.reason)
    read_ms = (time.thread_time() - c0) * 1000
    first = 1 + WARMUP
    steady = [t * 1000 for t in times[first:]]
    steady_wall = [t * 1000 for t in walls[first:]]
    steady_admitted = sum(a for a, _ in per_cycle[first:])
    completed = sum(c for _, c in per_cycle[first:])
    steady_s = sum(times[first:])
    return {
        "pending": pending_target,
        "cycles": len(times),
        "steady_cycles": len(steady),
        "admissions": admitted,
        "schedule_s": sum(times),
        "admissions_per_s": steady_admitted / steady_s,
        "steady_admissions": steady_admitted,
        "steady_schedule_s": steady_s,
        "steady_completions": completed,
        "steady_admitted_per_completed": steady_admitted / completed if completed else 0.0,
        "steady_gpu_utilization": statistics.mean(utilization) if utilization else 0.0,
        "fill_cycle_ms": times[0] * 1000,
        "fill_admissions": first_admissions,
        "fill_admissions_per_s": first_admissions / times[0],
        "first_cycle_ms": times[0] * 1000,
        "cycle_ms_p50": statistics.median(steady),
        "cycle_ms_p99": _p99(steady),
        "wall_cycle_ms_p50": statistics.median(steady_wall),
        "wall_cycle_ms_p99": _p99(steady_wall),
        "wall_admissions_per_s": steady_admitted / sum(walls[first:]),
        "read_all_pending_reasons_ms": read_ms,
        "pending_reasons_read": reasons,
    }


def _started(w: Workload, placement: Placement, now: float) -> Workload:
    return Workload(
        id=w.id,
        queue=w.queue,
        nodes=w.nodes,
        gpus_per_node=w.gpus_per_node,
        cpu_per_node=w.cpu_per_node,
        gpu_model=w.gpu_model,
        priority=w.priority,
        submit_time=w.submit_time,
        runtime_estimate_s=w.runtime_estimate_s,
        placement=placement,
        start_time=now,
        last_checkpoint_time=now,
    )


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


GOAL = f">= {GOAL_ADMISSIONS_PER_S:.0f}/s and p99 <= {GOAL_P99_MS:.0f} ms at 50k pending"


def summary(result: dict[str, Any]) -> tuple[str, str]:
    """The RESULTS.md row's result and met columns, from a run's JSON."""
    main = result["levels"][str(result["headline_pending"])]
    levels = ", ".join(
        f"{r['admissions_per_s']:.0f}/s p99 {r['cycle_ms_p99']:.0f} ms at {int(lv) // 1000}k"
        for lv, r in result["levels"].items()
        if int(lv) >= 10_000
    )
    text = (
        f"steady state (cluster {main['steady_gpu_utilization']:.0%} full, "
        f"{main['steady_admitted_per_completed']:.2f} admitted per completed): "
        f"{main['admissions_per_s']:.0f} gang admissions/s, cycle p50 "
        f"{main['cycle_ms_p50']:.0f} ms / p99 {main['cycle_ms_p99']:.0f} ms at "
        f"{main['pending']} pending (CPU time, one core) [{levels}]; initial fill separately: "
        f"{main['fill_admissions']} admissions in {main['fill_cycle_ms']:.0f} ms; no peer "
        f"runs here (no ratio); load average at the end {result['load_average']}"
    )
    return text, "yes" if result["goal"]["met"] else "no"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:  # a smoke run never writes the row
        args.no_results_line = True
    levels = [1000, 5000] if args.quick else [10_000, 50_000, 100_000]
    headline = 5000 if args.quick else 50_000
    cycles = args.cycles if args.cycles is not None else (3 if args.quick else 30)
    mix, mix_source = size_mix()
    out: dict[str, Any] = {
        "benchmark": NAME,
        "setup": {
            "nodes": NODES,
            "gpus_per_node": GPUS,
            "leaf_switches": SWITCHES,
            "queues": QUEUES,
            "cohorts": COHORTS,
            "size_mix_source": mix_source,
            "steady_cycles": cycles,
            "python": sys.version.split()[0],
        },
        "levels": {},
        "headline_pending": headline,
    }
    with Progress(transient=True) as progress:
        for level in levels:
            out["levels"][str(level)] = run_level(level, cycles, args.seed, progress, mix)
    main_level = out["levels"][str(headline)]
    for key in ("admissions_per_s", "cycle_ms_p50", "cycle_ms_p99"):
        out[key] = main_level[key]
    out["cost_per_cycle_ms"] = {
        lv: {"p50": r["cycle_ms_p50"], "p99": r["cycle_ms_p99"]} for lv, r in out["levels"].items()
    }
    out["goal"] = {
        "admissions_per_s": GOAL_ADMISSIONS_PER_S,
        "cycle_ms_p99": GOAL_P99_MS,
        "met": main_level["admissions_per_s"] >= GOAL_ADMISSIONS_PER_S
        and main_level["cycle_ms_p99"] <= GOAL_P99_MS,
    }
    _print_table(out)
    return {**provenance("scheduler_throughput.py"), **out}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="Small smoke run (seconds).")
    parser.add_argument("--cycles", type=int, default=None, help="Steady-state cycles per level.")
    parser.add_argument("--seed", type=int, default=7)


def _print_table(out: dict[str, Any]) -> None:
    head = ("pending", "steady/s", "p50 ms", "p99 ms", "util", "adm/done", "fill ms", "fill adm")
    print("{:>8} {:>9} {:>8} {:>8} {:>6} {:>9} {:>9} {:>9}".format(*head))
    for level, r in out["levels"].items():
        print(
            f"{level:>8} {r['admissions_per_s']:>9.0f} {r['cycle_ms_p50']:>8.1f} "
            f"{r['cycle_ms_p99']:>8.1f} {r['steady_gpu_utilization']:>6.2f} "
            f"{r['steady_admitted_per_completed']:>9.2f} {r['fill_cycle_ms']:>9.1f} "
            f"{r['fill_admissions']:>9}"
        )
    print(f"goal met: {out['goal']['met']}")


if __name__ == "__main__":
    benchmark_main(NAME, __doc__, GOAL, measure, summary, add_arguments)
