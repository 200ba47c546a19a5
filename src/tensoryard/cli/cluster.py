"""`tyard cluster`: plan a GPU cluster from an inventory, and preflight a GPU node."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tensoryard.cli._common import JsonOpt, console, print_json, user_errors

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


@cluster_app.command("plan", help=_PLAN_HELP)
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


def register(app: typer.Typer) -> None:
    """Add the `cluster` command group to the root `tyard` app."""
    app.add_typer(cluster_app, name="cluster")
