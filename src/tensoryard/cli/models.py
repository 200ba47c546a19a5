"""`tyard models list|show|register|alias|tag|lineage|export|import|gc|webhooks`: the registry.

Artifact bytes go straight to the artifact store (the control plane names it; ``--store``
overrides), never through the API; the registration itself is one API call.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from tensoryard import envvars
from tensoryard.cli._common import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    client_for,
    console,
    die,
    err_console,
    print_json,
    user_errors,
)
from tensoryard.client import Client

__all__ = ["models_app", "register"]

_HASH = re.compile(r"^(blake3|b3|sha256):[0-9a-f]{64}$")  # a dataset hash, as --data-manifest

models_app = typer.Typer(
    help="Model registry: versions from checkpoints or files, aliases, lineage, HF export.",
    no_args_is_help=True,
)

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar=envvars.ARTIFACTS.name,
        help="Artifact store URL (directory or s3://bucket/prefix); default: the server's.",
        show_default=False,
    ),
]
TagOpt = Annotated[
    list[str] | None, typer.Option("--tag", help="KEY=VALUE tag (repeatable).", show_default=False)
]
AliasOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--alias", help="Alias to point at the new version (repeatable).", show_default=False
    ),
]


def _split_ref(ref: str, *, need_version: bool = False) -> tuple[str, str, str | None]:
    """TEAM/MODEL[:VERSION|ALIAS] -> (team, model, version-or-alias)."""
    head, _, version = ref.partition(":")
    team, slash, model = head.partition("/")
    if not slash or not team or not model:
        die(f"{ref!r} is not TEAM/MODEL[:VERSION] (fix: e.g. nlp/tiny-gpt:3 or nlp/tiny-gpt)")
    if need_version and not version:
        die(f"{ref!r} names no version (fix: add :VERSION or :ALIAS, e.g. {head}:production)")
    return team, model, version or None


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in values or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            die(f"{what} {item!r} is not KEY=VALUE (fix: e.g. --{what} stage=sft)")
        out[key] = value
    return out


def _artifact_store(client: Client, store: str | None) -> Any:
    from tensoryard.registry import ArtifactStore, open_blobs

    return ArtifactStore(open_blobs(store or client.artifacts_url()))


def _push(client: Client, store: str | None, path: Path, quiet: bool) -> Any:
    artifacts = _artifact_store(client, store)
    if quiet:
        return artifacts.push(path)
    columns = ("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(f"pushing {path.name}", total=None)
        result = artifacts.push(
            path, progress=lambda done, total: bar.update(task, completed=done, total=total)
        )
    new = result.bytes_new / max(result.bytes_total, 1)
    err_console.print(
        f"pushed {result.bytes_total:,} bytes in {result.seconds:.1f}s; "
        f"{result.bytes_new:,} new ({new:.0%}); artifact {result.manifest.digest[:16]}"
    )
    return result


def _print_version(v: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None)
    fields = (
        "version", "artifact", "size_bytes", "format", "source", "job_id", "checkpoint_step",
        "code_revision", "data_manifest", "parent", "metrics", "tags", "aliases", "created_by",
        "created_at", "description",
    )  # fmt: skip
    table.add_row("model", f"{v['team']}/{v['model']}")
    for key in fields:
        value = v.get(key)
        if value not in (None, "", {}, []):
            table.add_row(key, escape(str(value)))
    console.print(table)


# ---- commands -------------------------------------------------------------------------------


@models_app.command("list")
def list_models(
    team: Annotated[str | None, typer.Option("--team", help="Only this team.")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Models of the teams you can see."""
    with user_errors(), client_for(server, token) as c:
        rows = c.models(team)
    if json_out:
        print_json(rows)
        return
    table = Table("MODEL", "LATEST", "ALIASES", "CREATED BY")
    for m in rows:
        aliases = ", ".join(f"{a}->{v}" for a, v in m["aliases"].items())
        table.add_row(
            f"{m['team']}/{m['name']}", str(m["latest_version"] or "-"), aliases, m["created_by"]
        )
    console.print(table)


