"""Routes of nodes and node health: list, cordon, drain, uncordon, history, and the health
report that closes the loop (the node agent or Alertmanager posts its firing alerts).

The API only records the node's new state (and its history line) in one transaction and wakes
the control loop; the loop does the rest (no new placements, checkpoint signal, requeue). So a
crash after the answer loses nothing, and a report sent twice changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import Guard
from tensoryard.api.node_telemetry import HeartbeatIn, NodeTelemetryOut, TelemetryBook
from tensoryard.errors import ExecutorError, FieldIssue, NotFound, SpecError
from tensoryard.observability.health import decide, describe
from tensoryard.server.schemas import FromRecord
from tensoryard.store import Store
from tensoryard.store.records import NodeEventRecord, NodeRecord

__all__ = ["NODE_PATTERN", "add_node_routes"]

NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
NodeName = Annotated[str, Path(pattern=NODE_PATTERN, description="Node name.")]


class NodeOut(FromRecord, record=NodeRecord, added=("schedulable", "condition")):
    name: str
    state: str = Field(description="ready | cordoned (no new placements) | draining")
    reason: str
    created_at: datetime
    changed_at: datetime
    schedulable: bool | None = Field(
        None,
        description="whether the executor's cluster view takes new jobs there now (null: the "
        "node is not in it)",
    )
    condition: str = Field(
        "",
        description="what the cluster says of a node that takes no new jobs (Kubernetes: "
        '"NotReady since 2026-12-06T12:01:03Z (NodeStatusUnknown: ...)", unschedulable, '
        "taints); empty while it is open",
    )
    heartbeat_at: datetime | None = Field(
        None, description="when the node's agent last reported (null: no agent has)"
    )


class NodeEventOut(FromRecord, record=NodeEventRecord):
    id: int
    node: str
    ts: datetime
    kind: str = Field(description="registered | cordon | drain | uncordon")
    actor: str
    message: str


class CordonIn(BaseModel):
    """Why the node is cordoned; `drain` also moves its running jobs off (from a checkpoint)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(..., min_length=1, max_length=1000)
    drain: bool = False


class UncordonIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=1000)


class AlertIn(BaseModel):
    """One alert as Prometheus/Alertmanager sends it (extra fields are ignored)."""

    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    state: str | None = Field(None, description="firing | pending | inactive (Prometheus)")
    status: str | None = Field(None, description="firing | resolved (Alertmanager)")


class AlertsIn(BaseModel):
    """A health report: the node agent's own, or an Alertmanager webhook body."""

    alerts: list[AlertIn] = Field(..., max_length=10_000)


class HealthOut(BaseModel):
    drained: list[NodeOut] = Field(description="nodes this report began to drain")
    unchanged: list[str] = Field(description="nodes already draining for the same reasons")
    unknown_nodes: list[str] = Field(description="nodes the control plane does not place on")
    not_handled: list[str] = Field(
        description="restart_job actions: not carried out from reports yet (the control "
        "plane's own hang detection restarts hung jobs)"
    )


class PreflightCheckIn(BaseModel):
    """One check of a `tyard cluster preflight` report (extra fields are ignored)."""

    name: str = Field(..., max_length=200)
    status: Literal["pass", "fail", "warn", "skip"]
    message: str = Field("", max_length=4000)


class PreflightIn(BaseModel):
    """The JSON report `tyard cluster preflight --report-to control-plane` posts."""

    node: str = Field(..., max_length=253)
    ok: bool
    checks: list[PreflightCheckIn] = Field(default_factory=list, max_length=1000)


class PreflightOut(BaseModel):
    node: NodeOut
    cordoned: bool = Field(description="whether this report cordoned the node")
    failed: list[str] = Field(description="names of the checks that failed")


