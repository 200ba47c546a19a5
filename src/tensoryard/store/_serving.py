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

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from tensoryard.errors import Conflict, NotFound
from tensoryard.store._rows import RowReader
from tensoryard.store.models import Deployment, DeploymentReplica, ServingUsage, Team

__all__ = [
    "REPLICA_STATES",
    "RETIRING_SLOT",
    "USAGE_GROUPS",
    "DeploymentRecord",
    "ReplicaRecord",
    "ServingMixin",
    "UsageDelta",
    "UsageRow",
]

USAGE_GROUPS = ("team", "user", "deployment", "hour", "day")
"""What `serving_usage` can be summed by (any subset, in any order)."""

REPLICA_STATES = ("starting", "ready", "failed", "stopped", "retiring")
RETIRING_SLOT = 1000
"""Slots from here hold the replicas of what a deployment served before its last update: they
keep answering until the new replicas are ready (a rolling update), then they are stopped."""


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


@dataclass(frozen=True)
class UsageDelta:
    """Tokens to add to one (hour, team, user, deployment) row."""

    hour: datetime
    team: str
    user: str
    deployment: str
    requests: int
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class UsageRow:
    """Usage summed over a group: the keys grouped by are set, the others are None."""

    team: str | None
    user: str | None
    deployment: str | None
    period: datetime | None  # the hour's or day's start, when grouped by hour or day
    requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


_dep = RowReader(DeploymentRecord, Deployment, convert={"options": dict})
_rep = RowReader(ReplicaRecord, DeploymentReplica)


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

    def add_serving_usage(self, deltas: list[UsageDelta]) -> None:
        """Add the deltas to their rows in one transaction (insert or increment: an upsert,
        so control-plane replicas counting into the same row never overwrite each other)."""
        if not deltas:
            return
        with self._tx("record serving usage", write=True) as s:
            dialect = s.get_bind().dialect.name
            if dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert
            else:
                from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
            for d in deltas:
                stmt = insert(ServingUsage).values(
                    hour=d.hour,
                    team=d.team,
                    user_name=d.user,
                    deployment=d.deployment,
                    requests=d.requests,
                    prompt_tokens=d.prompt_tokens,
                    completion_tokens=d.completion_tokens,
                )
                s.execute(
                    stmt.on_conflict_do_update(
                        index_elements=["hour", "team", "user_name", "deployment"],
                        set_={
                            "requests": ServingUsage.requests + stmt.excluded.requests,
                            "prompt_tokens": ServingUsage.prompt_tokens
                            + stmt.excluded.prompt_tokens,
                            "completion_tokens": ServingUsage.completion_tokens
                            + stmt.excluded.completion_tokens,
                        },
                    )
                )

    def serving_usage(
        self,
        *,
        by: tuple[str, ...] = ("team",),
        teams: list[str] | None = None,
        user: str | None = None,
        deployment: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[UsageRow]:
        """Usage summed by `by` (a subset of USAGE_GROUPS), for `teams` (None: every team),
        from the hour containing `since` to the hour before `until`; largest first, or in
        time order when grouped by hour or day."""
        unknown = [b for b in by if b not in USAGE_GROUPS]
        if unknown or len(set(by)) != len(by) or ("hour" in by and "day" in by):
            raise ValueError(f"cannot group usage by {list(by)} (use some of {USAGE_GROUPS})")
        with self._tx("read serving usage", write=False) as s:
            rows = s.execute(_usage_query(by, teams, user, deployment, since, until)).all()
        merged: dict[tuple[Any, ...], list[int]] = {}  # several hours sum into one day
        for row in rows:
            m = row._mapping
            period = m["hour"] if "hour" in by or "day" in by else None
            if period is not None and "day" in by:
                period = period.replace(hour=0)
            key = (m.get("team"), m.get("user_name"), m.get("deployment"), period)
            acc = merged.setdefault(key, [0, 0, 0])
            acc[0] += int(m["requests"] or 0)
            acc[1] += int(m["prompt_tokens"] or 0)
            acc[2] += int(m["completion_tokens"] or 0)
        out = [UsageRow(*key, *counts) for key, counts in merged.items()]
        if "hour" in by or "day" in by:
            out.sort(key=lambda r: (r.period, r.team or "", r.user or "", r.deployment or ""))
        else:
            out.sort(key=lambda r: (-r.total_tokens, r.team or "", r.user or ""))
        return out

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
        """Change what a deployment serves. In the same transaction its replica rows move to
        retiring slots (RETIRING_SLOT + slot, state "retiring"): nothing reads an old replica's
        ``ready`` as the new model's, the old replicas keep answering while the new ones start
        (a rolling update), and a control plane that crashes at any point still finds every old
        process (so none is left running). Rows already retiring from an earlier update stay.
        Conflict when the deployment belongs to another team."""
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
            current = s.scalars(
                select(DeploymentReplica).where(
                    DeploymentReplica.deployment == name,
                    DeploymentReplica.slot < RETIRING_SLOT,
                )
            ).all()
            for rep in current:
                if rep.pid is None or rep.state != "ready":
                    s.delete(rep)  # not serving anyone: nothing to hand over
                    continue
                old = s.get(DeploymentReplica, (name, RETIRING_SLOT + rep.slot))
                if old is not None:
                    s.delete(old)  # the supervisor stops its process (it has no row now)
                    s.flush()
                rep.slot = RETIRING_SLOT + rep.slot
                rep.state = "retiring"
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


def _usage_query(
    by: tuple[str, ...],
    teams: list[str] | None,
    user: str | None,
    deployment: str | None,
    since: datetime | None,
    until: datetime | None,
) -> Any:
    """SUM over serving_usage grouped by the stored columns `by` asks for (a day is summed
    from its hours in Python: date truncation differs between SQLite and PostgreSQL)."""
    columns: list[Any] = []
    if "team" in by:
        columns.append(ServingUsage.team)
    if "user" in by:
        columns.append(ServingUsage.user_name)
    if "deployment" in by:
        columns.append(ServingUsage.deployment)
    if "hour" in by or "day" in by:
        columns.append(ServingUsage.hour)
    query = select(
        *columns,
        func.sum(ServingUsage.requests).label("requests"),
        func.sum(ServingUsage.prompt_tokens).label("prompt_tokens"),
        func.sum(ServingUsage.completion_tokens).label("completion_tokens"),
    )
    if teams is not None:
        query = query.where(ServingUsage.team.in_(teams))
    if user is not None:
        query = query.where(ServingUsage.user_name == user)
    if deployment is not None:
        query = query.where(ServingUsage.deployment == deployment)
    if since is not None:
        query = query.where(ServingUsage.hour >= since.replace(minute=0, second=0, microsecond=0))
    if until is not None:
        query = query.where(ServingUsage.hour < until)
    return query.group_by(*columns) if columns else query
