"""`tyard agent`: the node agent (Prometheus /metrics of this node, health reports)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from tensoryard.cli._common import ServerOpt, TokenOpt, console, die

__all__ = ["register"]


def agent(
    node: Annotated[
        str | None,
        typer.Option(help="This node's name in the control plane (default: the hostname)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to serve /metrics on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve /metrics on.")] = 9410,
    proc_root: Annotated[
        Path, typer.Option("--proc-root", help="procfs to read (a recorded tree in tests).")
    ] = Path("/proc"),
    sys_root: Annotated[
        Path, typer.Option("--sys-root", help="sysfs to read (a recorded tree in tests).")
    ] = Path("/sys"),
    check: Annotated[
        list[str] | None,
        typer.Option(
            "--check",
            help="Health-check command (repeatable; run without a shell every --interval "
            "seconds): a non-zero exit or a timeout drains the node.",
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option(help="Seconds between two health checks.", min=0.5)
    ] = 5.0,
    standalone: Annotated[
        bool,
        typer.Option(
            "--standalone",
            help="Serve metrics only: no control plane (no GPU owners, no health reports).",
        ),
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the node agent: serve this node's GPU (NVML, DCGM names), InfiniBand, disk and NCCL
    metrics at /metrics, and report faults (fatal XID, IB port down, failed --check) to the
    control plane, which drains the node. Needs a platform admin's token to report."""
    from tensoryard.agent.service import AgentConfig, NodeAgent
    from tensoryard.client import Client

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    for root, flag in ((proc_root, "--proc-root"), (sys_root, "--sys-root")):
        if not root.is_dir():
            console.print(
                f"[yellow]warning:[/] {flag} {root} is not a directory: its collectors will "
                "count errors (tyard_collector_errors_total) and export nothing"
            )
    config = AgentConfig(
        host=host,
        port=port,
        proc_root=proc_root,
        sys_root=sys_root,
        checks=tuple(check or ()),
        health_interval_s=interval,
    )
    if node:
        config.node = node
    client = None if standalone else Client.from_env(server, token)
    service = NodeAgent(config, control_plane=client)
    try:
        url = service.start()
    except OSError as exc:
        die(f"cannot listen on {host}:{port}: {exc.strerror} (fix: pass another --port)", 1)
    where = "standalone" if client is None else f"reporting to {client.url}"
    console.print(f"node agent for {config.node}: {url}/metrics ({where})")
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    service.stop()
    if client is not None:
        client.close()


def register(app: typer.Typer) -> None:
    app.command()(agent)
