"""REST routes for deployments: ``/api/v1/deployments`` (create, list, describe, scale, delete).

Creating a deployment stores its row (validated, the model resolved to a file) and wakes the
supervisor, which starts the replicas; the answer does not wait for them (``describe`` shows
their states). Members of the deployment's team may create, scale and delete it; any role in
the team may read it and call it through the gateway.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import Guard
from tensoryard.errors import FieldIssue, SpecError
from tensoryard.serving.deploy import check_engine, model_path_for
from tensoryard.serving.engine import ENGINES
from tensoryard.serving.gateway_stats import GatewayOut, GatewayStats
from tensoryard.serving.gpu_engines import GPU_ENGINES
from tensoryard.serving.replicas import ReplicaManager, on_kubernetes
from tensoryard.serving.source import parse_model_source
from tensoryard.serving.usage import UsageRecorder
from tensoryard.serving.weights import RegistryWeights
from tensoryard.spec.deployment import DEPLOYMENT_NAME_PATTERN, DeploymentSpec
from tensoryard.store import USAGE_GROUPS, Store

__all__ = ["DeploymentIn", "DeploymentOut", "add_deployment_routes", "add_usage_routes"]

API = "/api/v1/deployments"
NAME_PATTERN = DEPLOYMENT_NAME_PATTERN
Name = Annotated[str, Path(pattern=NAME_PATTERN, description="Deployment name.")]


class DeploymentIn(DeploymentSpec):
    """The request body: a DeploymentSpec and the team that owns the deployment."""

    team: str = "default"


class ScaleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(ge=0, le=64)


class ReplicaOut(BaseModel):
    slot: int
    port: int
    pid: int | None
    state: str
    restarts: int
    in_flight: int
    started_at: datetime | None
    pod: str | None = Field(None, description="Kubernetes: the (leader) pod serving it.")
    node: str | None = Field(None, description="Kubernetes: the node the pod runs on.")
    address: str | None = Field(None, description="Kubernetes: the pod IP the gateway calls.")
    weights_pull_s: float | None = Field(
        None, description="Kubernetes: seconds the init container took to pull the weights."
    )
    load_s: float | None = Field(
        None, description="Kubernetes: seconds from the engine's start to its readiness."
    )
    message: str = Field("", description="Why it is not ready, when it is not.")


class DeploymentOut(BaseModel):
    name: str
    team: str
    model: str
    model_path: str
    engine: str
    replicas: int
    ready_replicas: int
    options: dict[str, Any] = Field(
        json_schema_extra={"x-not-secret": "engine settings (context size, cache, autoscale)"}
    )
    idle_timeout_s: float | None
    autoscale: dict[str, Any] | None = Field(
        None,
        description="The autoscaling settings (also under options), or null.",
        json_schema_extra={"x-not-secret": "autoscaling settings"},
    )
    desired_replicas: int = Field(description="What the supervisor aims for now.")
    autoscale_reason: str = Field("", description="Why the last autoscaling change was made.")
    created_by: str
    created_at: datetime
    updated_at: datetime
    replica_states: list[ReplicaOut]
    error: str = Field("", description="Why the supervisor cannot run it right now, if so.")


def add_deployment_routes(
    app: FastAPI,
    *,
    store: Store,
    guard: Guard,
    manager: ReplicaManager,
    weights: RegistryWeights,
    gateway: GatewayStats | None = None,
) -> None:
    def out(name: str) -> DeploymentOut:
        d = store.get_deployment(name)
        live = {r.slot: r for r in manager.replicas(name)}
        if not on_kubernetes(d):  # replica processes, as their rows say
            reps = [
                ReplicaOut(
                    slot=r.slot,
                    port=r.port,
                    pid=r.pid,
                    state=r.state,
                    restarts=r.restarts,
                    in_flight=live[r.slot].in_flight if r.slot in live else 0,
                    started_at=r.started_at,
                )
                for r in store.list_replicas(name)
            ]
        else:  # pods, as the supervisor last listed them (they have no rows)
            reps = [
                ReplicaOut(
                    slot=r.slot,
                    port=r.port,
                    pid=None,
                    state="ready" if r.ready else "starting",
                    restarts=r.restarts,
                    in_flight=r.in_flight,
                    started_at=None,
                    pod=r.pod.name,
                    node=r.pod.node,
                    address=r.pod.ip,
                    weights_pull_s=r.pod.pull_s,
                    load_s=r.pod.load_s,
                    message=r.pod.message,
                )
                for r in sorted(live.values(), key=lambda r: r.slot)
                if r.pod is not None
            ]
        target, reason = manager.target(name, d)
        return DeploymentOut(
            name=d.name,
            team=d.team,
            model=d.model_ref,
            model_path=d.model_path,
            engine=d.engine,
            replicas=d.replicas,
            ready_replicas=sum(1 for r in reps if r.state == "ready"),
            options=d.options,
            idle_timeout_s=d.idle_timeout_s,
            autoscale=d.options.get("autoscale"),
            desired_replicas=target,
            autoscale_reason=reason,
            created_by=d.created_by,
            created_at=d.created_at,
            updated_at=d.updated_at,
            replica_states=reps,
            error=manager.error(name),
        )

    def readable(request: Request, who: Principal, name: str, action: Action) -> None:
        d = store.get_deployment(name)
        guard.check(request, who, action, team=d.team, obj=f"deployment/{name}")

    @app.post(API, status_code=201, tags=["serving"])
    def create(
        body: DeploymentIn, request: Request, who: Principal = Depends(guard.user)
    ) -> DeploymentOut:
        """Create a deployment; its replicas start in the background."""
        check_engine(body.engine, body.options, kubernetes=manager.kube is not None)
        source = parse_model_source(body.model)
        guard.check(request, who, Action.JOB_SUBMIT, team=body.team, obj=f"team/{body.team}")
        ref, path = source.ref, str(source.path or "")
        if body.engine in GPU_ENGINES:
            # a path or hub id is what the pod's engine loads; a registry version is pulled
            # from the artifact store by the pod's init container
            path = body.model
            if source.name is not None:
                version = weights.version(body.team, source)
                ref = f"{source.ref} (version {version.version})"
                path = model_path_for(body.engine, version.artifact)
        elif body.engine == "llama.cpp":
            resolved = weights.resolve(body.team, source)  # pulls a registry version once
            ref, path = resolved.ref, str(resolved.path)
        elif source.name is not None and body.engine in ENGINES:
            # pinned to the version served, as for llama.cpp: an alias can move (the mock
            # test engine serves any name and loads nothing)
            ref = f"{source.ref} (version {weights.version(body.team, source).version})"
        name = body.name or source.default_name()
        store.create_deployment(
            name,
            team=body.team,
            model_ref=ref,
            model_path=path,
            engine=body.engine,
            replicas=body.replicas,
            options=body.stored_options(),
            idle_timeout_s=body.idle_timeout_s,
            created_by=who.name,
        )
        store.record_audit(guard.context(request, who), "deployment.create", f"deployment/{name}")
        manager.kick()
        return out(name)

    @app.get(API, tags=["serving"])
    def list_(request: Request, who: Principal = Depends(guard.user)) -> list[DeploymentOut]:
        teams = who.visible_teams()
        return [out(d.name) for d in store.list_deployments() if teams is None or d.team in teams]

    @app.get(f"{API}/{{name}}", tags=["serving"])
    def describe(
        name: Name, request: Request, who: Principal = Depends(guard.user)
    ) -> DeploymentOut:
        readable(request, who, name, Action.JOB_READ)
        return out(name)

    if gateway is not None:
        stats = gateway

        @app.get(f"{API}/{{name}}/gateway", tags=["serving"])
        def gateway_numbers(
            name: Name, request: Request, who: Principal = Depends(guard.user)
        ) -> GatewayOut:
            """Requests, errors, TTFT (p50/p90) and completion tokens of the deployment at
            this control plane's gateway: since it started, and as rates over the last minute
            of readings (`window`, null on the first reading)."""
            readable(request, who, name, Action.JOB_READ)
            return stats.read(name)

    @app.post(f"{API}/{{name}}/scale", tags=["serving"])
    def scale(
        name: Name, body: ScaleIn, request: Request, who: Principal = Depends(guard.user)
    ) -> DeploymentOut:
        readable(request, who, name, Action.JOB_SUBMIT)
        auto = store.get_deployment(name).options.get("autoscale")
        if auto and body.replicas > int(auto["max_replicas"]):
            raise SpecError(
                [
                    FieldIssue(
                        "replicas",
                        f"{body.replicas} is above autoscale.max_replicas "
                        f"({auto['max_replicas']}); with autoscaling, replicas is the minimum",
                        "scale to at most max_replicas, or recreate the deployment with a "
                        "higher autoscale.max_replicas",
                    )
                ]
            )
        store.scale_deployment(name, body.replicas)
        store.record_audit(
            guard.context(request, who),
            "deployment.scale",
            f"deployment/{name}",
            detail=f"replicas={body.replicas}",
        )
        manager.kick()
        return out(name)

    @app.delete(f"{API}/{{name}}", status_code=204, tags=["serving"])
    def delete(name: Name, request: Request, who: Principal = Depends(guard.user)) -> None:
        readable(request, who, name, Action.JOB_SUBMIT)
        store.delete_deployment(name)
        store.record_audit(guard.context(request, who), "deployment.delete", f"deployment/{name}")
        manager.kick()


# -- usage ------------------------------------------------------------------------------------

USAGE_API = "/api/v1/usage"
_RELATIVE = re.compile(r"^(\d{1,5})([hdw])$")


class UsageRowOut(BaseModel):
    team: str | None = None
    user: str | None = None
    deployment: str | None = None
    period: datetime | None = Field(None, description="The hour's or day's start (UTC).")
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageOut(BaseModel):
    since: datetime
    until: datetime | None
    by: list[str]
    rows: list[UsageRowOut]
    total: UsageRowOut


def parse_when(value: str | None, field: str, now: datetime) -> datetime | None:
    """An ISO time (UTC when it has no zone) or a span back from now: 24h, 7d, 2w."""
    if value is None or value == "":
        return None
    match = _RELATIVE.match(value.strip())
    if match:
        n, unit = int(match.group(1)), match.group(2)
        return now - timedelta(hours=n * {"h": 1, "d": 24, "w": 24 * 7}[unit])
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise SpecError(
            [
                FieldIssue(
                    field,
                    f"{value!r} is neither a time nor a span",
                    "use an ISO time like 2026-12-01T00:00 (UTC) or a span back from now "
                    "like 24h, 7d or 2w",
                )
            ]
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def parse_by(value: str) -> tuple[str, ...]:
    by = tuple(part.strip() for part in value.split(",") if part.strip())
    bad = [b for b in by if b not in USAGE_GROUPS]
    if not by or bad or len(set(by)) != len(by) or ("hour" in by and "day" in by):
        raise SpecError(
            [
                FieldIssue(
                    "by",
                    f"cannot group usage by {value!r}",
                    f"use a comma-separated subset of {', '.join(USAGE_GROUPS)} "
                    "(hour or day, not both), like by=team,deployment",
                )
            ]
        )
    return by


def add_usage_routes(
    app: FastAPI, *, store: Store, guard: Guard, usage: UsageRecorder | None = None
) -> None:
    @app.get(USAGE_API, tags=["serving"])
    def usage_(
        request: Request,
        who: Principal = Depends(guard.user),
        by: Annotated[
            str, Query(max_length=64, description="Group by: team, user, deployment, hour, day.")
        ] = "team",
        team: Annotated[str | None, Query(max_length=63)] = None,
        user: Annotated[str | None, Query(max_length=128)] = None,
        deployment: Annotated[str | None, Query(max_length=63)] = None,
        since: Annotated[
            str | None, Query(max_length=40, description="ISO time or span (24h, 7d); 30d.")
        ] = None,
        until: Annotated[str | None, Query(max_length=40)] = None,
    ) -> UsageOut:
        """Gateway usage in tokens, summed by `by`; members see their teams' usage, platform
        admins every team's. Counts reach the database within 2 s of the answer."""
        groups = parse_by(by)
        now = datetime.now(UTC)
        start = parse_when(since, "since", now) or now - timedelta(days=30)
        end = parse_when(until, "until", now)
        if team is not None:
            guard.check(request, who, Action.JOB_READ, team=team, obj=f"team/{team}")
            teams: list[str] | None = [team]
        else:
            teams = who.visible_teams()
        if usage is not None:
            usage.flush()  # this replica's latest counts
        rows = store.serving_usage(
            by=groups, teams=teams, user=user, deployment=deployment, since=start, until=end
        )
        out = [UsageRowOut.model_validate(r, from_attributes=True) for r in rows]
        total = UsageRowOut(
            requests=sum(r.requests for r in rows),
            prompt_tokens=sum(r.prompt_tokens for r in rows),
            completion_tokens=sum(r.completion_tokens for r in rows),
            total_tokens=sum(r.total_tokens for r in rows),
        )
        return UsageOut(since=start, until=end, by=list(groups), rows=out, total=total)
