"""Scheduler quality on the Philly trace: every policy side by side in the same simulator.

Window: jobs 20,000-22,000 of the Philly trace in submit order (2,000 jobs submitted over
28 hours in October 2017, 9 virtual clusters = teams, 1 to 16 GPUs each), on 24 nodes x 8
GPUs (192 GPUs, 8 nodes per leaf switch). The window brings 2.3x the cluster's GPU-hours
while it arrives (1.3x counting only work that could run inside those 28 hours), so queues
form and then drain; the heavy-tailed run times (a few jobs run for days) are kept.
Every team gets an equal nominal quota in one cohort.
Jobs checkpoint every 10 minutes; a preempted job keeps its GPUs for a 30-second grace and
loses the work since its last checkpoint.

Goal (issue 3): the default policy, which never sees true durations, reaches an average JCT
<= 0.5x strict FIFO and <= Tiresias-LAS, allocation within 2% of the best baseline, and no
team held below its entitlement for more than 10 simulated minutes while it has demand.

    python benchmarks/scheduler_quality.py --json out.json [--quick] [--core KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tensoryard.errors import TensoryardError
from tensoryard.scheduler import SchedulerConfig
from tensoryard.sim import POLICY_NAMES, SimConfig, SimRequest, find_shared_dir, run_request
from tensoryard.sim.policies.default import DefaultPolicy
from tensoryard.sim.trace import load_trace, select_window

NAME = "scheduler_quality"
FULL: dict[str, Any] = {"window": (20_000, 22_000), "cluster": "24x8", "nodes_per_switch": 8}
QUICK: dict[str, Any] = {"window": (20_000, 20_300), "cluster": "16x8", "nodes_per_switch": 8}
SUMMARY_KEYS = (
    "avg_jct_s",
    "median_jct_s",
    "p99_jct_s",
    "avg_wait_s",
    "p99_wait_s",
    "makespan_s",
    "allocation",
    "utilization",
    "fragmentation",
    "preemptions",
    "lost_gpu_hours",
    "max_below_entitlement_s",
    "cycles",
    "wall_s",
)
ENTITLEMENT_LIMIT_S = 600.0


def parse_core(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs into SchedulerConfig overrides (values parsed as JSON)."""
    fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"--core {item!r}: use KEY=VALUE with KEY one of {sorted(fields)}")
        value = json.loads(raw)
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


def run_one(args: tuple[str, dict[str, Any], dict[str, Any], str]) -> dict[str, Any]:
    """Replay the window under one policy (runs in a worker process)."""
    policy_name, setup, core, trace_path = args
    start, end = setup["window"]
    jobs = select_window(load_trace(trace_path), start=start, end=end)
    request = SimRequest(
        trace=trace_path,
        cluster=setup["cluster"],
        policy=policy_name,
        nodes_per_switch=setup["nodes_per_switch"],
        config=SimConfig(checkpoint_interval_s=600.0, grace_s=30.0),
    )
    policy = None
    if policy_name == "default":
        policy = DefaultPolicy(SchedulerConfig(**{"preemption_grace_s": 30.0, **core}))
    result = run_request(request, policy=policy, jobs=jobs)
    metrics = result.metrics()
    summary = {k: metrics[k] for k in SUMMARY_KEYS}
    summary["teams_max_below_entitlement_s"] = {
        team: stats["max_below_entitlement_s"] for team, stats in metrics["teams"].items()
    }
    return {"policy": policy_name, "metrics": summary, "jobs": metrics["jobs"]}


def replay_all(
    tasks: list[tuple[str, dict[str, Any], dict[str, Any], str]], workers: int
) -> Iterator[dict[str, Any]]:
    """Replay every task, in worker processes when more than one worker is asked for."""
    if workers <= 1:
        yield from map(run_one, tasks)
        return
    with ProcessPoolExecutor(workers) as pool:
        yield from pool.map(run_one, tasks)


def evaluate(policies: dict[str, dict[str, Any]]) -> tuple[dict[str, float], dict[str, bool]]:
    """Ratios and goal checks for the default policy against the baselines."""
    ours = policies["default"]
    baselines = {n: m for n, m in policies.items() if n != "default"}
    best_alloc = max(m["allocation"] for m in baselines.values())
    ratios = {
        "default_over_fifo_avg_jct": ours["avg_jct_s"] / policies["fifo"]["avg_jct_s"],
        "default_over_tiresias_avg_jct": ours["avg_jct_s"] / policies["tiresias-las"]["avg_jct_s"],
        "default_over_sjf_oracle_avg_jct": ours["avg_jct_s"] / policies["sjf-oracle"]["avg_jct_s"],
        "default_over_kueue_like_avg_jct": ours["avg_jct_s"] / policies["kueue-like"]["avg_jct_s"],
        "default_allocation_minus_best_baseline": ours["allocation"] - best_alloc,
        "default_max_below_entitlement_s": ours["max_below_entitlement_s"],
    }
    goals = {
        "avg_jct_at_most_half_of_fifo": ratios["default_over_fifo_avg_jct"] <= 0.5,
        "avg_jct_at_most_tiresias": ratios["default_over_tiresias_avg_jct"] <= 1.0,
        "allocation_within_2pct_of_best": ours["allocation"] >= best_alloc - 0.02,
        "no_team_below_entitlement_over_10_min": ours["max_below_entitlement_s"]
        <= ENTITLEMENT_LIMIT_S,
    }
    return ratios, goals


