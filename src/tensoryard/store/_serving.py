"""Deployments and replica rows: the store's serving half (migration 0009_serving).

A mixin of :class:`tensoryard.store.Store`. A replica row is written (slot, port, state
``starting``) before its process is spawned, so a control plane that dies in between finds the
intent on restart and either re-attaches to the pid or starts the replica again.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from tensoryard.errors import Conflict, NotFound
from tensoryard.store.models import Deployment, DeploymentReplica, Team

__all__ = ["REPLICA_STATES", "DeploymentRecord", "ReplicaRecord", "ServingMixin"]

REPLICA_STATES = ("starting", "ready", "failed", "stopped")


@dataclass(frozen=True)
class DeploymentRecord:
    name: str
    team: str
    model_ref: str
    model_path: str
    engine: str
    replicas: int
    options: dict[str, Any]
    idle_timeout_s: float | None
    created_by: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class ReplicaRecord:
    deployment: str
    slot: int
    port: int
    pid: int | None
    state: str
    restarts: int
    started_at: datetime | None


def _dep(d: Deployment) -> DeploymentRecord:
    return DeploymentRecord(
        name=d.name,
        team=d.team,
        model_ref=d.model_ref,
        model_path=d.model_path,
        engine=d.engine,
        replicas=d.replicas,
        options=dict(d.options),
        idle_timeout_s=d.idle_timeout_s,
        created_by=d.created_by,
        created_at=d.created_at,
        updated_at=d.updated_at,
    )


def _rep(r: DeploymentReplica) -> ReplicaRecord:
    return ReplicaRecord(
        deployment=r.deployment,
        slot=r.slot,
        port=r.port,
        pid=r.pid,
        state=r.state,
        restarts=r.restarts,
        started_at=r.started_at,
    )


class ServingMixin:
    """Deployments and replicas. Needs ``_tx`` and ``_now`` of the Store."""

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

    def create_deployment(
        self,
        name: str,
        *,
        team: str,
        model_ref: str,
        model_path: str,
        engine: str,
        replicas: int,
        options: dict[str, Any],
        idle_timeout_s: float | None,
        created_by: str,
    ) -> DeploymentRecord:
        """Store a new deployment; Conflict if the name is taken, NotFound for a bad team."""
        with self._tx(f"create deployment {name!r}", write=True) as s:
            if s.get(Deployment, name) is not None:
                raise Conflict(
                    f"deployment {name!r} exists already (fix: pick another --name, or "
                    f"`tyard deployments delete {name}` first)"
                )
            if s.get(Team, team) is None:
                raise NotFound(f"team {team!r} does not exist (fix: `tyard teams create {team}`)")
            now = self._now()
            row = Deployment(
                name=name,
                team=team,
                model_ref=model_ref,
                model_path=model_path,
                engine=engine,
                replicas=replicas,
                options=options,
                idle_timeout_s=idle_timeout_s,
                created_by=created_by,
                created_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            return _dep(row)

    def get_deployment(self, name: str) -> DeploymentRecord:
        with self._tx(f"read deployment {name!r}", write=False) as s:
            row = s.get(Deployment, name)
            if row is None:
                raise NotFound(
                    f"deployment {name!r} does not exist (fix: `tyard deployments list`)"
                )
            return _dep(row)

    def list_deployments(self) -> list[DeploymentRecord]:
        with self._tx("list deployments", write=False) as s:
            return [_dep(d) for d in s.scalars(select(Deployment).order_by(Deployment.name))]

    def scale_deployment(self, name: str, replicas: int) -> DeploymentRecord:
        with self._tx(f"scale deployment {name!r}", write=True) as s:
            row = s.get(Deployment, name, with_for_update=True)
            if row is None:
                raise NotFound(
                    f"deployment {name!r} does not exist (fix: `tyard deployments list`)"
                )
            row.replicas = replicas
            row.updated_at = self._now()
            s.flush()
            return _dep(row)

    def update_deployment(
        self,
        name: str,
        *,
        team: str,
        model_ref: str,
        model_path: str,
        engine: str,
        replicas: int,
        options: dict[str, Any],
        idle_timeout_s: float | None,
    ) -> DeploymentRecord:
        """Change what a deployment serves, and forget its replica rows in the same
        transaction: the supervisor replaces the replicas, and nothing reads an old replica's
        ``ready`` as the new model's. Conflict when the deployment belongs to another team."""
        with self._tx(f"update deployment {name!r}", write=True) as s:
            row = s.get(Deployment, name, with_for_update=True)
            if row is None:
                raise NotFound(
                    f"deployment {name!r} does not exist (fix: `tyard deployments list`)"
                )
            if row.team != team:
                raise Conflict(
                    f"deployment {name!r} belongs to team {row.team!r}, not {team!r} (fix: "
                    "give the deployment another name)"
                )
            row.model_ref = model_ref
            row.model_path = model_path
            row.engine = engine
            row.replicas = replicas
            row.options = dict(options)
            row.idle_timeout_s = idle_timeout_s
            row.updated_at = self._now()
            s.execute(delete(DeploymentReplica).where(DeploymentReplica.deployment == name))
            s.flush()
            return _dep(row)

    def delete_deployment(self, name: str) -> None:
        """Delete a deployment and its replica rows in one transaction."""
        with self._tx(f"delete deployment {name!r}", write=True) as s:
            if s.get(Deployment, name) is None:
                raise NotFound(
                    f"deployment {name!r} does not exist (fix: `tyard deployments list`)"
                )
            s.execute(delete(DeploymentReplica).where(DeploymentReplica.deployment == name))
            s.execute(delete(Deployment).where(Deployment.name == name))

    def list_replicas(self, deployment: str | None = None) -> list[ReplicaRecord]:
        with self._tx("list replicas", write=False) as s:
            q = select(DeploymentReplica).order_by(
                DeploymentReplica.deployment, DeploymentReplica.slot
            )
            if deployment is not None:
                q = q.where(DeploymentReplica.deployment == deployment)
            return [_rep(r) for r in s.scalars(q)]

    def put_replica(
        self,
        deployment: str,
        slot: int,
        *,
        port: int,
        state: str,
        pid: int | None = None,
        restarted: bool = False,
    ) -> ReplicaRecord:
        """Create or update a replica row (intent before spawn: pid None, state starting)."""
        if state not in REPLICA_STATES:
            raise ValueError(f"replica state {state!r}")
        with self._tx(f"record replica {deployment}/{slot}", write=True) as s:
            row = s.get(DeploymentReplica, (deployment, slot), with_for_update=True)
            if row is None:
                if s.get(Deployment, deployment) is None:
                    raise NotFound(f"deployment {deployment!r} does not exist")
                row = DeploymentReplica(deployment=deployment, slot=slot, restarts=0)
                s.add(row)
            row.port = port
            row.state = state
            row.pid = pid
            row.restarts = (row.restarts or 0) + (1 if restarted else 0)
            if state == "ready" and row.started_at is None:
                row.started_at = self._now()
            if state == "starting":
                row.started_at = None
            s.flush()
            return _rep(row)

    def remove_replica(self, deployment: str, slot: int) -> None:
        with self._tx(f"remove replica {deployment}/{slot}", write=True) as s:
            s.execute(
                delete(DeploymentReplica).where(
                    DeploymentReplica.deployment == deployment, DeploymentReplica.slot == slot
                )
            )
