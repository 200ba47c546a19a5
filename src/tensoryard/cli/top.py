"""`tyard top`: a live terminal view of the cluster (nodes, their allocation and health), the
teams (quota, use, queue) and the jobs running or waiting."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from tensoryard.cli._common import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    ago,
    client_for,
    console,
    print_json,
    user_errors,
)
from tensoryard.client import Client

__all__ = ["register", "render", "snapshot"]

ACTIVE = ["ADMITTED", "STARTING", "RUNNING", "RESTARTING"]
MAX_JOBS = 1000  # one page of the API; the view says when there are more
_NODE_STYLE = {"ready": "green", "cordoned": "yellow", "draining": "red"}


def snapshot(client: Client, *, pending_shown: int = 20) -> dict[str, Any]:
    """What the view shows, as JSON-able data: nodes with the CPU and GPUs placed on them,
    teams with quota, use and queue, running jobs and the head of the queue."""
    nodes = client.nodes()
    teams = client.teams()
    active = client.jobs(state=ACTIVE, limit=MAX_JOBS)
    pending = client.jobs(state=["PENDING"], limit=pending_shown)
    jobs = active["items"]
    per_node: dict[str, dict[str, Any]] = {
        n["name"]: {**n, "jobs": [], "cpu_used": 0.0, "gpus_used": 0} for n in nodes
    }
    per_team: dict[str, dict[str, Any]] = {
        t["name"]: {
            "name": t["name"],
            "gpu_quota": t["gpu_quota"],
            "running": 0,
            "pending": 0,
            "gpus_used": 0,
        }
        for t in teams
    }
    for job in jobs:
        resources = job["spec"].get("resources", {})
        team = per_team.setdefault(
            job["team"],
            {"name": job["team"], "gpu_quota": None, "running": 0, "pending": 0, "gpus_used": 0},
        )
        team["running"] += 1
        for node, gpus in job["placement"].items():
            team["gpus_used"] += len(gpus)
            entry = per_node.get(node)
            if entry is not None:
                entry["jobs"].append(job["id"])
                entry["gpus_used"] += len(gpus)
                entry["cpu_used"] += float(resources.get("cpu") or 0)
    queued = _pending_by_team(client, list(per_team))
    for name, count in queued.items():
        per_team[name]["pending"] = count
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "nodes": list(per_node.values()),
        "teams": sorted(per_team.values(), key=lambda t: t["name"]),
        "running": [_job(j) for j in jobs],
        "running_total": active["total"],
        "pending": [_job(j) for j in pending["items"]],
        "pending_total": pending["total"],
    }


def _pending_by_team(client: Client, teams: list[str]) -> dict[str, int]:
    return {t: int(client.jobs(state=["PENDING"], team=t, limit=1)["total"]) for t in teams}


def _job(job: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": job["id"],
        "name": job["name"],
        "team": job["team"],
        "state": job["state"],
        "placement": job["placement"],
        "restarts": job["restarts"],
        "since": job["updated_at"],
        "last_heartbeat": job["last_heartbeat"],
        "pending_reason": job["pending_reason"],
        "pending_eta": job["pending_eta"],
    }


def render(data: Mapping[str, Any]) -> RenderableType:
    """The view of one snapshot: nodes, teams, running jobs, the head of the queue."""
    nodes = Table("NODE", "STATE", "JOBS", "CPU", "GPUS", "WHY", title="nodes", box=None)
    for n in data["nodes"]:
        style = _NODE_STYLE.get(n["state"], "")
        nodes.add_row(
            escape(n["name"]),
            f"[{style}]{n['state']}[/]",
            " ".join(str(j) for j in n["jobs"]) or "-",
            f"{n['cpu_used']:g}",
            str(n["gpus_used"]),
            escape(n["reason"] or ""),
        )
    teams = Table("TEAM", "GPU QUOTA", "GPUS USED", "RUNNING", "PENDING", title="teams", box=None)
    for t in data["teams"]:
        quota = "-" if t["gpu_quota"] is None else str(t["gpu_quota"])
        teams.add_row(
            escape(t["name"]), quota, str(t["gpus_used"]), str(t["running"]), str(t["pending"])
        )
    running = Table(
        "ID",
        "NAME",
        "TEAM",
        "STATE",
        "ON",
        "RESTARTS",
        "SINCE",
        "HEARTBEAT",
        title=f"running ({data['running_total']})",
        box=None,
    )
    for j in data["running"]:
        running.add_row(
            str(j["id"]),
            escape(j["name"]),
            escape(j["team"]),
            j["state"],
            escape(", ".join(j["placement"]) or "-"),
            str(j["restarts"]),
            ago(j["since"]),
            ago(j["last_heartbeat"]),
        )
    pending = Table(
        "ID", "NAME", "TEAM", "WAITING", "WHY", title=f"pending ({data['pending_total']})", box=None
    )
    for j in data["pending"]:
        pending.add_row(
            str(j["id"]),
            escape(j["name"]),
            escape(j["team"]),
            ago(j["since"]),
            escape(j["pending_reason"] or "-"),
        )
    return Group(f"[dim]tensoryard at {data['at']}[/]", nodes, "", teams, "", running, "", pending)


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one view and exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.5)] = 2.0,
    pending: Annotated[int, typer.Option(help="Pending jobs shown (head of the queue).")] = 20,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A live view of the cluster: nodes (allocation, cordon state), teams (quota, use, queue)
    and jobs (running, pending and why). Ctrl-C to quit; --once or --json for one view."""
    with user_errors(), client_for(server, token) as client:
        if json_out:
            print_json(snapshot(client, pending_shown=pending))
            return
        if once:
            console.print(render(snapshot(client, pending_shown=pending)))
            return
        with Live(
            render(snapshot(client, pending_shown=pending)),
            console=console,
            screen=False,
            auto_refresh=False,
        ) as live:
            try:
                while True:
                    time.sleep(interval)
                    live.update(render(snapshot(client, pending_shown=pending)), refresh=True)
            except KeyboardInterrupt:
                return


def register(app: typer.Typer) -> None:
    app.command()(top)