def write_results_line(path: Path, command: str, result: str, goal: str, met: str) -> None:
    """Replace this benchmark's line in RESULTS.md (append it when absent)."""
    today = dt.date.today().isoformat()
    line = f"| {NAME} | {today} | `{command}` | {result} | {goal} | {met} |"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for i, existing in enumerate(lines):
        if existing.startswith(f"| {NAME} |"):
            lines[i] = line
            break
    else:
        lines.append(line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def table(policies: dict[str, dict[str, Any]]) -> Table:
    out = Table(title="scheduler quality (Philly window)")
    for column in (
        "policy",
        "avg JCT s",
        "p99 JCT s",
        "avg wait s",
        "alloc",
        "frag",
        "preempt",
        "max below ent. s",
        "wall s",
    ):
        out.add_column(column, justify="right")
    for name, m in policies.items():
        out.add_row(
            name,
            f"{m['avg_jct_s']:,.0f}",
            f"{m['p99_jct_s']:,.0f}",
            f"{m['avg_wait_s']:,.0f}",
            f"{m['allocation']:.3f}",
            f"{m['fragmentation']:.3f}",
            f"{m['preemptions']}",
            f"{m['max_below_entitlement_s']:,.0f}",
            f"{m['wall_s']:.0f}",
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, type=Path, help="write results here")
    parser.add_argument("--quick", action="store_true", help="small smoke run (300 jobs on 16x8)")
    parser.add_argument("--workers", type=int, default=2, help="policies replayed in parallel")
    parser.add_argument(
        "--core", action="append", default=[], help="SchedulerConfig override KEY=VALUE"
    )
    parser.add_argument(
        "--results-md",
        type=Path,
        default=Path(__file__).with_name("RESULTS.md"),
        help="RESULTS.md to update (full runs only)",
    )
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    shared = find_shared_dir()
    if shared is None:
        console.print("the shared traces folder (../shared) is absent; nothing to measure")
        return 2
    trace = str(shared / "traces/philly/philly.csv")
    setup = QUICK if args.quick else FULL
    core = parse_core(args.core)
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    tasks = [(name, setup, core, trace) for name in POLICY_NAMES]
    try:
        with Progress(console=console) as progress:
            bar = progress.add_task("replaying policies", total=len(tasks))
            for out in replay_all(tasks, args.workers):
                results[out["policy"]] = out["metrics"]
                progress.advance(bar)
    except TensoryardError as exc:
        console.print(f"error: {exc}")
        return 2
    policies = {name: results[name] for name in POLICY_NAMES}
    ratios, goals = evaluate(policies)
    payload = {
        "benchmark": NAME,
        "trace": "philly",
        "window_jobs": list(setup["window"]),
        "cluster": setup["cluster"],
        "nodes_per_switch": setup["nodes_per_switch"],
        "quotas": "equal nominal quotas, one cohort",
        "checkpoint_interval_s": 600.0,
        "grace_s": 30.0,
        "core_overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in core.items()},
        "quick": args.quick,
        "policies": policies,
        "ratios": ratios,
        "goals": goals,
        "met": all(goals.values()),
        "wall_s": time.perf_counter() - started,
    }
    args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    Console(width=160).print(table(policies))
    Console().print(json.dumps({"ratios": ratios, "goals": goals}, indent=2))
    if not args.quick:
        best = policies["default"]["allocation"] - ratios["default_allocation_minus_best_baseline"]
        result = (
            f"default/fifo avg JCT {ratios['default_over_fifo_avg_jct']:.2f}, "
            f"default/tiresias {ratios['default_over_tiresias_avg_jct']:.2f}, "
            f"alloc {policies['default']['allocation']:.3f} vs best baseline "
            f"{best:.3f}, "
            f"max below entitlement {ratios['default_max_below_entitlement_s']:.0f} s "
            f"(Philly jobs 20k-22k on 24x8)"
        )
        goal = "<=0.5x FIFO, <=1x Tiresias, alloc within 2%, <=600 s below entitlement"
        met = (
            "yes"
            if payload["met"]
            else "no (" + ", ".join(k for k, ok in goals.items() if not ok) + ")"
        )
        extra = "".join(f" --core {c}" for c in args.core)
        write_results_line(
            args.results_md,
            f"python benchmarks/scheduler_quality.py --json out.json{extra}",
            result,
            goal,
            met,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
