"""`tyard server|submit|jobs|describe|logs|cancel|teams`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from tensoryard import envvars
from tensoryard.cli._common import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    ago,
    client_for,
    console,
    die,
    print_json,
    user_errors,
)
from tensoryard.errors import FieldIssue, SpecError
from tensoryard.spec.job import load_job_spec, parse_job_spec
from tensoryard.spec.states import TERMINAL_STATES, JobState

__all__ = ["register", "wait_for_job"]

JobIdArg = Annotated[int, typer.Argument(help="Job id.", show_default=False)]

STATE_STYLE = {
    "PENDING": "yellow",
    "ADMITTED": "cyan",
    "STARTING": "cyan",
    "RUNNING": "green",
    "RESTARTING": "magenta",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "CANCELLED": "dim",
}


def _state(value: str) -> str:
    return f"[{STATE_STYLE.get(value, 'white')}]{value}[/]"


def _public_url(url: str | None) -> str | None:
    """--public-url, checked: an http(s) URL with a host (exit 2 naming the option otherwise)."""
    if url is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        die(f"--public-url {url!r}: write an http(s) URL with a host, like http://10.0.0.5:8642", 2)
    return url.rstrip("/")


def server(
    home: Annotated[
        Path | None, typer.Option(help="State directory (default $TYARD_HOME or ~/.tyard).")
    ] = None,
    db_url: Annotated[
        str | None,
        typer.Option(
            "--db-url", envvar=envvars.DB_URL.name, help="SQLAlchemy URL; default SQLite in home."
        ),
    ] = None,
    db_wait: Annotated[
        float,
        typer.Option(
            "--db-wait",
            min=0,
            help="Seconds to keep retrying a database that cannot be reached yet at start "
            "(one started beside the server, as on Kubernetes); 0 fails at once.",
        ),
    ] = 0.0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8642,
    public_url: Annotated[
        str | None,
        typer.Option(
            help="URL jobs (pods, Slurm tasks) and agents report to, e.g. the Service's "
            "http://tensoryard.tensoryard.svc:8642 (default: http://HOST:PORT; set it when "
            "listening on 0.0.0.0 or behind a Service).",
            show_default=False,
        ),
    ] = None,
    cpu_slots: Annotated[
        float | None, typer.Option(help="CPU cores jobs may use (default: all usable).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    lease_ttl: Annotated[
        float,
        typer.Option(
            help="Seconds a leader may go silent before another replica on the same database "
            "takes over the control loop.",
            min=1.0,
        ),
    ] = 10.0,
    rate_limit: Annotated[
        float,
        typer.Option(
            help="Requests per second each token may make (bursts of 4x that); 429 beyond.",
            min=1.0,
        ),
    ] = 50.0,
    artifacts: Annotated[
        str | None,
        typer.Option(
            "--artifacts",
            envvar=envvars.ARTIFACTS.name,
            help="Artifact store of the model registry: a directory or s3://bucket/prefix "
            "(default: home/artifacts).",
        ),
    ] = None,
    executor: Annotated[
        str,
        typer.Option(help="Where jobs run: 'local' (this machine), 'kubernetes' or 'slurm'."),
    ] = "local",
    slurm_config: Annotated[
        Path | None,
        typer.Option(
            "--slurm-config",
            help="[slurm] YAML file of Slurm executor settings: slurm_conf, teams (team -> "
            "partition/qos/account; '*' for the rest), admission, signal_lead_s, python, "
            "rendezvous_ports, rest_url and rest_token_file (slurmrestd) ... (docs/slurm.md).",
            show_default=False,
        ),
    ] = None,
    slurm_conf: Annotated[
        Path | None,
        typer.Option(
            "--slurm-conf",
            help="[slurm] The cluster's slurm.conf (default: $SLURM_CONF, else "
            "/etc/slurm/slurm.conf).",
            show_default=False,
        ),
    ] = None,
    slurm_rest_url: Annotated[
        str | None,
        typer.Option(
            "--slurm-rest-url",
            help="[slurm] Submit, watch and cancel through slurmrestd at this URL (e.g. "
            "http://slurm-head:6820) instead of sbatch; its JWT from $SLURM_JWT or "
            "rest_token_file in --slurm-config.",
            show_default=False,
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            help="[kubernetes] Kubeconfig (default $KUBECONFIG, ~/.kube/config, or "
            "the in-cluster ServiceAccount)."
        ),
    ] = None,
    namespace: Annotated[
        str, typer.Option(help="[kubernetes] Namespace the jobs' objects are created in.")
    ] = "default",
    default_image: Annotated[
        str | None, typer.Option(help="[kubernetes] Image for jobs whose spec names none.")
    ] = None,
    loader_image: Annotated[
        str | None,
        typer.Option(
            help=(
                "[kubernetes] Image (with tensoryard installed) of the init container that "
                "pulls a model version's weights into GPU serving pods. Default: "
                "tensoryard/tensoryard:VERSION."
            )
        ),
    ] = None,
    workload: Annotated[
        str,
        typer.Option(help="[kubernetes] 'jobset', 'job' (Indexed Job + Service) or 'auto'."),
    ] = "auto",
    admission: Annotated[
        str,
        typer.Option(
            help="[kubernetes] Who admits jobs: 'tensoryard' (its scheduler: quotas, fair "
            "share, gang placement) or 'kueue' (suspended JobSets in the LocalQueue named after "
            "the team; Kueue's ClusterQueues decide; needs Kueue >= 0.17 installed)."
        ),
    ] = "tensoryard",
    node_selector: Annotated[
        list[str] | None,
        typer.Option(
            help="[kubernetes] KEY=VALUE: only nodes with this label are tensoryard's (repeatable)."
        ),
    ] = None,
    team_volume: Annotated[
        list[str] | None,
        typer.Option(
            help="[kubernetes] TEAM=CLAIM:/PATH[:ro]: mount this PersistentVolumeClaim into "
            "every pod of the team's jobs (repeatable), e.g. --team-volume nlp=nlp-data:/data:ro.",
        ),
    ] = None,
    toleration: Annotated[
        list[str] | None,
        typer.Option(
            help="[kubernetes] KEY[=VALUE]:EFFECT every training pod tolerates, beside "
            "nvidia.com/gpu (repeatable), e.g. --toleration dedicated=training:NoSchedule."
        ),
    ] = None,
    runs_claim: Annotated[
        str | None,
        typer.Option(
            help="[kubernetes] PersistentVolumeClaim (ReadWriteMany) holding the run "
            "directories: mount it at <home>/runs here; each pod mounts its job's directory at "
            "the same path (metrics, logs, checkpoints). Without it pods write no run dir."
        ),
    ] = None,
    run_as_user: Annotated[
        int,
        typer.Option(
            help="[kubernetes] uid (and gid) the training pods run as; the images of "
            "`tyard images build` use 1000. -1: the image's user."
        ),
    ] = 1000,
    switch_label: Annotated[
        str, typer.Option(help="[kubernetes] Node label naming a node's leaf switch.")
    ] = "tensoryard.io/switch",
    block_label: Annotated[
        str, typer.Option(help="[kubernetes] Node label naming a node's spine block.")
    ] = "tensoryard.io/block",
    pod_annotation: Annotated[
        list[str] | None,
        typer.Option(help="[kubernetes] KEY=VALUE annotation on every pod (repeatable)."),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            help="[kubernetes] Keep pods, JobSets and nodes in list-then-watch caches "
            "(--no-watch: LIST calls on every poll)."
        ),
    ] = True,
    keep_finished: Annotated[
        int,
        typer.Option(
            help="[kubernetes] Seconds a finished attempt's JobSet/Job and pods stay for "
            "inspection before Kubernetes deletes them (ttlSecondsAfterFinished); "
            "-1 keeps them.",
            min=-1,
        ),
    ] = 3600,
    cordon_nodes: Annotated[
        bool,
        typer.Option(
            help="[kubernetes] Cordon the Kubernetes Node too when tensoryard cordons or drains "
            "a node (unschedulable, taint tensoryard.io/unhealthy; needs `patch nodes`)."
        ),
    ] = True,
    autoscaler: Annotated[
        bool,
        typer.Option(
            "--autoscaler",
            help="[kubernetes] Nodes can be added to the cluster (a cluster autoscaler, "
            "Karpenter): a job no set of today's nodes could hold is accepted and pending "
            "('cannot fit the cluster as it is: ...') until such nodes come, instead of refused.",
        ),
    ] = False,
    cancel_grace: Annotated[
        float,
        typer.Option(help="Seconds a cancelled job gets to checkpoint before it is killed.", min=0),
    ] = 10.0,
    agent_heartbeat_timeout: Annotated[
        float,
        typer.Option(
            help="[local] Seconds a node's agent (`tyard agent`) may be silent once it has "
            "reported before the node is lost: its attempts end and restart elsewhere, and it "
            "takes no jobs until the agent reports again (0: off).",
            min=0,
        ),
    ] = 30.0,
    artifact_gc_grace: Annotated[
        float,
        typer.Option(
            "--artifact-gc-grace",
            help="Seconds a chunk must stay unreferenced before `tyard models gc` frees it "
            "(longer than one upload batch takes).",
            min=0,
        ),
    ] = 3600.0,
    artifact_gc_interval: Annotated[
        float,
        typer.Option(
            "--artifact-gc-interval",
            help="Seconds between the leader's scheduled artifact GC passes (0: none; run "
            "`tyard models gc` by hand).",
            min=0,
        ),
    ] = 6 * 3600.0,
    webhooks: Annotated[
        Path | None,
        typer.Option(
            "--webhooks",
            help="YAML file of model-registry webhook receivers: 'webhooks:' then items with "
            "url, secret_env (or secret_file, secret), events, retries (docs/artifacts.md).",
            show_default=False,
        ),
    ] = None,
    webhook_keep_days: Annotated[
        float,
        typer.Option(
            "--webhook-keep-days",
            help="Days a delivered webhook row is kept before it is pruned (0: keep all; "
            "failed ones stay until redelivered).",
            min=0,
        ),
    ] = 7.0,
    local_nodes: Annotated[
        str | None,
        typer.Option(
            "--local-nodes",
            help="Comma-separated node names that split this machine (CPU and memory shared "
            "equally), to try multi-node placement and draining on one machine.",
            show_default=False,
        ),
    ] = None,
    node_netns: Annotated[
        bool,
        typer.Option(
            "--node-netns",
            help="With --local-nodes: each node gets a network namespace (root only), so "
            "multi-node torchrun jobs run across them over a real (virtual) network.",
        ),
    ] = False,
    scheduler_config: Annotated[
        Path | None,
        typer.Option(
            "--scheduler-config",
            envvar=envvars.SCHEDULER_CONFIG.name,
            help="YAML file of scheduler settings (fair share, reclaim, preemption, backfill), "
            "e.g. 'reclaim_min_run_s: 120'; every setting and its default: docs/scheduling.md.",
            show_default=False,
        ),
    ] = None,
    scheduler_set: Annotated[
        list[str] | None,
        typer.Option(
            "--scheduler",
            help="KEY=VALUE scheduler setting, over --scheduler-config (repeatable), e.g. "
            "--scheduler reclaim_min_run_s=120 --scheduler defragment=false.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the control plane here: REST API, scheduler loop, and the local executor (jobs on
    this machine) or the Kubernetes executor (`--executor kubernetes`: JobSets on a cluster).

    Several replicas may share one PostgreSQL database (and one --home, for the local
    executor's run directories and job-token key): all serve the API, one leads the loop."""
    from tensoryard.cli.k8s import kubernetes_config
    from tensoryard.errors import ConfigError
    from tensoryard.executors.slurm.config import load_slurm_config
    from tensoryard.registry.webhooks import load_webhooks_file
    from tensoryard.scheduler.config import SchedulerConfig, load_scheduler_config
    from tensoryard.server.config import ServerConfig, default_home
    from tensoryard.server.main import run_server

    if executor not in ("local", "kubernetes", "slurm"):
        die(f"--executor {executor!r}: use 'local', 'kubernetes' or 'slurm'")
    if executor != "slurm" and (
        slurm_config is not None or slurm_conf is not None or slurm_rest_url is not None
    ):
        die("--slurm-config/--slurm-conf/--slurm-rest-url: only with --executor slurm")
    if admission != "tensoryard" and executor != "kubernetes":
        die(f"--admission {admission}: only with --executor kubernetes (Kueue runs on a cluster)")
    if autoscaler and executor != "kubernetes":
        die(
            f"--autoscaler: only with --executor kubernetes (the {executor} executor's nodes "
            "are fixed; fix: drop --autoscaler, or run with --executor kubernetes)"
        )
    if admission == "kueue" and (scheduler_config is not None or scheduler_set):
        die(
            "--scheduler/--scheduler-config: with --admission kueue Kueue admits jobs and "
            "tensoryard's scheduler does not run (fix: set Kueue's ClusterQueues, or drop "
            "--admission kueue)"
        )
    with user_errors():
        scheduler = load_scheduler_config(scheduler_config, scheduler_set or ())
        hooks = load_webhooks_file(webhooks) if webhooks is not None else ()
        k8s = kubernetes_config(
            kubeconfig=kubeconfig,
            namespace=namespace,
            default_image=default_image,
            loader_image=loader_image,
            workload=workload,
            admission=admission,
            node_selector=node_selector or [],
            tolerations=toleration or [],
            runs_claim=runs_claim,
            run_as_user=None if run_as_user < 0 else run_as_user,
            switch_label=switch_label,
            block_label=block_label,
            pod_annotations=pod_annotation or [],
            watch=watch,
            keep_finished_s=None if keep_finished < 0 else keep_finished,
            cordon_nodes=cordon_nodes,
            team_volumes=team_volume or [],
            autoscaler=autoscaler,
        )
    try:  # a settings file that cannot be used is bad input (exit 2), like a bad option
        slurm = load_slurm_config(slurm_config, slurm_conf=slurm_conf, rest_url=slurm_rest_url)
    except ConfigError as exc:
        die(str(exc), 2)
    config = ServerConfig(
        executor="slurm"
        if executor == "slurm"
        else "kubernetes"
        if executor == "kubernetes"
        else "local",
        kubernetes=k8s,
        slurm=slurm,
        cancel_grace_s=cancel_grace,
        agent_heartbeat_timeout_s=agent_heartbeat_timeout if executor == "local" else 0.0,
        home=home or default_home(),
        db_url=db_url,
        db_wait_s=db_wait,
        host=host,
        port=port,
        public_url=_public_url(public_url),
        cpu_slots=cpu_slots,
        lease_ttl_s=lease_ttl,
        rate_limit_per_s=rate_limit,
        rate_limit_burst=int(4 * rate_limit),
        artifacts_url=artifacts,
        artifact_gc_grace_s=artifact_gc_grace,
        artifact_gc_interval_s=artifact_gc_interval or None,
        webhooks=hooks,
        webhook_keep_s=webhook_keep_days * 86400 if webhook_keep_days else None,
        local_nodes=tuple(n.strip() for n in (local_nodes or "").split(",") if n.strip()),
        node_netns=node_netns,
        scheduler=scheduler,
    )
    with user_errors():
        console.print(
            f"tensoryard control plane on http://{host}:{port} (state in {config.home}; "
            f"admin token in {config.token_path})",
            highlight=False,
        )
        changed = _changed_settings(scheduler, SchedulerConfig())
        if changed:
            console.print(f"scheduler settings (not the defaults): {changed}", highlight=False)
        run_server(config, log_level=log_level)


