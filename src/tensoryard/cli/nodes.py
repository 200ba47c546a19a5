"""`tyard nodes list|cordon|uncordon|history`: the nodes jobs are placed on and their health."""

from __future__ import annotations

from typing import Annotated, Any

import typer
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

__all__ = ["register"]

nodes_app = typer.Typer(
    help="Nodes: list them, cordon or drain one, give it back (uncordon), read its history.",
    no_args_is_help=True,
)
NodeArg = Annotated[str, typer.Argument(help="Node name (see `tyard nodes list`).")]
_STYLE = {"ready": "green", "cordoned": "yellow", "draining": "red"}


def _cluster(node: dict[str, Any]) -> str:
    """The cluster's own view of the node: open, or why it takes no new jobs."""
    if node.get("schedulable") is None:
        return "[dim]not seen[/]"
    if node["schedulable"]:
        return "[green]schedulable[/]"
    return f"[yellow]{escape(node.get('condition') or 'not schedulable')}[/]"


@nodes_app.command("list")
def list_nodes(server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False) -> None:
    """Every node with its state: ready, cordoned (no new jobs) or draining (jobs moved off)."""
    with user_errors(), client_for(server, token) as client:
        nodes = client.nodes()
    if json_out:
        print_json(nodes)
        return
    table = Table("NODE", "STATE", "SINCE", "REASON", "CLUSTER", "AGENT", box=None)
    for n in nodes:
        style = _STYLE.get(n["state"], "")
        beat = n.get("heartbeat_at")
        table.add_row(
            escape(n["name"]),
            f"[{style}]{n['state']}[/]",
            ago(n["changed_at"]),
            escape(n["reason"] or "-"),
            _cluster(n),
            f"reported {ago(beat)}" if beat else "[dim]none[/]",
        )
    console.print(table)


@nodes_app.command()
def cordon(
    name: NodeArg,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why (kept in the history).")],
    drain: Annotated[
        bool,
        typer.Option(
            "--drain", help="Also move its running jobs off: checkpoint signal, then requeue."
        ),
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Cordon a node: no new jobs land on it (platform admins). Undo with `uncordon`."""
    with user_errors(), client_for(server, token) as client:
        node = client.cordon(name, reason, drain=drain)
    if json_out:
        print_json(node)
        return
    console.print(f"node {escape(node['name'])} is {node['state']}: {escape(node['reason'])}")


@nodes_app.command()
def uncordon(
    name: NodeArg,
    reason: Annotated[
        str, typer.Option("--reason", "-r", help="Why it is healthy again (kept in the history).")
    ] = "",
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Give a cordoned or drained node back to the scheduler (platform admins)."""
    with user_errors(), client_for(server, token) as client:
        node = client.uncordon(name, reason)
    if json_out:
        print_json(node)
        return
    console.print(f"node {escape(node['name'])} is {node['state']}")


@nodes_app.command()
def history(
    name: NodeArg,
    limit: Annotated[int, typer.Option(help="At most this many lines, newest first.")] = 50,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A node's history: registered, cordoned, drained (with the fault), uncordoned."""
    with user_errors(), client_for(server, token) as client:
        events = client.node_history(name, limit=limit)
    if json_out:
        print_json(events)
        return
    table = Table("WHEN", "WHAT", "BY", "WHY", box=None)
    for e in events:
        table.add_row(e["ts"], e["kind"], escape(e["actor"] or "-"), escape(e["message"] or "-"))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(nodes_app, name="nodes")
