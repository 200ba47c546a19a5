"""`tyard sim`: replay a job trace against a cluster shape under a scheduling policy."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tensoryard.errors import TensoryardError

__all__ = ["register", "sim"]

_HELP = (
    "Replay a job trace against a simulated cluster and report JCT, waiting, allocation, "
    "fragmentation, fair share and preemption cost.\n\n"
    "The trace is a CSV file (generic columns submit_time_s,duration_s,num_gpus,team with "
    "optional job_id,priority,gpu_model; or a Philly or Tiresias trace), or the shortcut "
    "'philly' or 'tiresias' for the shared public traces.\n\n"
    "Policies: default (the production scheduler), fifo, sjf-oracle, tiresias-las, "
    "kueue-like.\n\n"
    "Example: tyard sim --trace philly --window 20000:24000 --cluster 32x8 --json out.json"
)


def _fail(console: Console, message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    return typer.Exit(code=2)


def sim(
    trace: str = typer.Option(..., "--trace", help="Trace CSV file, or 'philly' / 'tiresias'."),
    cluster: str = typer.Option("64x8", "--cluster", help="NODESxGPUS, like 64x8 or 64x8:H100."),
    policy: str = typer.Option("default", "--policy", help="Scheduling policy by name."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the metrics as JSON here."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a PNG plot here."),
    nodes_per_switch: int | None = typer.Option(
        None, "--nodes-per-switch", help="Nodes under one leaf switch (default 32)."
    ),
    quotas: Path | None = typer.Option(
        None, "--quotas", help="Queue file (QueueSpec list); default: equal quotas, one cohort."
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Replay only the first N jobs."),
    window: str | None = typer.Option(
        None, "--window", help="Replay jobs START:END (indices in submit order)."
    ),
    checkpoint_min: float = typer.Option(
        10.0, "--checkpoint-min", min=0, help="Jobs checkpoint every N minutes (0: never)."
    ),
    grace_s: float = typer.Option(
        30.0, "--grace-s", min=0, help="Seconds a preempted job keeps its GPUs."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar and no table."),
    scheduler_config: Path | None = typer.Option(
        None,
        "--scheduler-config",
        help="Policy default: scheduler settings YAML, the file `tyard server --scheduler-config` "
        "reads (try a setting here before the cluster runs it); --grace-s sets the grace.",
    ),
    scheduler_set: list[str] | None = typer.Option(
        None, "--scheduler", help="Policy default: KEY=VALUE scheduler setting (repeatable)."
    ),
) -> None:
    """Replay a trace under one policy (see the command help)."""
    from tensoryard.sim import (
        SimConfig,
        SimRequest,
        make_policy,
        parse_window,
        plot_result,
        run_request,
    )

    out = Console()
    err = Console(stderr=True)
    try:
        bounds: tuple[int, int | None] = (0, None)
        if window is not None and limit is not None:
            raise _fail(err, "give --limit or --window, not both")
        if window is not None:
            bounds = parse_window(window)
        elif limit is not None:
            bounds = (0, limit)
        request = SimRequest(
            trace=trace,
            cluster=cluster,
            policy=policy,
            nodes_per_switch=nodes_per_switch,
            quotas=str(quotas) if quotas else None,
            window=bounds,
            config=SimConfig(checkpoint_interval_s=checkpoint_min * 60, grace_s=grace_s),
        )
        if scheduler_config is not None or scheduler_set:
            chosen = _configured_default(policy, scheduler_config, scheduler_set or [], grace_s)
        else:
            chosen = make_policy(policy)
        result = _run(request, functools.partial(run_request, policy=chosen), quiet)
        metrics = result.metrics()
        accuracy = getattr(chosen, "accuracy", None)
        if callable(accuracy):
            # how well run times were predicted from history (the policy never sees them)
            metrics["estimator_accuracy"] = accuracy()
        if json_out is not None:
            _write_json(json_out, {"policy": result.policy, "metrics": metrics})
        if plot is not None:
            plot_result(result, plot)
    except TensoryardError as exc:
        raise _fail(err, str(exc)) from None
    if not quiet:
        out.print(_table(result.policy, metrics))


def _configured_default(
    policy: str, path: Path | None, overrides: list[str], grace_s: float
) -> Any:
    """The default policy with scheduler settings; the simulator's grace is --grace-s."""
    import dataclasses

    from tensoryard.errors import ConfigError
    from tensoryard.scheduler.config import load_scheduler_config
    from tensoryard.sim.policies.default import DefaultPolicy

    if policy != "default":
        raise ConfigError(
            f"--scheduler/--scheduler-config: policy {policy!r} has no scheduler settings "
            "(fix: --policy default, or drop them)"
        )
    config = load_scheduler_config(path, overrides)
    return DefaultPolicy(dataclasses.replace(config, preemption_grace_s=grace_s))


def _run(request: Any, run_request: Any, quiet: bool) -> Any:
    if quiet:
        return run_request(request)
    with Progress(
        TextColumn(f"[bold]{request.policy}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs done"),
        TimeElapsedColumn(),
        transient=True,
        console=Console(stderr=True),
    ) as progress:
        task = progress.add_task("replay", total=None)
        last = [-1]

        def update(done: int, total: int) -> None:
            if done != last[0]:
                last[0] = done
                progress.update(task, completed=done, total=total)

        return run_request(request, progress=update)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    from tensoryard.errors import ConfigError

    try:
        path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror} (check the path)") from exc


_ROWS = (
    ("jobs", "jobs", "{:.0f}"),
    ("avg JCT", "avg_jct_s", "{:,.0f} s"),
    ("median JCT", "median_jct_s", "{:,.0f} s"),
    ("p99 JCT", "p99_jct_s", "{:,.0f} s"),
    ("avg wait", "avg_wait_s", "{:,.0f} s"),
    ("median wait", "median_wait_s", "{:,.0f} s"),
    ("p99 wait", "p99_wait_s", "{:,.0f} s"),
    ("makespan", "makespan_s", "{:,.0f} s"),
    ("allocation", "allocation", "{:.1%}"),
    ("utilization", "utilization", "{:.1%}"),
    ("fragmentation", "fragmentation", "{:.1%}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("GPU-hours lost", "lost_gpu_hours", "{:,.1f}"),
    ("longest below entitlement", "max_below_entitlement_s", "{:,.0f} s"),
    ("scheduling cycles", "cycles", "{:.0f}"),
    ("wall time", "wall_s", "{:.1f} s"),
)


def _table(policy: str, metrics: dict[str, Any]) -> Table:
    table = Table(title=f"tyard sim: policy {policy}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, key, fmt in _ROWS:
        table.add_row(label, fmt.format(metrics[key]))
    accuracy = metrics.get("estimator_accuracy")
    if accuracy and accuracy.get("observed"):
        table.add_row(
            "run-time estimates within 2x",
            f"{accuracy['within_2x']:.0%} of {accuracy['coverage']:.0%} predicted",
        )
    return table


def register(app: typer.Typer) -> None:
    """Add `tyard sim` to the root command."""
    app.command("sim", help=_HELP)(sim)
