"""`tyard cluster`: plan a GPU cluster from an inventory, and preflight a GPU node."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tensoryard.cli._common import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    console,
    err_console,
    print_json,
    user_errors,
)

__all__ = ["cluster_app", "register"]

cluster_app = typer.Typer(
    help="Prepare the GPU cluster: generate its configuration, check its nodes.",
    no_args_is_help=True,
)

_PLAN_HELP = (
    "Generate node labels and taints, GPU Operator (and Network Operator) Helm values, the DCGM "
    "exporter metric list, Kueue objects mirroring the quotas, and a Prometheus configuration "
    "from an inventory file.\n\n"
    "The inventory is checked first: duplicate node names, unknown GPU models, quotas larger "
    "than the GPUs present and impossible driver/CUDA/PyTorch/NCCL/GPU combinations are errors "
    "naming the field; nothing is written then. Files are written to a temporary folder and "
    "renamed into place.\n\n"
    "Example: tyard cluster plan examples/cluster/inventory.yaml -o plan/"
)


@cluster_app.command(
    "plan", help=_PLAN_HELP, short_help="Generate cluster configuration from an inventory."
)
def plan(
    inventory: Annotated[Path, typer.Argument(help="Inventory YAML file.", show_default=False)],
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder to write.", show_default=False)],
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty folder.")] = False,
    crds: Annotated[
        Path | None,
        typer.Option(
            "--crds",
            help="Validate the Kueue objects against the CRD YAMLs in this folder first.",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write the cluster plan (see the command help)."""
    from tensoryard.cluster import build_plan, load_inventory, write_plan
    from tensoryard.cluster.crds import check_objects

    with user_errors():
        inv = load_inventory(inventory)
        result = build_plan(inv)
        if crds is not None:
            check_objects(result.kueue, crds)
        target = write_plan(result, out, force=force)
    if json_out:
        print_json({"out": str(target), **result.summary})
        return
    gpus = ", ".join(f"{n} {m}" for m, n in result.summary["gpus"].items())
    console.print(f"[green]wrote[/] {target}: {result.summary['nodes']} nodes ({gpus})")
    for name in result.summary["files"]:
        console.print(f"  {name}")
    console.print(f"Fabric Manager: {result.summary['fabric_manager']}")


_PREFLIGHT_HELP = (
    "Check that this GPU node is fit to take jobs: GPUs and model, driver/CUDA/PyTorch/NCCL "
    "against the compatibility table (and the inventory), Fabric Manager on NVSwitch nodes, "
    "NVLink topology and link state, ECC and row remapping, InfiniBand ports at the expected "
    "rate, and a short all-reduce (NCCL on GPUs with a bus-bandwidth floor per GPU model; "
    "gloo with 2 processes on a CPU-only machine).\n\n"
    "Exit code 0 when no check failed, 1 otherwise. --json prints the report; --report-to "
    "POSTs it.\n\n"
    "Example: tyard cluster preflight --inventory inventory.yaml --node hgx-a01 --json"
)


@cluster_app.command(
    "preflight", help=_PREFLIGHT_HELP, short_help="Check that this GPU node can take jobs."
)
def preflight(
    inventory: Annotated[
        Path | None,
        typer.Option(
            "--inventory", help="Inventory YAML: what this node should be.", show_default=False
        ),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(
            "--node", help="Node name in the inventory (default: hostname).", show_default=False
        ),
    ] = None,
    allreduce: Annotated[
        bool, typer.Option("--allreduce/--no-allreduce", help="Run the all-reduce check.")
    ] = True,
    procs: Annotated[
        int | None,
        typer.Option(
            "--procs",
            min=1,
            help="All-reduce processes (default: one per GPU, or 2 on CPU; 1 on a one-GPU "
            "node checks that NCCL runs, with no bus to measure).",
            show_default=False,
        ),
    ] = None,
    size_mb: Annotated[int, typer.Option("--size-mb", min=1, help="All-reduce size in MiB.")] = 64,
    report_to: Annotated[
        str | None,
        typer.Option(
            "--report-to",
            help="POST the JSON report to this URL, or to the control plane with "
            "'control-plane' (it records the report in the node's history and cordons the "
            "node when a check failed).",
            show_default=False,
        ),
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            help="Keep every command's output in this folder (commands.json indexes them), "
            "to attach to a report or replay in a test.",
            show_default=False,
        ),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Run the node preflight (see the command help)."""
    import functools
    import socket

    from tensoryard.cluster import load_inventory
    from tensoryard.cluster.preflight import (
        Expectations,
        RecordingRunner,
        check_allreduce,
        expectations_for,
        post_report,
        run_preflight,
    )

    with user_errors():
        name = node or socket.gethostname()
        expect = Expectations()
        if inventory is not None:
            expect = expectations_for(load_inventory(inventory), name)
        check = None
        if allreduce:
            world = procs or _default_procs()
            check = functools.partial(
                check_allreduce, world_size=world, size_bytes=size_mb * 1024 * 1024
            )
        with err_console.status("running preflight checks", spinner="dots"):
            runner = RecordingRunner(record) if record is not None else None
            report = run_preflight(expect, node=name, runner=runner, allreduce=check)
        if report_to == "control-plane":
            from tensoryard.client import resolve_connection

            url, tok = resolve_connection(server, token)
            post_report(report, f"{url}/api/v1/nodes/{report.node}/preflight", token=tok)
        elif report_to:
            post_report(report, report_to, token=token)
    if json_out:
        print_json(report.as_dict())
    else:
        colour = {"pass": "green", "fail": "red", "warn": "yellow", "skip": "dim"}
        for c in report.checks:
            console.print(
                f"[{colour[c.status]}]{c.status:4}[/] {c.name:15} {c.message}", highlight=False
            )
        console.print(f"node {report.node}: {'OK' if report.ok else 'FAILED'}")
    if not report.ok:
        raise typer.Exit(1)


def _default_procs() -> int:
    try:
        import torch
    except ImportError:
        return 2
    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def register(app: typer.Typer) -> None:
    """Add the `cluster` command group to the root `tyard` app."""
    app.add_typer(cluster_app, name="cluster")
