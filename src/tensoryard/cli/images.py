"""`tyard images list | build | check | push | resolve`: the base images of the matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tensoryard import __version__, envvars
from tensoryard.cli._common import JsonOpt, console, die, print_json, user_errors
from tensoryard.images.matrix import Matrix, default_matrix, load_matrix
from tensoryard.images.refs import ImageRefError, image_ref_for

__all__ = ["register"]

images_app = typer.Typer(
    name="images",
    help="Base images: the matrix, daemonless builds (debootstrap + umoci), checks, pushes.",
    no_args_is_help=True,
)

MatrixOpt = Annotated[
    Path | None,
    typer.Option(
        "--matrix",
        envvar=envvars.IMAGE_MATRIX.name,
        help="A matrix file instead of the shipped one (the site's; the control plane reads "
        "the same variable).",
        show_default=False,
    ),
]
RegistryOpt = Annotated[
    str | None,
    typer.Option(
        "--registry",
        envvar=envvars.IMAGE_REGISTRY.name,
        help="Registry prefix of image references (default localhost/tensoryard).",
        show_default=False,
    ),
]
BUILD_PHASES = 7


def _matrix(path: Path | None) -> Matrix:
    return load_matrix(path) if path else default_matrix()


@images_app.command("list")
def list_images(
    matrix: MatrixOpt = None, registry: RegistryOpt = None, json_out: JsonOpt = False
) -> None:
    """Every image of the matrix (each checked against the compatibility table) and its build."""
    from tensoryard.images.builder import find_built

    with user_errors():
        entries = _matrix(matrix).entries
        rows = []
        for entry in entries.values():
            built = find_built(entry.name)
            rows.append(
                entry.as_dict()
                | {"ref": image_ref_for(entry.name, registry=registry), "built": built}
            )
    if json_out:
        print_json(rows)
        return
    table = Table()
    table.add_column("name", no_wrap=True)
    for column in ("flavour", "python", "torch", "cuda", "nccl", "min driver", "built"):
        table.add_column(column)
    for row in rows:
        built = row["built"]
        size = f"{built['archive_bytes'] / 2**30:.2f} GiB" if built else "-"
        table.add_row(
            row["name"],
            row["flavour"],
            row["python"],
            row["torch"] or "-",
            row["cuda"] or "cpu",
            row["nccl"] or "-",
            row["min_driver"] or "-",
            size,
        )
    console.print(table)


@images_app.command("build")
def build_image(
    name: Annotated[
        str,
        typer.Argument(
            help="A matrix image, e.g. cpu; or `postgres`: the control plane's database."
        ),
    ],
    source: Annotated[
        Path | None, typer.Option("--source", help="tensoryard checkout to install.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when cached.")] = False,
    matrix: MatrixOpt = None,
    registry: RegistryOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Build NAME into an OCI archive under ~/.cache/tensoryard/images (cached by content hash).

    Needs root and Debian's debootstrap, umoci and skopeo. The archive loads into containerd
    with `ctr -n k8s.io images import ARCHIVE`."""
    from tensoryard.images.builder import build
    from tensoryard.images.postgres import NAME as POSTGRES
    from tensoryard.images.postgres import build_postgres

    with user_errors():
        entry = None if name == POSTGRES else _matrix(matrix).get(name)
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=console if not json_out else None,
            disable=json_out,
            transient=True,
        )
        with progress:
            task = progress.add_task(f"{name}: starting", total=BUILD_PHASES)

            def step(text: str) -> None:
                progress.update(task, description=f"{name}: {text}", advance=1)

            if entry is None:
                result = build_postgres(registry=registry, progress=step, force=force)
            else:
                result = build(entry, source=source, registry=registry, progress=step, force=force)
    if json_out:
        print_json(result.as_dict())
        return
    how = "cached, not rebuilt" if result.cached else f"built in {result.build_s:.0f} s"
    python = f", {result.packages} Python packages" if result.packages else ""
    console.print(
        f"{result.ref} ({how}): {result.archive} ({result.archive_bytes / 2**30:.2f} "
        f"GiB, {len(result.layers)} layers{python})"
    )


@images_app.command("check")
def check_image(
    image: Annotated[
        str | None, typer.Argument(help="A built matrix image; none: inside an image.")
    ] = None,
    inside: Annotated[
        bool, typer.Option("--inside", help="Check this environment (run in the container).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Versions agree with the matrix, GPUs are visible where expected, a 2-process all-reduce
    runs. Exit 0 when every check passes, 1 otherwise."""
    with user_errors():
        if inside or image is None:
            from tensoryard.images.selfcheck import run_checks

            findings = [f.as_dict() for f in run_checks()]
            where = "this environment"
        else:
            from tensoryard.images.operate import built_rootfs, check_in_rootfs

            _, rootfs = built_rootfs(image)
            findings = check_in_rootfs(rootfs)
            where = f"{image} ({rootfs})"
    ok = bool(findings) and all(f["ok"] for f in findings)
    if json_out:
        print_json({"ok": ok, "where": where, "findings": findings})
    else:
        for f in findings:
            mark = "[green]ok[/]" if f["ok"] else "[red]FAIL[/]"
            console.print(f"{mark:>14} {f['check']:<11} {f['detail']}", highlight=False)
        console.print(f"{where}: {'all checks passed' if ok else 'checks FAILED'}")
    raise typer.Exit(0 if ok else 1)


@images_app.command("push")
def push_image(
    name: Annotated[str, typer.Argument(help="A built matrix image, or postgres.")],
    registry: Annotated[
        str,
        typer.Argument(help="Registry prefix (registry.example.com/ml) or a skopeo destination."),
    ],
    tls_verify: Annotated[
        bool, typer.Option("--tls-verify/--no-tls-verify", help="Verify the registry's TLS.")
    ] = True,
    cert_dir: Annotated[
        Path | None,
        typer.Option(
            "--cert-dir",
            help="Directory with the registry's CA (ca.crt) when a site CA signs its TLS.",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Copy a built image to a registry with skopeo (REGISTRY/NAME:VERSION)."""
    from tensoryard.images.operate import built_archive, push, push_destination

    with user_errors():
        try:
            destination = push_destination(name, registry, __version__)
        except ImageRefError as exc:
            die(str(exc), 2)
        done = push(built_archive(name), destination, tls_verify=tls_verify, cert_dir=cert_dir)
    if json_out:
        print_json({"name": name, "destination": done})
    else:
        console.print(f"pushed {name} to {done}")


@images_app.command("resolve")
def resolve(
    name: Annotated[str, typer.Argument(help="A matrix image.")],
    matrix: MatrixOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """What the image's pinned torch wheel resolves to (CUDA, NCCL, cuDNN), checked against the
    matrix and the compatibility table without building. Exit 1 on any disagreement."""
    from tensoryard.images.operate import resolve_manifest

    with user_errors():
        report: dict[str, Any] = resolve_manifest(_matrix(matrix).get(name))
    if json_out:
        print_json(report)
    else:
        resolved = report.get("resolved") or {}
        console.print(
            f"{name}: torch wheel {resolved.get('wheel', '-')}, CUDA "
            f"{resolved.get('cuda', '-')}, NCCL {resolved.get('nccl', '-')}, cuDNN "
            f"{resolved.get('cudnn', '-')}",
            highlight=False,
        )
        for problem in report["problems"]:
            console.print(f"[red]problem:[/] {problem}", highlight=False)
    raise typer.Exit(1 if report["problems"] else 0)


def register(app: typer.Typer) -> None:
    app.add_typer(images_app)
