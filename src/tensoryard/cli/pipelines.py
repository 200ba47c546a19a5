"""`tyard pipeline run|show|list|cancel`."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tensoryard.cli._common import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    ago,
    client_for,
    console,
    err_console,
    print_json,
    user_errors,
)
from tensoryard.client import Client
from tensoryard.spec.pipeline import load_pipeline_spec, parse_params, resolve_params

__all__ = ["register", "watch_pipeline"]

pipeline_app = typer.Typer(
    help="Pipelines: DAGs of jobs whose steps read earlier steps' outputs.",
    no_args_is_help=True,
)

PipelineIdArg = Annotated[int, typer.Argument(help="Pipeline id.", show_default=False)]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
STYLE = {
    "WAITING": "yellow",
    "RUNNING": "green",
    "SUCCEEDED": "bold green",
    "CACHED": "cyan",
    "SKIPPED": "dim",
    "FAILED": "bold red",
    "CANCELLED": "dim",
}


def _state(value: str) -> str:
    return f"[{STYLE.get(value, 'white')}]{value}[/]"


@pipeline_app.command("run")
def run(
    file: Annotated[Path, typer.Argument(help="PipelineSpec YAML file.", show_default=False)],
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="A parameter value, KEY=VALUE (repeatable)."),
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Follow every step live until the pipeline ends.")
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate a pipeline (steps, references, cycles, parameters) and start a run.

    With --wait, prints a line whenever a step or its job changes (and the job's latest step
    and loss while it trains) and exits 1 unless the pipeline succeeds. With --json the
    progress goes to stderr and the final pipeline to stdout."""
    with user_errors():
        spec = load_pipeline_spec(file)
        given = parse_params(param or [])
        resolve_params(spec, given)  # unknown or missing parameters: exit 2 before sending
        body = spec.model_dump(mode="json", by_alias=True, exclude={"user"})
        with client_for(server, token) as client:
            record = client.run_pipeline(body, given)
            if not wait:
                if json_out:
                    print_json(record)
                else:
                    console.print(
                        f"started pipeline [bold]{record['id']}[/] ({record['name']}, "
                        f"{len(record['steps'])} steps); follow it with "
                        f"`tyard pipeline show {record['id']}`",
                        highlight=False,
                    )
                return
            final = watch_pipeline(
                client, int(record["id"]), out=err_console if json_out else console
            )
            if json_out:
                print_json(final)
            if final["state"] != "SUCCEEDED":
                raise typer.Exit(1)


def watch_pipeline(
    client: Client, pipeline_id: int, *, out: Console, poll_s: float = 1.0
) -> dict[str, Any]:
    """Print step changes (and running jobs' progress) until the pipeline ends."""
    seen: dict[str, str] = {}
    progress: dict[int, tuple[int, float]] = {}  # job -> (last step shown, when)
    while True:
        record = client.pipeline(pipeline_id)
        for step in record["steps"]:
            line = _step_line(client, step, progress)
            if line is not None and seen.get(step["name"]) != line[0]:
                seen[step["name"]] = line[0]
                out.print(f"{_now()} {line[1]}", highlight=False, soft_wrap=True)
        if record["state"] in TERMINAL:
            out.print(
                f"{_now()} pipeline {pipeline_id} {_state(record['state'])}: "
                f"{escape(record['reason'])}",
                highlight=False,
                soft_wrap=True,
            )
            return record
        time.sleep(poll_s)


def _step_line(
    client: Client, step: dict[str, Any], progress: dict[int, tuple[int, float]]
) -> tuple[str, str] | None:
    """(what changed, the line) for a step: its state, and for a running job its state and
    latest step/loss (at most every 5 seconds)."""
    name, state = step["name"], step["state"]
    head = f"{name:<16} {_state(state)}"
    if state != "RUNNING" or step["job_id"] is None:
        return state, f"{head} {escape(step['reason'])}"
    job_id = int(step["job_id"])
    job = client.job(job_id)
    key = f"{state}/{job_id}/{job['state']}"
    tail = f"job {job_id} {job['state']}"
    last, when = progress.get(job_id, (-1, 0.0))
    if job["state"] == "RUNNING" and time.monotonic() - when >= 5.0:
        rows = client.metrics(job_id, after_step=last)
        if rows:
            newest = rows[-1]
            loss = newest["values"].get("loss")
            progress[job_id] = (int(newest["step"]), time.monotonic())
            tail += f" step {newest['step']}" + (f" loss {loss:.3f}" if loss is not None else "")
            key += f"/{newest['step']}"
        else:
            key += f"/{last}"
    elif job_id in progress:
        key += f"/{progress[job_id][0]}"
    return key, f"{head} {tail}"


def _now() -> str:
    return datetime.now().strftime("%H:%M:%S")


@pipeline_app.command("show")
def show(
    pipeline_id: PipelineIdArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A pipeline's state and every step: its jobs, tries, reason and outputs."""
    with user_errors(), client_for(server, token) as client:
        record = client.pipeline(pipeline_id)
        if json_out:
            print_json(record)
            return
        console.print(
            f"pipeline [bold]{record['id']}[/] {record['name']} (team {record['team']}, "
            f"by {record['user']}) {_state(record['state'])}: {escape(record['reason'])}",
            highlight=False,
        )
        if record["params"]:
            params = ", ".join(f"{k}={v}" for k, v in record["params"].items())
            console.print(f"params: {escape(params)}", highlight=False)
        table = Table("step", "state", "jobs", "reason", "outputs", box=None)
        for step in record["steps"]:
            jobs = ",".join(str(j) for j in step["job_ids"]) or "-"
            outputs = ", ".join(
                f"{k}={_short(v)}" for k, v in step["outputs"].items() if k not in ("run_dir",)
            )
            table.add_row(
                step["name"], _state(step["state"]), jobs, escape(step["reason"]), escape(outputs)
            )
        console.print(table)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 40 else "..." + text[-37:]


@pipeline_app.command("list")
def list_(
    team: Annotated[str | None, typer.Option(help="Only this team's pipelines.")] = None,
    state: Annotated[
        str | None, typer.Option(help="RUNNING, SUCCEEDED, FAILED or CANCELLED (comma list).")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Pipelines of the teams you may see, newest first."""
    with user_errors(), client_for(server, token) as client:
        records = client.pipelines(team=team, state=state, limit=limit)
        if json_out:
            print_json(records)
            return
        table = Table("id", "name", "team", "user", "state", "steps done", "created", box=None)
        for r in records:
            done = sum(1 for s in r["steps"] if s["state"] in ("SUCCEEDED", "CACHED", "SKIPPED"))
            table.add_row(
                str(r["id"]),
                r["name"],
                r["team"],
                r["user"],
                _state(r["state"]),
                f"{done}/{len(r['steps'])}",
                ago(r["created_at"]),
            )
        console.print(table)


@pipeline_app.command("cancel")
def cancel(
    pipeline_id: PipelineIdArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Cancel a run: running jobs checkpoint and stop, steps not started are cancelled."""
    with user_errors(), client_for(server, token) as client:
        record = client.cancel_pipeline(pipeline_id)
        if json_out:
            print_json(record)
        else:
            console.print(f"cancelling pipeline {pipeline_id} ({record['name']})")


def register(app: typer.Typer) -> None:
    app.add_typer(pipeline_app, name="pipeline")