@models_app.command("show")
def show(
    ref: Annotated[str, typer.Argument(help="TEAM/MODEL, or TEAM/MODEL:VERSION|ALIAS.")],
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """A model and its versions, or one version."""
    team, model, version = _split_ref(ref)
    with user_errors(), client_for(server, token) as c:
        data = c.model_version(team, model, version) if version else c.model(team, model)
    if json_out:
        print_json(data)
    elif version:
        _print_version(data)
    else:
        table = Table("VERSION", "FORMAT", "SIZE", "JOB", "STEP", "ALIASES", "TAGS", "METRICS")
        for v in data["versions"]:
            table.add_row(
                str(v["version"]), v["format"], f"{v['size_bytes']:,}", str(v["job_id"] or "-"),
                str(v["checkpoint_step"] if v["checkpoint_step"] is not None else "-"),
                ", ".join(v["aliases"]), escape(str(v["tags"] or "")),
                escape(str(v["metrics"] or "")),
            )  # fmt: skip
        console.print(f"[bold]{team}/{model}[/] aliases: {data['aliases'] or '-'}")
        console.print(table)


@models_app.command("register")
def register_version(
    ref: Annotated[str, typer.Argument(help="TEAM/MODEL to add a version to.")],
    path: Annotated[
        Path | None, typer.Argument(help="File or directory to register.", show_default=False)
    ] = None,
    job: Annotated[
        int | None, typer.Option("--job", help="Promote this job's checkpoint instead of PATH.")
    ] = None,
    step: Annotated[
        int | None, typer.Option("--step", help="Checkpoint step (default: newest).")
    ] = None,
    parent: Annotated[
        str | None, typer.Option("--parent", help="VERSION or MODEL:VERSION.")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="Override the detected format.")
    ] = None,
    code_revision: Annotated[str, typer.Option("--code-revision", help="Git commit.")] = "",
    data_manifest: Annotated[
        str,
        typer.Option(
            "--data-manifest",
            help="Dataset hash, or a dataset directory from `tyard data prepare` (its "
            "manifest.json is hashed).",
        ),
    ] = "",
    metric: Annotated[list[str] | None, typer.Option("--metric", help="KEY=NUMBER.")] = None,
    description: Annotated[str, typer.Option("--description")] = "",
    tag: TagOpt = None,
    alias: AliasOpt = None,
    store: StoreOpt = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Register a new immutable version from files (pushed first) or from a job's checkpoint."""
    team, model, _ = _split_ref(ref)
    if (path is None) == (job is None):
        die("give exactly one of PATH and --job (fix: a directory to push, or --job ID)")
    try:
        metrics = {k: float(v) for k, v in _pairs(metric, "metric").items()}
    except ValueError:
        die("--metric values must be numbers (fix: e.g. --metric eval_loss=1.25)")
    body: dict[str, Any] = {
        "parent": parent, "format": fmt, "code_revision": code_revision,
        "data_manifest": data_manifest, "metrics": metrics, "description": description,
        "tags": _pairs(tag, "tag"), "aliases": list(alias or []),
    }  # fmt: skip
    if data_manifest and not Path(data_manifest).exists() and not _HASH.match(data_manifest):
        die(
            f"--data-manifest {data_manifest!r} is neither an existing dataset directory nor a "
            "dataset hash (fix: pass the directory written by `tyard data prepare --out`, or "
            "its hash like blake3:<64 hex digits>); nothing was registered"
        )
    with user_errors(), client_for(server, token) as c:
        if data_manifest and Path(data_manifest).exists():
            from tensoryard.registry.service import data_manifest_hash

            body["data_manifest"] = data_manifest_hash(Path(data_manifest))
        if path is not None:
            if not path.exists():
                die(f"{path} does not exist (fix: pass a checkpoint file or directory)")
            if fmt is None:
                from tensoryard.registry.service import detect_format

                body["format"] = detect_format(path)
            body["artifact"] = _push(c, store, path, json_out).manifest.digest
        else:
            body.update(job_id=job, step=step)
        version = c.register_version(team, model, **body)
    if json_out:
        print_json(version)
    else:
        console.print(f"registered [bold]{team}/{model}:{version['version']}[/]")


@models_app.command("alias")
def alias_cmd(
    ref: Annotated[str, typer.Argument(help="TEAM/MODEL.")],
    alias: Annotated[str, typer.Argument(help="Alias, e.g. production.")],
    version: Annotated[int | None, typer.Argument(help="Version to point it at.")] = None,
    delete: Annotated[bool, typer.Option("--delete", help="Remove the alias.")] = False,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Move an alias to a version (atomically), or --delete it."""
    team, model, _ = _split_ref(ref)
    if delete == (version is not None):
        die("give a VERSION to move the alias to, or --delete (not both)")
    with user_errors(), client_for(server, token) as c:
        if delete:
            c.delete_model_alias(team, model, alias)
            result: dict[str, Any] = {"alias": alias, "deleted": True}
        else:
            assert version is not None
            result = c.set_model_alias(team, model, alias, version)
    if json_out:
        print_json(result)
    elif delete:
        console.print(f"deleted alias {alias} of {team}/{model}")
    else:
        console.print(f"{team}/{model}@{alias} -> version {result['version']}")


@models_app.command("tag")
def tag_cmd(
    ref: Annotated[str, typer.Argument(help="TEAM/MODEL:VERSION.")],
    tag: Annotated[list[str] | None, typer.Argument(help="KEY=VALUE tags to set.")] = None,
    remove: Annotated[list[str] | None, typer.Option("--remove", help="Tag key to drop.")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set or remove tags on a version."""
    team, model, version = _split_ref(ref, need_version=True)
    if not str(version).isdigit():
        die("tag a version by number (fix: TEAM/MODEL:3)")
    with user_errors(), client_for(server, token) as c:
        result = c.set_model_tags(
            team, model, int(str(version)), _pairs(tag, "tag"), tuple(remove or ())
        )
    print_json(result) if json_out else console.print(f"tags: {result['tags']}")


@models_app.command("lineage")
def lineage(
    ref: Annotated[str | None, typer.Argument(help="TEAM/MODEL:VERSION|ALIAS.")] = None,
    data_manifest: Annotated[
        str | None, typer.Option("--data-manifest", help="Which versions used this dataset.")
    ] = None,
    job: Annotated[int | None, typer.Option("--job", help="Which versions this job made.")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """How a version was made (and what came of it), or which versions came from a dataset/job."""
    if (ref is None) == (data_manifest is None and job is None):
        die("give TEAM/MODEL:VERSION, or --data-manifest / --job to search the other way")
    with user_errors(), client_for(server, token) as c:
        if ref is not None:
            team, model, version = _split_ref(ref, need_version=True)
            data: Any = c.model_lineage(team, model, str(version))
        else:
            data = c.find_model_versions(job_id=job, data_manifest=data_manifest)
    if json_out:
        print_json(data)
        return
    if ref is None:
        for v in data:
            console.print(
                f"{v['team']}/{v['model']}:{v['version']}  job={v['job_id']}  {v['tags']}"
            )
        return
    _print_version(data["version"])
    chain = " <- ".join(f"{a['model']}:{a['version']}" for a in data["ancestors"]) or "-"
    kids = ", ".join(f"{k['model']}:{k['version']}" for k in data["children"]) or "-"
    console.print(f"ancestors: {chain}\nderived:   {kids}")


@models_app.command("export")
def export(
    ref: Annotated[str, typer.Argument(help="TEAM/MODEL:VERSION|ALIAS.")],
    dest: Annotated[Path, typer.Argument(help="Directory to write.")],
    hf: Annotated[
        bool, typer.Option("--hf", help="Hugging Face layout (safetensors, config, tokenizer).")
    ] = False,
    heads: Annotated[int, typer.Option("--heads", help="Attention heads (for config.json).")] = 4,
    store: StoreOpt = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Write a version's files (verified chunk by chunk), or its Hugging Face layout."""
    team, model, version = _split_ref(ref, need_version=True)
    with user_errors(), client_for(server, token) as c:
        v = c.model_version(team, model, str(version))
        artifacts = _artifact_store(c, store)
        if hf:
            from tensoryard.registry.hf import export_hf

            with tempfile.TemporaryDirectory(prefix="tyard-export-") as tmp:
                artifacts.pull(v["artifact"], Path(tmp))
                export_hf(Path(tmp), dest, n_heads=heads)
        else:
            artifacts.pull(v["artifact"], dest)
    result = {"version": v["version"], "artifact": v["artifact"], "dest": str(dest), "hf": hf}
    print_json(result) if json_out else console.print(
        f"exported {team}/{model}:{v['version']} to {dest}"
    )


@models_app.command("import")
def import_hf(
    ref: Annotated[str, typer.Argument(help="TEAM/MODEL to add a version to.")],
    path: Annotated[Path, typer.Argument(help="Hugging Face model directory.")],
    tag: TagOpt = None,
    alias: AliasOpt = None,
    parent: Annotated[
        str | None, typer.Option("--parent", help="VERSION or MODEL:VERSION.")
    ] = None,
    store: StoreOpt = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Register a Hugging Face layout directory (config.json, *.safetensors, tokenizer)."""
    from tensoryard.registry.hf import check_hf_layout

    team, model, _ = _split_ref(ref)
    with user_errors(), client_for(server, token) as c:
        check_hf_layout(path)
        pushed = _push(c, store, path, json_out)
        version = c.register_version(
            team, model, artifact=pushed.manifest.digest, format="hf", source="hf-import",
            tags=_pairs(tag, "tag"), aliases=list(alias or []), parent=parent,
        )  # fmt: skip
    print_json(version) if json_out else console.print(
        f"imported as {team}/{model}:{version['version']}"
    )


@models_app.command("gc")
def gc_cmd(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what a pass would free; change nothing.")
    ] = False,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Garbage-collect the artifact store (platform admins): keep every registered version's
    chunks, free chunks unreferenced for a whole grace period. Safe while uploads run; a chunk
    found unreferenced now is freed by a pass after the grace period (`tyard server
    --artifact-gc-grace`, default 1 h), unless an upload uses it again."""
    with user_errors(), client_for(server, token) as c:
        if not json_out:
            err_console.print("collecting garbage in the artifact store...")
        result = c.gc_artifacts(dry_run=dry_run)
    if json_out:
        print_json(result)
        return
    verb = "would free" if dry_run else "freed"
    console.print(
        f"kept {result['chunks_kept']} chunks ({_size(result['bytes_kept'])}); {verb} "
        f"{result['chunks_freed']} chunks ({_size(result['bytes_freed'])}) and "
        f"{result['manifests_deleted']} manifests"
    )
    console.print(
        f"{result['chunks_waiting']} unreferenced chunks wait out the {result['grace_s']:g}s "
        f"grace period ({result['chunks_condemned']} newly found); "
        f"{result['leases_expired']} lapsed upload leases"
        + (" (dry run: nothing changed)" if dry_run else "")
    )


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


webhooks_app = typer.Typer(
    help="Registry webhooks: the outbox of deliveries, and redelivery of failed ones (admins).",
    no_args_is_help=True,
)
models_app.add_typer(webhooks_app, name="webhooks")


def _ago(stamp: str | None) -> str:
    return (stamp or "-")[:19].replace("T", " ")


@webhooks_app.command("deliveries")
def webhook_deliveries(
    failed: Annotated[
        bool, typer.Option("--failed", help="Only failed ones (gave up: redeliver them).")
    ] = False,
    pending: Annotated[bool, typer.Option("--pending", help="Only those not sent yet.")] = False,
    event: Annotated[
        str | None, typer.Option("--event-id", help="Only the deliveries of this event.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")] = 50,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Webhook deliveries, newest first: event, receiver, attempts, last answer."""
    if failed and pending:
        die("give --failed or --pending, not both")
    status = "failed" if failed else "pending" if pending else None
    with user_errors(), client_for(server, token) as c:
        rows = c.webhook_deliveries(status=status, event_id=event, limit=limit)
    if json_out:
        print_json(rows)
        return
    if not rows:
        console.print("no webhook deliveries" + (f" with status {status}" if status else ""))
        return
    table = Table("ID", "EVENT", "HOOK", "STATUS", "ATTEMPTS", "LAST", "CREATED", "NEXT / DONE")
    for d in rows:
        last = d["last_error"] or (str(d["last_status"]) if d["last_status"] else "-")
        when = d["delivered_at"] if d["status"] == "delivered" else d["next_attempt_at"]
        if d["status"] == "failed":
            when = None
        table.add_row(
            str(d["id"]),
            d["event"],
            escape(d["hook_url"]),
            d["status"],
            str(d["attempts"]),
            escape(last),
            _ago(d["created_at"]),
            _ago(when),
        )
    console.print(table)


@webhooks_app.command("redeliver")
def webhook_redeliver(
    delivery: Annotated[int, typer.Argument(help="Delivery ID (from `deliveries --failed`).")],
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Queue a failed delivery again: sent at once, same delivery id, retries from zero."""
    with user_errors(), client_for(server, token) as c:
        row = c.redeliver_webhook(delivery)
    if json_out:
        print_json(row)
    else:
        console.print(f"delivery {row['id']} ({row['event']} to {escape(row['hook_url'])}) queued")


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