def add_node_routes(
    app: FastAPI,
    *,
    store: Store,
    guard: Guard,
    prefix: str,
    kick: Callable[[], None],
    capacity: Callable[[], Sequence[Any]] = lambda: (),
    telemetry: TelemetryBook | None = None,
) -> None:
    """Register /nodes and /health/alerts under `prefix`; `capacity` is the executor's cluster
    view (NodeCapacity rows), whose own state of each node `GET /nodes` shows beside ours;
    `telemetry` keeps what the agents' heartbeats carry (shared with the console)."""
    book = telemetry if telemetry is not None else TelemetryBook()

    @app.get(f"{prefix}/nodes", tags=["nodes"])
    def nodes(request: Request, who: Principal = Depends(guard.user)) -> list[NodeOut]:
        """Every node the control plane places jobs on, with its cordon state and the cluster's
        own view of it (Kubernetes: Ready, NotReady since when and why, cordoned, taints)."""
        guard.check(request, who, Action.NODE_READ, obj="node/*")
        try:
            seen = {n.name: n for n in capacity()}
        except ExecutorError:  # the cluster cannot be read now: our own state still answers
            seen = {}
        out = []
        for record in store.list_nodes():
            node = NodeOut.model_validate(record)
            view = seen.get(node.name)
            if view is not None:
                node.schedulable = not view.cordoned
                node.condition = str(getattr(view, "condition", ""))
            out.append(node)
        return out

    @app.get(f"{prefix}/nodes/telemetry", tags=["nodes"])
    def node_telemetry(
        request: Request, who: Principal = Depends(guard.user)
    ) -> list[NodeTelemetryOut]:
        """What each node's agent last sent with its heartbeat: GPU temperatures and XIDs,
        InfiniBand port states and error counters (nodes without an agent are left out)."""
        guard.check(request, who, Action.NODE_READ, obj="node/*")
        return book.all({n.name for n in store.list_nodes()})

    @app.get(f"{prefix}/nodes/{{name}}/history", tags=["nodes"])
    def history(
        name: NodeName,
        request: Request,
        who: Principal = Depends(guard.user),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> list[NodeEventOut]:
        """A node's history, newest first."""
        guard.check(request, who, Action.NODE_READ, obj=f"node/{name}")
        return [NodeEventOut.model_validate(e) for e in store.node_history(name, limit=limit)]

    @app.post(f"{prefix}/nodes/{{name}}/heartbeat", tags=["nodes"])
    def heartbeat(
        name: NodeName,
        request: Request,
        who: Principal = Depends(guard.user),
        body: HeartbeatIn | None = None,
    ) -> NodeOut:
        """The node's agent is alive (`tyard agent` posts this every health interval). With
        the local executor, a node whose agent reported before and then stays silent for the
        server's --agent-heartbeat-timeout is lost: its attempts end and placements leave it
        out until the agent reports again (platform admins: the agents' token). An optional
        body carries the node's telemetry (`GET /nodes/telemetry`)."""
        guard.check(request, who, Action.NODE_MANAGE, obj=f"node/{name}")
        record = store.node_heartbeat(name)
        if body is not None and body.telemetry is not None:
            book.put(name, body.telemetry, record.heartbeat_at or record.changed_at)
        return NodeOut.model_validate(record)

    @app.post(f"{prefix}/nodes/{{name}}/cordon", tags=["nodes"])
    def cordon(
        name: NodeName, body: CordonIn, request: Request, who: Principal = Depends(guard.user)
    ) -> NodeOut:
        """Cordon a node (no new placements); with `drain`, requeue its running jobs from their
        last checkpoint too (platform admins)."""
        guard.check(request, who, Action.NODE_MANAGE, obj=f"node/{name}")
        state = "draining" if body.drain else "cordoned"
        node, changed = store.set_node_state(name, state, reason=body.reason, actor=who.name)
        if changed:
            store.record_audit(
                guard.context(request, who), str(Action.NODE_MANAGE), f"node/{name}", detail=state
            )
            kick()
        return NodeOut.model_validate(node)

    @app.post(f"{prefix}/nodes/{{name}}/uncordon", tags=["nodes"])
    def uncordon(
        name: NodeName, body: UncordonIn, request: Request, who: Principal = Depends(guard.user)
    ) -> NodeOut:
        """Give a node back to the scheduler (platform admins). Never automatic."""
        guard.check(request, who, Action.NODE_MANAGE, obj=f"node/{name}")
        node, changed = store.set_node_state(name, "ready", reason=body.reason, actor=who.name)
        if changed:
            store.record_audit(
                guard.context(request, who), str(Action.NODE_MANAGE), f"node/{name}", detail="ready"
            )
            kick()
        return NodeOut.model_validate(node)

    @app.post(f"{prefix}/nodes/{{name}}/preflight", tags=["nodes"])
    def preflight(
        name: NodeName, body: PreflightIn, request: Request, who: Principal = Depends(guard.user)
    ) -> PreflightOut:
        """Record a node's preflight report in its history; a failed one cordons the node (no
        new placements; running jobs stay). A pass never uncordons: that stays explicit."""
        guard.check(request, who, Action.NODE_MANAGE, obj=f"node/{name}")
        if body.node != name:
            raise SpecError(
                [
                    FieldIssue(
                        "node",
                        f"the report is for node {body.node!r}, posted for {name!r}",
                        "post it to the report's own node",
                    )
                ],
                source="request",
            )
        failed = [c for c in body.checks if c.status == "fail"]
        if body.ok and not failed:
            store.add_node_event(
                name,
                "preflight",
                actor=who.name,
                message=f"preflight passed ({len(body.checks)} checks)",
            )
            return PreflightOut(
                node=NodeOut.model_validate(store.get_node(name)), cordoned=False, failed=[]
            )
        summary = "; ".join(f"{c.name}: {c.message}" for c in failed) or "report not ok"
        reason = f"preflight failed: {summary}"[:1000]
        node, changed = store.set_node_state(name, "cordoned", reason=reason, actor=who.name)
        if changed:
            store.record_audit(
                guard.context(request, who),
                str(Action.NODE_MANAGE),
                f"node/{name}",
                detail="cordoned: preflight failed",
            )
            kick()
        return PreflightOut(
            node=NodeOut.model_validate(node), cordoned=changed, failed=[c.name for c in failed]
        )

    @app.post(f"{prefix}/health/alerts", tags=["nodes"])
    def health_alerts(
        body: AlertsIn, request: Request, who: Principal = Depends(guard.user)
    ) -> HealthOut:
        """Act on firing alerts (`health_action` label): drain_node drains the node named by
        `Hostname` or `instance` (platform admins; the node agent and Alertmanager post here)."""
        guard.check(request, who, Action.NODE_MANAGE, obj="node/*")
        actions = decide(_alert_dicts(body))
        out = HealthOut(drained=[], unchanged=[], unknown_nodes=[], not_handled=[])
        for action in actions:
            if action.kind != "drain_node":
                out.not_handled.append(f"{action.kind} {action.target}: {describe(action.reasons)}")
                continue
            reason = describe(action.reasons)
            try:
                node, changed = store.set_node_state(
                    action.target, "draining", reason=reason, actor=who.name
                )
            except NotFound:
                out.unknown_nodes.append(action.target)
                continue
            if changed:
                out.drained.append(NodeOut.model_validate(node))
                store.record_audit(
                    guard.context(request, who),
                    str(Action.NODE_MANAGE),
                    f"node/{node.name}",
                    detail=f"draining: {reason}",
                )
            else:
                out.unchanged.append(node.name)
        if out.drained:
            kick()
        return out


def _alert_dicts(body: AlertsIn) -> list[dict[str, Any]]:
    return [{"labels": a.labels, "state": a.state or a.status or "firing"} for a in body.alerts]
