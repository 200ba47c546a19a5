"""`tyard k8s render`: the Kubernetes objects the executor would create for a job spec."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from tensoryard import envvars
from tensoryard.cli._common import console, die, user_errors
from tensoryard.errors import FieldIssue, SpecError
from tensoryard.executors.kubernetes.config import KubernetesConfig

__all__ = ["kubernetes_config", "register"]

k8s_app = typer.Typer(
    name="k8s",
    help="The Kubernetes executor: see what it creates for a job.",
    no_args_is_help=True,
)


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise SpecError(
                [FieldIssue(option, f"{value!r} is not KEY=VALUE", f"write it like {option} a=b")],
                source="command line",
            )
        out[key] = val
    return out


_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _toleration(text: str) -> dict[str, str]:
    """`KEY[=VALUE]:EFFECT` as a toleration (Exists without a value, Equal with one)."""
    key_value, _, effect = text.rpartition(":")
    key, eq, value = key_value.partition("=")
    if not key or effect not in _EFFECTS:
        raise SpecError(
            [
                FieldIssue(
                    "--toleration",
                    f"{text!r} is not KEY[=VALUE]:EFFECT",
                    f"write it like --toleration dedicated=training:NoSchedule (EFFECT one of "
                    f"{', '.join(_EFFECTS)})",
                )
            ],
            source="command line",
        )
    if eq:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def kubernetes_config(
    *,
    kubeconfig: Path | None = None,
    namespace: str = "default",
    default_image: str | None = None,
    loader_image: str | None = None,
    workload: str = "auto",
    admission: str = "tensoryard",
    node_selector: list[str] | None = None,
    tolerations: list[str] | None = None,
    runs_claim: str | None = None,
    run_as_user: int | None = 1000,
    switch_label: str = "tensoryard.io/switch",
    block_label: str = "tensoryard.io/block",
    pod_annotations: list[str] | None = None,
    watch: bool = True,
    keep_finished_s: int | None = 3600,
    cordon_nodes: bool = True,
    team_volumes: list[str] | None = None,
    autoscaler: bool = False,
) -> KubernetesConfig:
    """A KubernetesConfig from command-line values (SpecError naming the option)."""
    if workload not in ("auto", "jobset", "job"):
        raise SpecError(
            [
                FieldIssue(
                    "--workload", f"{workload!r} is not a workload kind", "use auto, jobset or job"
                )
            ],
            source="command line",
        )
    if admission not in ("tensoryard", "kueue"):
        raise SpecError(
            [
                FieldIssue(
                    "--admission",
                    f"{admission!r} is not an admission mode",
                    "use tensoryard or kueue",
                )
            ],
            source="command line",
        )
    return KubernetesConfig(
        kubeconfig=kubeconfig,
        namespace=namespace,
        default_image=default_image,
        loader_image=loader_image or KubernetesConfig.loader_image,
        workload=workload,  # type: ignore[arg-type]  # checked above
        admission=admission,  # type: ignore[arg-type]  # checked above
        node_selector=_pairs(node_selector or [], "--node-selector"),
        tolerations=(
            *KubernetesConfig.tolerations,
            *(_toleration(t) for t in tolerations or []),
        ),
        runs_claim=runs_claim,
        run_as_user=run_as_user,
        switch_label=switch_label,
        block_label=block_label,
        pod_annotations=_pairs(pod_annotations or [], "--pod-annotation"),
        watch=watch,
        keep_finished_s=keep_finished_s,
        cordon_nodes=cordon_nodes,
        team_volumes=_team_volumes(team_volumes or []),
        autoscaler=autoscaler,
    )


def _team_volumes(values: list[str]) -> dict[str, tuple[tuple[str, str, bool], ...]]:
    """`--team-volume TEAM=CLAIM:/PATH[:ro]` values, each checked like a job's `volumes:`."""
    from pydantic import ValidationError

    from tensoryard.spec.job import NAME_PATTERN, VolumeSpec, parse_job_spec

    out: dict[str, list[tuple[str, str, bool]]] = {}
    for value in values:
        team, sep, rest = value.partition("=")
        parts = rest.split(":")
        ro = len(parts) == 3 and parts[2] in ("ro", "rw")
        if not sep or not re.match(NAME_PATTERN, team) or not (len(parts) == 2 or ro):
            raise SpecError(
                [
                    FieldIssue(
                        "--team-volume",
                        f"{value!r} is not TEAM=CLAIM:/PATH or TEAM=CLAIM:/PATH:ro",
                        "name the team, the claim and where to mount it, like "
                        "nlp=nlp-data:/data:ro",
                    )
                ],
                source="command line",
            )
        try:
            v = VolumeSpec(claim=parts[0], mount=parts[1], read_only=ro and parts[2] == "ro")
        except ValidationError as exc:
            why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            raise SpecError(
                [FieldIssue("--team-volume", f"{value!r}: {why}", "fix the claim or the path")],
                source="command line",
            ) from None
        out.setdefault(team, []).append((v.claim, v.mount, v.read_only))
    for team, volumes in out.items():  # the same checks as a job's own list (no overlaps)
        spec = [{"claim": c, "mount": m, "read_only": r} for c, m, r in volumes]
        try:
            parse_job_spec({"name": "x", "command": ["x"], "volumes": spec})
        except SpecError as exc:
            why = "; ".join(i.message for i in exc.issues)
            raise SpecError(
                [FieldIssue("--team-volume", f"team {team}: {why}", "give each its own path")],
                source="command line",
            ) from None
    return {team: tuple(v) for team, v in out.items()}