def _changed_settings(config: Any, default: Any) -> str:
    """`key=value` for each setting of a dataclass that differs from its default."""
    import dataclasses

    return ", ".join(
        f"{f.name}={getattr(config, f.name)!r}"
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != getattr(default, f.name)
    )


def submit(
    file: Annotated[Path, typer.Argument(help="JobSpec YAML file.", show_default=False)],
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
    wait: Annotated[bool, typer.Option(help="Wait until the job ends.")] = False,
    key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="Repeat-safe submission for scripts: running the command again with the same "
            "key returns the job stored the first time (default: a fresh key per run).",
        ),
    ] = None,
    volume: Annotated[
        list[str] | None,
        typer.Option(
            help="[kubernetes] CLAIM:/PATH[:ro]: mount this PersistentVolumeClaim at PATH in "
            "every pod, beside the spec's `volumes:` (repeatable), e.g. --volume "
            "team-data:/data:ro.",
        ),
    ] = None,
) -> None:
    """Validate a job spec and submit it."""
    with user_errors():
        spec = load_job_spec(file)
        data = spec.model_dump(mode="json")
        if volume:
            data["volumes"] = [*data["volumes"], *(_volume_option(v) for v in volume)]
            spec = parse_job_spec(data, source=f"{file} with --volume")
            data = spec.model_dump(mode="json")
        with client_for(server, token) as client:
            job = client.submit(data, key=key)
            if not wait:
                if json_out:
                    print_json(job)
                else:
                    console.print(f"submitted job [bold]{job['id']}[/] ({job['name']})")
                return
            final = wait_for_job(client, int(job["id"]))
            if json_out:
                print_json(final)
            else:
                console.print(
                    f"job {final['id']} ended: {_state(final['state'])} {escape(final['reason'])}"
                )
            if final["state"] != JobState.SUCCEEDED:
                raise typer.Exit(1)


