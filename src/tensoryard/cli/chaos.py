"""`tyard chaos`: kill, stop (hang) or slow one rank of a job on this machine, on a schedule."""

from __future__ import annotations

from typing import Annotated

import typer

from tensoryard.cli._common import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    client_for,
    console,
    die,
    print_json,
    user_errors,
)
from tensoryard.executors.chaos import ACTIONS, Action, ChaosRecord, run_schedule
from tensoryard.spec._common import parse_duration_s

__all__ = ["register"]


def _seconds(value: str | None, option: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration_s(value)
    except ValueError as exc:
        die(f"{option}: {exc} (fix: a duration like 90s, 2m or 1.5)")


def chaos(
    job_id: Annotated[
        int | None,
        typer.Argument(
            help="The job; its run directory comes from the control plane.", show_default=False
        ),
    ] = None,
    run_dir: Annotated[
        str | None,
        typer.Option(help="Instead of a job id: the TYARD_RUN_DIR of a run (plain torchrun)."),
    ] = None,
    action: Annotated[
        str,
        typer.Option(
            help="kill (crash), stop (SIGSTOP: a hang), slow (a straggler) or cut (the rank's "
            "node off the network; network-namespace nodes only)."
        ),
    ] = "kill",
    rank: Annotated[int, typer.Option(help="Which rank (torchrun's RANK).")] = 1,
    every: Annotated[str, typer.Option(help="Time between injections, like 90s.")] = "90s",
    count: Annotated[int, typer.Option(min=1, help="How many injections.")] = 1,
    start_after: Annotated[str, typer.Option(help="Wait this long before the first.")] = "0s",
    duration: Annotated[
        str | None,
        typer.Option(
            help="stop: resume after this long (default: never, a hang); slow: how long; "
            "cut: reconnect after this long (default: never)."
        ),
    ] = None,
    speed: Annotated[
        float, typer.Option(help="slow: the share of time the rank still runs (0-1).")
    ] = 0.5,
    wait: Annotated[
        str, typer.Option(help="How long to wait for the rank to exist (e.g. while restarting).")
    ] = "60s",
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Inject faults into one rank of a job running on this machine (found by its environment:
    the job's TYARD_RUN_DIR and torchrun's RANK), for tests and demos. Kubernetes pods are not
    reachable from here."""
    if (job_id is None) == (run_dir is None):
        die("give either a job id or --run-dir (the TYARD_RUN_DIR of the run to disturb)")
    if job_id is not None:
        with user_errors(), client_for(server, token) as client:
            run_dir = str(client.job(job_id)["run_dir"])
    assert run_dir is not None
    if action not in ACTIONS:
        die(f"--action {action!r} is not one of {', '.join(ACTIONS)}")
    every_s = _seconds(every, "--every")
    start_s = _seconds(start_after, "--start-after")
    wait_s = _seconds(wait, "--wait")
    duration_s = _seconds(duration, "--duration")
    assert every_s is not None and start_s is not None and wait_s is not None
    if action == "slow" and (duration_s is None or not 0 < speed < 1):
        die("--action slow needs --duration (like 30s) and 0 < --speed < 1")

    def show(record: ChaosRecord) -> None:
        if not json_out:
            mark = "[green]ok[/]" if record.ok else "[yellow]skipped[/]"
            console.print(
                f"{mark} {record.action} rank {record.rank} (pid {record.pid}): {record.note}"
            )

    records = run_schedule(
        run_dir,
        rank,
        _action(action),
        every=every_s,
        count=count,
        start_after=start_s,
        duration=duration_s,
        speed=speed,
        wait_for_rank=wait_s,
        on_record=show,
    )
    if json_out:
        print_json([r.as_dict() for r in records])
    if not any(r.ok for r in records):
        raise typer.Exit(1)


def _action(value: str) -> Action:
    for known in ACTIONS:
        if value == known:
            return known
    die(f"--action {value!r} is not one of {', '.join(ACTIONS)}")


def register(app: typer.Typer) -> None:
    app.command()(chaos)
