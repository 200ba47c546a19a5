"""Scheduler quality on the Philly trace: every policy side by side in the same simulator.

Windows: three windows of 2,000 jobs of the Philly trace in submit order that are not the
window the default policy was tuned on (jobs 20,000-22,000): jobs 10,000-12,000, 40,000-42,000
and 60,000-62,000, each on 24 nodes x 8 GPUs (192 GPUs, 8 nodes per leaf switch), in two
configurations: multi-team (the trace's virtual clusters are teams with equal nominal quotas
in one cohort) and single-team (every job in one queue owning the cluster).
Jobs checkpoint every 10 minutes; a preempted job keeps its GPUs for a 30-second grace and
loses the work since its last checkpoint (the same for every policy, oracles included).

Policies: default (the production core; estimates from history only, never true durations),
fifo, kueue-like (Kueue's reclaimWithinCohort / withinClusterQueue: LowerPriority),
tiresias-las (preempts only for jobs it can place), sjf-oracle and srtf-oracle (true
durations; SRTF preemptive: the bound).

Goal (issue 13): the default policy's average JCT within 10% of the SRTF oracle's on every
window and configuration, and in the multi-team runs no team with demand below its
entitlement for more than 10 minutes. Every ratio is reported, met or not.

    python benchmarks/scheduler_quality.py [--workers N]   # JSON in benchmarks/results/
    python benchmarks/scheduler_quality.py --quick --json PATH
    python benchmarks/scheduler_quality.py --row-from-json   # the row and section, from the JSON

A full run writes its JSON to benchmarks/results/scheduler_quality.json (committed) and, from it,
this benchmark's row and its section of every ratio in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from tensoryard.scheduler.config import scheduler_config_from
from tensoryard.sim import POLICY_NAMES, SimConfig, SimRequest, find_shared_dir, run_request
from tensoryard.sim.policies.default import DefaultPolicy
from tensoryard.sim.trace import load_trace, select_window

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import provenance
from _results import write_results_line as write_results_row

NAME = "scheduler_quality"
TUNING_WINDOW = (20_000, 22_000)
FULL: dict[str, Any] = {
    "windows": [(10_000, 12_000), (40_000, 42_000), (60_000, 62_000)],
    "cluster": "24x8",
    "nodes_per_switch": 8,
}
QUICK: dict[str, Any] = {"windows": [(40_000, 40_300)], "cluster": "16x8", "nodes_per_switch": 8}
CONFIGS = ("multi-team", "single-team")
SRTF_LIMIT = 1.10
BEGIN, END = "<!-- scheduler_quality:begin -->", "<!-- scheduler_quality:end -->"
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
    """``KEY=VALUE`` pairs into SchedulerConfig overrides, read and checked as
    ``tyard server --scheduler KEY=VALUE`` reads them."""
    try:
        config = scheduler_config_from(overrides=items, option="--core")
    except TensoryardError as exc:
        raise SystemExit(str(exc)) from None
    return {key: getattr(config, key) for key in (i.partition("=")[0].strip() for i in items)}


Task = tuple[str, dict[str, Any], dict[str, Any], str, tuple[int, int], str]


def run_one(args: Task) -> dict[str, Any]:
    """Replay one window in one configuration under one policy (runs in a worker process)."""
    policy_name, setup, core, trace_path, window, config = args
    jobs = select_window(load_trace(trace_path), start=window[0], end=window[1])
    if config == "single-team":
        jobs = [dataclasses.replace(j, team="all") for j in jobs]
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
    if policy is not None:
        summary["estimator_accuracy"] = policy.accuracy()
    return {
        "policy": policy_name,
        "window": list(window),
        "config": config,
        "metrics": summary,
        "jobs": metrics["jobs"],
    }


def replay_all(tasks: list[Task], workers: int) -> Iterator[dict[str, Any]]:
    """Replay every task, in worker processes when more than one worker is asked for."""
    if workers <= 1:
        yield from map(run_one, tasks)
        return
    with ProcessPoolExecutor(workers) as pool:
        yield from pool.map(run_one, tasks)


def evaluate(
    policies: dict[str, dict[str, Any]], config: str
) -> tuple[dict[str, float], dict[str, bool]]:
    """Every ratio of the default policy to a baseline, and the goal checks, for one run."""
    ours = policies["default"]
    baselines = {n: m for n, m in policies.items() if n != "default"}
    best_alloc = max(m["allocation"] for m in baselines.values())
    ratios: dict[str, float] = {
        f"default_over_{name.replace('-', '_')}_avg_jct": ours["avg_jct_s"] / m["avg_jct_s"]
        for name, m in baselines.items()
    }
    ratios["default_allocation_minus_best_baseline"] = ours["allocation"] - best_alloc
    ratios["default_max_below_entitlement_s"] = ours["max_below_entitlement_s"]
    goals = {
        "avg_jct_within_10pct_of_srtf_oracle": ratios["default_over_srtf_oracle_avg_jct"]
        <= SRTF_LIMIT
    }
    if config == "multi-team":
        goals["no_team_below_entitlement_over_10_min"] = (
            ours["max_below_entitlement_s"] <= ENTITLEMENT_LIMIT_S
        )
    return ratios, goals


def write_results(path: Path, payload: dict[str, Any]) -> None:
    """Rewrite this benchmark's line in RESULTS.md and its section with every ratio, from the
    JSON of a run."""
    runs, command, today = payload["runs"], payload["command"], payload["date"][:10]
    ratios = [r["ratios"]["default_over_srtf_oracle_avg_jct"] for r in runs]
    multi = [r for r in runs if r["config"] == "multi-team"]
    worst_wait = max(r["ratios"]["default_max_below_entitlement_s"] for r in multi)
    met_srtf = sum(r["goals"]["avg_jct_within_10pct_of_srtf_oracle"] for r in runs)
    result = (
        f"default/srtf-oracle avg JCT {min(ratios):.2f}-{max(ratios):.2f} over "
        f"{len(runs)} runs (3 non-tuning Philly windows x single/multi-team, 24x8); max below "
        f"entitlement {worst_wait:.0f} s (multi-team); every ratio in the section below; "
        f"load average at the end {payload['load_average']}"
    )
    goal = "<=1.10x SRTF oracle avg JCT; <=600 s below entitlement (multi-team)"
    met = (
        "yes"
        if all(all(r["goals"].values()) for r in runs)
        else (
            f"no: within 10% of SRTF in {met_srtf} of {len(runs)} runs; "
            f"entitlement: {'met' if worst_wait <= ENTITLEMENT_LIMIT_S else 'not met'}"
        )
    )
    write_results_row(NAME, command, result, goal, met, date=today, path=path)
    text = path.read_text(encoding="utf-8")
    section = _section(runs, today, command)
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")


def _section(runs: list[dict[str, Any]], today: str, command: str) -> str:
    names = [n for n in runs[0]["policies"] if n != "default"]
    srtf_wait = max(
        (
            r["policies"]["srtf-oracle"]["max_below_entitlement_s"]
            for r in runs
            if r["config"] == "multi-team"
        ),
        default=0.0,
    )
    head = ["window", "teams", "default avg JCT s"]
    head += [f"default/{n}" for n in names]
    head += ["alloc default / best other", "max below ent. s", "preemptions", "est. within 2x"]
    rows = [
        BEGIN,
        f"### scheduler_quality: every ratio ({today}, `{command}`)",
        "",
        "Average JCT of the default policy over each baseline's (below 1: default is better).",
        "The goal is default/srtf-oracle <= 1.10 everywhere; it is met only where that column",
        "says so. Preemption costs are the same for every policy (30 s grace, work since the",
        "last 10-minute checkpoint lost). fifo, sjf-oracle, srtf-oracle and tiresias-las",
        "ignore teams, so their numbers are the same in both configurations; in the",
        "multi-team runs the SRTF bound itself leaves a team below its entitlement for up to",
        f'{srtf_wait:,.0f} s, which the default policy must not do. "est. within 2x": share of',
        "finished jobs whose run time the default policy's estimator (history only) had",
        'predicted within a factor of two. "max below ent." is the goal only for multi-team.',
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in runs:
        p = r["policies"]
        ours = p["default"]
        best = ours["allocation"] - r["ratios"]["default_allocation_minus_best_baseline"]
        acc = ours.get("estimator_accuracy", {})
        cells = [f"{r['window'][0]}-{r['window'][1]}", r["config"], f"{ours['avg_jct_s']:,.0f}"]
        for n in names:
            ratio = r["ratios"][f"default_over_{n.replace('-', '_')}_avg_jct"]
            cells.append(f"{ratio:.2f}")
        cells += [
            f"{ours['allocation']:.3f} / {best:.3f}",
            f"{ours['max_below_entitlement_s']:,.0f}",
            f"{ours['preemptions']}",
            f"{acc.get('within_2x', 0.0):.0%}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    rows.append(END)
    return "\n".join(rows)


def table(run: dict[str, Any]) -> Table:
    policies = run["policies"]
    out = Table(title=f"Philly {run['window'][0]}-{run['window'][1]}, {run['config']}")
    for column in (
        "policy",
        "avg JCT s",
        "p99 JCT s",
        "avg wait s",
        "alloc",
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
            f"{m['preemptions']}",
            f"{m['max_below_entitlement_s']:,.0f}",
            f"{m['wall_s']:.0f}",
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / f"{NAME}.json",
        help="the run's JSON (default benchmarks/results/scheduler_quality.json, committed)",
    )
    parser.add_argument(
        "--row-from-json",
        action="store_true",
        help="measure nothing: write the RESULTS.md row and section from the JSON of a run",
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run (300 jobs on 16x8)")
    parser.add_argument("--workers", type=int, default=1, help="replays run in parallel")
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
    if args.row_from_json:
        write_results(args.results_md, json.loads(args.json.read_text(encoding="utf-8")))
        return 0
    console = Console(stderr=True)
    shared = find_shared_dir()
    if shared is None:
        console.print("the shared traces folder (../shared) is absent; nothing to measure")
        return 2
    trace = str(shared / "traces/philly/philly.csv")
    setup = QUICK if args.quick else FULL
    core = parse_core(args.core)
    started = time.perf_counter()
    tasks: list[Task] = [
        (name, setup, core, trace, tuple(window), config)
        for window in setup["windows"]
        for config in CONFIGS
        for name in POLICY_NAMES
    ]
    results: dict[tuple[int, int, str], dict[str, dict[str, Any]]] = {}
    try:
        with Progress(console=console) as progress:
            bar = progress.add_task("replaying", total=len(tasks))
            for out in replay_all(tasks, args.workers):
                key = (out["window"][0], out["window"][1], out["config"])
                results.setdefault(key, {})[out["policy"]] = out["metrics"]
                progress.advance(bar)
    except TensoryardError as exc:
        console.print(f"error: {exc}")
        return 2
    runs: list[dict[str, Any]] = []
    for (a, b, config), found in results.items():
        policies = {name: found[name] for name in POLICY_NAMES}
        ratios, goals = evaluate(policies, config)
        runs.append(
            {
                "window": [a, b],
                "config": config,
                "policies": policies,
                "ratios": ratios,
                "goals": goals,
                "met": all(goals.values()),
            }
        )
    payload = {
        **provenance("scheduler_quality.py"),
        "benchmark": NAME,
        "trace": "philly",
        "tuning_window_excluded": list(TUNING_WINDOW),
        "cluster": setup["cluster"],
        "nodes_per_switch": setup["nodes_per_switch"],
        "configs": {
            "multi-team": "trace teams, equal nominal quotas, one cohort",
            "single-team": "every job in one queue",
        },
        "checkpoint_interval_s": 600.0,
        "grace_s": 30.0,
        "core_overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in core.items()},
        "quick": args.quick,
        "runs": runs,
        "met": all(r["met"] for r in runs),
        "wall_s": time.perf_counter() - started,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    for run in runs:
        Console(width=160).print(table(run))
        Console().print(json.dumps({"ratios": run["ratios"], "goals": run["goals"]}, indent=2))
    if not args.quick:
        write_results(args.results_md, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