def _dump(objects: list[dict[str, Any]], output: str) -> str:
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2)
    import yaml

    return yaml.safe_dump_all(objects, sort_keys=False).rstrip()


@k8s_app.command()
def render(
    file: Annotated[Path, typer.Argument(help="JobSpec YAML file.", show_default=False)],
    output: Annotated[str, typer.Option("-o", "--output", help="yaml or json.")] = "yaml",
    node: Annotated[
        list[str] | None,
        typer.Option(
            help="A node the placement chose (repeatable; one per spec node). "
            "Default: none, so no node affinity is rendered."
        ),
    ] = None,
    namespace: Annotated[str, typer.Option(help="Namespace of the objects.")] = "default",
    workload: Annotated[
        str, typer.Option(help="jobset or job (Indexed Job + Service).")
    ] = "jobset",
    default_image: Annotated[
        str | None, typer.Option(help="Image when the spec names none.")
    ] = None,
    job_id: Annotated[int, typer.Option(help="Job id to render with.")] = 1,
    attempt: Annotated[int, typer.Option(help="Attempt number to render with.", min=1)] = 1,
) -> None:
    """Print exactly the objects `launch` creates for JOB.yaml (Secret, then JobSet, or Job
    and headless Service), without contacting a cluster. The job token's value, the owner
    references (they need the created owner's uid) and the TYARD_* values that name the
    server are placeholders."""
    from tensoryard.executors.base import LaunchRequest
    from tensoryard.executors.kubernetes.executor import render_attempt, workload_for
    from tensoryard.spec.job import load_job_spec

    if output not in ("yaml", "json"):
        die(f"-o {output!r}: use yaml or json")
    if workload not in ("jobset", "job"):
        die(f"--workload {workload!r}: use jobset or job")
    with user_errors():
        spec = load_job_spec(file)
        config = KubernetesConfig(namespace=namespace, default_image=default_image)
        key = f"j{job_id}-a{attempt}-render"
        request = LaunchRequest(
            job_id=str(job_id),
            attempt=attempt,
            spec=spec,
            run_dir=Path("."),
            env={
                envvars.JOB_ID.name: str(job_id),
                envvars.ATTEMPT.name: str(attempt),
                envvars.SERVER_URL.name: "<the server's report URL>",
                envvars.CHECKPOINT_INTERVAL.name: str(spec.checkpoint.interval),
                envvars.CHECKPOINT_KEEP.name: "0",  # the control plane applies retention
            },
            placement={n: [] for n in node or []},
            attempt_key=key,
        )
        objects = render_attempt(
            workload_for(request, config), "JobSet" if workload == "jobset" else "Job"
        )
    console.print(_dump(objects, output), highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(k8s_app)