def _volume_option(value: str) -> dict[str, Any]:
    """`--volume CLAIM:/PATH[:ro]` as a `volumes:` entry (the spec checks the parts)."""
    parts = value.split(":")
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        return {"claim": parts[0], "mount": parts[1], "read_only": parts[2] == "ro"}
    if len(parts) == 2:
        return {"claim": parts[0], "mount": parts[1]}
    raise SpecError(
        [
            FieldIssue(
                "--volume",
                f"{value!r} is not CLAIM:/PATH or CLAIM:/PATH:ro",
                "give the claim's name and where to mount it, like team-data:/data:ro",
            )
        ]
    )


def wait_for_job(client: Any, job_id: int, poll_s: float = 1.0) -> dict[str, Any]:
    """Block with a spinner until the job reaches a terminal state."""
    with console.status(f"waiting for job {job_id}") as status:
        while True:
            job: dict[str, Any] = client.job(job_id)
            status.update(f"job {job_id}: {job['state']} {escape(job['reason'])}")
            if job["state"] in TERMINAL_STATES:
                return job
            time.sleep(poll_s)


def jobs(
    state: Annotated[
        list[str] | None, typer.Option("--state", "-s", help="Filter by state (repeatable).")
    ] = None,
    team: Annotated[str | None, typer.Option(help="Filter by team.")] = None,
    user: Annotated[str | None, typer.Option(help="Filter by user.")] = None,
    limit: Annotated[int, typer.Option(help="Page size.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="Continue from a previous page.")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    with user_errors(), client_for(server, token) as client:
        page = client.jobs(state=state, team=team, user=user, limit=limit, cursor=cursor)
    if json_out:
        print_json(page)
        return
    table = Table(title=f"{page['total']} job(s)", title_justify="left")
    for col in ("ID", "NAME", "TEAM", "USER", "STATE", "RESTARTS", "AGE", "REASON"):
        table.add_column(col, overflow="fold")
    for j in page["items"]:
        reason = j["pending_reason"] if j["state"] == "PENDING" else j["reason"]
        table.add_row(
            str(j["id"]),
            j["name"],
            j["team"],
            j["user"],
            _state(j["state"]),
            str(j["restarts"]),
            ago(j["created_at"]),
            escape(reason),
        )
    console.print(table)
    if page.get("next_cursor"):
        console.print(f"more: tyard jobs --cursor {page['next_cursor']}")


def describe(
    job_id: JobIdArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """State, attempts, events, pending reason and summary of one job."""
    with user_errors(), client_for(server, token) as client:
        job = client.job(job_id)
        attempts = client.attempts(job_id)
        events = client.events(job_id)
        summary = client.summary(job_id)
        checkpoints = client.checkpoints(job_id)
        removed = client.checkpoint_removals(job_id)
    if json_out:
        print_json(
            {
                **job,
                "attempts_detail": attempts,
                "events": events,
                "summary": summary,
                "checkpoints": checkpoints,
                "checkpoints_removed": removed,
                "retention": retention_policy_text(job["spec"].get("checkpoint") or {}),
                "data_wait": _rank_data_wait(job),
            }
        )
        return
    res = job["spec"]["resources"]
    console.print(
        f"[bold]job {job['id']}[/] {job['name']}  {_state(job['state'])}  {escape(job['reason'])}"
    )
    console.print(
        f"team {job['team']}, user {job['user']}, priority {job['priority']}; "
        f"{res['nodes']} node(s) x {res['processes_per_node']} process(es), "
        f"{res['gpus_per_node']} GPU/node; run dir {job['run_dir']}",
        highlight=False,
    )
    megatron_line = _megatron_line(job)
    if megatron_line:
        console.print(megatron_line, highlight=False)
    if job["state"] == "PENDING":
        eta = job["pending_eta"] or "unknown"
        console.print(
            f"[yellow]pending:[/] {escape(job['pending_reason'] or '-')} (estimated start: {eta})"
        )
    if summary.get("steps"):
        console.print(_summary_line(summary), highlight=False)
    for line in _goodput_lines(summary):
        console.print(line, highlight=False)
    console.print(_checkpoint_line(job, checkpoints, removed), highlight=False)
    data_line = data_wait_line(_rank_data_wait(job))
    if data_line:
        console.print(data_line, highlight=False)
    table = Table(title="attempts", title_justify="left")
    for col in ("#", "STATE", "STARTED", "EXIT", "RESUMED FROM", "REASON"):
        table.add_column(col, overflow="fold")
    for a in attempts:
        launch = a.get("launch_attempt")
        table.add_row(
            str(a["number"]) + ("" if launch is None else f" (in place, launch {launch})"),
            a["state"],
            ago(a["started_at"]),
            "" if a["exit_code"] is None else str(a["exit_code"]),
            "" if a["resumed_from_step"] is None else f"step {a['resumed_from_step']}",
            escape(a["reason"]),
        )
    console.print(table)
    etable = Table(title="events", title_justify="left")
    for col in ("TIME", "KIND", "MESSAGE"):
        etable.add_column(col, overflow="fold")
    for e in events[-30:]:
        etable.add_row(e["ts"][11:19], e["kind"], escape(e["message"]))
    console.print(etable)


STALL_SHARE = 0.3
"""The share of a step spent waiting on data above which JobDataLoaderStall fires
(deploy/prometheus/rules/jobs.yml)."""


def _rank_data_wait(job: dict[str, Any]) -> list[dict[str, float]] | None:
    """Each rank's last data-loader wait, from the run directory when this machine can read it
    (the local executor, a shared filesystem); None when it cannot."""
    from tensoryard.runtime.rank_stats import read_rank_stats

    run_dir = Path(str(job.get("run_dir") or ""))
    if not job.get("run_dir") or not (run_dir / "ranks").is_dir():
        return None
    return read_rank_stats(run_dir)


def data_wait_line(rows: list[dict[str, float]] | None, *, shown: int = 4) -> str:
    """``data loader: ...``: the ranks that waited longest for their batch in their last step,
    as a share of the step; "" when there is nothing to show."""
    if not rows:
        return ""
    worst = sorted(rows, key=lambda r: r["data_wait_share"], reverse=True)
    parts = [
        f"rank {int(r['rank'])} {r['data_wait_s']:.3f}s of {r['step_time_s']:.3f}s "
        f"({r['data_wait_share']:.0%})"
        for r in worst[:shown]
    ]
    more = f" and {len(rows) - shown} more" if len(rows) > shown else ""
    stalled = [r for r in rows if r["data_wait_share"] > STALL_SHARE]
    verdict = (
        f"{len(stalled)} rank(s) stalled on data (over {STALL_SHARE:.0%} of the step: "
        "JobDataLoaderStall)"
        if stalled
        else f"no rank over {STALL_SHARE:.0%}"
    )
    return f"data loader wait in the last step: {', '.join(parts)}{more}; {verdict}"


def retention_policy_text(checkpoint: dict[str, Any]) -> str:
    """``keep last 3, best 1 by eval_loss (min), every 1000``: a spec's retention policy."""
    parts = [f"last {checkpoint.get('keep', 3)}"]
    best = checkpoint.get("keep_best")
    if best:
        parts.append(f"best {best.get('count', 1)} by {best['metric']} ({best.get('mode', 'min')})")
    if checkpoint.get("keep_every"):
        parts.append(f"every {checkpoint['keep_every']}")
    return "keep " + ", ".join(parts) + "; never the newest or a registered one"


def _megatron_line(job: dict[str, Any]) -> str:
    """How tensoryard handles a Megatron job (docs/goodput.md); "" for any other job."""
    from tensoryard.runtime.megatron import recognise

    spec = job["spec"]
    framework = str(spec.get("framework") or "auto")
    args = recognise([str(a) for a in spec.get("command") or []], framework)
    if args is None:
        return ""
    how = "framework: megatron" if framework == "megatron" else "recognised from its arguments"
    save = args.save or f"{job['run_dir']}/checkpoints"
    return (
        f"Megatron job ({how}): checkpoints in {save} (committed by "
        "latest_checkpointed_iteration.txt), progress from its training_log lines; a restart "
        "after a checkpoint resumes with --load"
    )


def _checkpoint_line(
    job: dict[str, Any], checkpoints: list[dict[str, Any]], removed: list[dict[str, Any]]
) -> str:
    """The checkpoints kept, the retention policy and what it deleted."""
    steps = ", ".join(str(c["step"]) for c in checkpoints) or "none yet"
    policy = retention_policy_text(job["spec"].get("checkpoint") or {})
    gone = ", ".join(str(r["step"]) for r in removed[-20:])
    more = f"{len(removed) - 20} more and " if len(removed) > 20 else ""
    deleted = f"deleted step {more}{gone}" if removed else "deleted nothing yet"
    latest = ""
    if checkpoints:
        last = max(checkpoints, key=lambda c: (c["step"], c["ts"]))
        facts = [str(last.get("format") or "format unknown")]
        if last.get("size_bytes") is not None:
            facts.append(_human_bytes(int(last["size_bytes"])))
        facts += [f"{k} {v:.4g}" for k, v in sorted((last.get("metrics") or {}).items())[:4]]
        latest = f" (latest {last['step']}: {', '.join(facts)})"
    return f"checkpoints: {steps}{latest}; retention ({policy}): {deleted}"


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _summary_line(summary: dict[str, Any]) -> str:
    parts = [f"steps {summary['steps']}"]
    if summary["initial_loss"] is not None and summary["final_loss"] is not None:
        parts.append(f"loss {summary['initial_loss']:.4f} -> {summary['final_loss']:.4f}")
    parts.append(f"restarts {summary['restarts']}")
    if summary["goodput"] is not None:
        parts.append(f"goodput {summary['goodput']:.1%} ({summary['steps_lost']} step(s) redone)")
    return ", ".join(parts)


_BADPUT = (
    ("startup_s", "startup"),
    ("checkpoint_save_s", "checkpoint save"),
    ("checkpoint_restore_s", "checkpoint restore"),
    ("lost_s", "lost work"),
    ("hang_s", "hang"),
    ("other_s", "other"),
)


def _goodput_lines(summary: dict[str, Any]) -> list[str]:
    """Where the allocated time went, and the Young/Daly checkpoint interval."""
    lines = []
    b = summary.get("breakdown")
    if b and b["allocated_s"] > 0:
        badput = ", ".join(f"{label} {b[key]:.1f}s" for key, label in _BADPUT if b[key] > 0)
        lines.append(
            f"goodput {b['goodput']:.1%} of {b['allocated_s']:.1f}s allocated: productive "
            f"{b['productive_s']:.1f}s; badput: {badput or 'none'}; not allocated: queueing "
            f"{b['queueing_s']:.1f}s, waiting for restart {b['restart_wait_s']:.1f}s"
        )
    advice = summary.get("checkpoint_advice")
    if advice:
        steps = advice["interval_steps"]
        suggested = f"{steps} steps" if steps is not None else "-"
        applied = "applied on restart" if advice["auto"] else "set checkpoint.auto_interval"
        lines.append(
            f"checkpoint interval {advice['current_interval_steps']} steps; Young/Daly "
            f"suggests {suggested} (~{advice['interval_s']:.0f}s) for a {advice['save_s']:.2f}s "
            f"save and MTBF {advice['mtbf_s'] / 3600:.2f}h ({advice['source']}; {applied})"
        )
    return lines


def logs(
    job_id: JobIdArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until it ends.")] = False,
    rank: Annotated[int, typer.Option(help="Which rank's log.")] = 0,
    attempt: Annotated[
        int | None, typer.Option(help="Attempt number (default: latest).", show_default=False)
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print (or follow) the log of one rank of a job."""
    with user_errors(), client_for(server, token) as client:
        if follow:
            for chunk in client.follow_logs(job_id, rank=rank, attempt=attempt):
                typer.echo(chunk, nl=False)
        else:
            text, _ = client.logs(job_id, rank=rank, attempt=attempt)
            typer.echo(text, nl=False)


def cancel(
    job_id: JobIdArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Cancel a job: SIGTERM (time to checkpoint), then SIGKILL after a grace period."""
    with user_errors(), client_for(server, token) as client:
        job = client.cancel(job_id)
    if json_out:
        print_json(job)
    else:
        console.print(f"cancel requested for job {job_id} ({job['state']})")


def resubmit(
    job_id: JobIdArg,
    from_step: Annotated[
        int | None,
        typer.Option(
            "--from-step",
            help="Start from the job's checkpoint of this step (see `tyard describe`); the new "
            "job's first attempt resumes there.",
            min=0,
        ),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Submit a new job with a job's stored spec; you become its user. With --from-step it
    restarts from that checkpoint of the job."""
    with user_errors(), client_for(server, token) as client:
        out = client.resubmit(job_id, checkpoint_step=from_step)
    if json_out:
        print_json(out)
    elif from_step is None:
        console.print(f"job {out['id']} resubmitted from job {job_id}")
    else:
        console.print(
            f"job {out['id']} restarts from job {job_id}'s checkpoint of step {from_step}"
        )


teams_app = typer.Typer(help="Teams (queues) that jobs are submitted to.", no_args_is_help=True)


@teams_app.command("list")
def teams_list(server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False) -> None:
    """List teams."""
    with user_errors(), client_for(server, token) as client:
        teams = client.teams()
    if json_out:
        print_json(teams)
        return
    table = Table()
    for col in ("TEAM", "GPU QUOTA", "DESCRIPTION"):
        table.add_column(col)
    for t in teams:
        quota = "-" if t["gpu_quota"] is None else str(t["gpu_quota"])
        table.add_row(t["name"], quota, t["description"])
    console.print(table)


@teams_app.command("create")
def teams_create(
    name: Annotated[str, typer.Argument(help="Team name.", show_default=False)],
    gpu_quota: Annotated[int | None, typer.Option(help="Nominal GPU quota.")] = None,
    description: Annotated[str, typer.Option(help="Free text.")] = "",
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create a team (idempotent)."""
    with user_errors(), client_for(server, token) as client:
        team = client.create_team(name, gpu_quota=gpu_quota, description=description)
    console.print(f"team {team['name']} ready")


def register(app: typer.Typer) -> None:
    app.command()(server)
    app.command()(submit)
    app.command()(jobs)
    app.command()(describe)
    app.command()(logs)
    app.command()(cancel)
    app.command()(resubmit)
    app.add_typer(teams_app, name="teams")
