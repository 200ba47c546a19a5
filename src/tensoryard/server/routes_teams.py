"""Routes of teams: list, create and update them (quotas), and a team's goodput."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import Depends, FastAPI, Request

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import Guard
from tensoryard.server.schemas import (
    TeamGoodputOut,
    TeamIn,
    TeamOut,
    TeamPatch,
)
from tensoryard.server.summary import team_goodput
from tensoryard.store import Store

__all__ = ["add_team_routes"]


def add_team_routes(app: FastAPI, *, store: Store, guard: Guard, prefix: str) -> None:
    """Register /teams (list, create, update) and /teams/{name}/goodput under `prefix`."""

    @app.get(f"{prefix}/teams", tags=["teams"])
    def teams(request: Request, who: Principal = Depends(guard.user)) -> list[TeamOut]:
        guard.check(request, who, Action.TEAM_READ)
        return [TeamOut.model_validate(t) for t in store.list_teams()]

    @app.get(f"{prefix}/teams/{{name}}/goodput", tags=["teams"])
    def goodput_of_team(
        name: str, request: Request, who: Principal = Depends(guard.user)
    ) -> TeamGoodputOut:
        """The team's goodput and badput breakdown, summed over its jobs (docs/goodput.md)."""
        store.get_team(name)  # NotFound for an unknown team
        guard.check(request, who, Action.JOB_READ, team=name, obj=f"team/{name}")
        return team_goodput(store, name, now=datetime.now(UTC))

    @app.post(f"{prefix}/teams", status_code=201, tags=["teams"])
    def create_team(
        body: TeamIn, request: Request, who: Principal = Depends(guard.user)
    ) -> TeamOut:
        """Create a team (idempotent); platform admins only."""
        guard.check(request, who, Action.TEAM_CREATE, obj=f"team/{body.name}")
        team = store.ensure_team(
            body.name,
            gpu_quota=body.gpu_quota,
            cpu_quota=body.cpu_quota,
            description=body.description,
            audit=guard.context(request, who),
        )
        return TeamOut.model_validate(team)

    @app.patch(f"{prefix}/teams/{{name}}", tags=["teams"])
    def update_team(
        name: str, body: TeamPatch, request: Request, who: Principal = Depends(guard.user)
    ) -> TeamOut:
        """Change a team's quotas or description; platform admins only."""
        guard.check(request, who, Action.TEAM_UPDATE, obj=f"team/{name}")
        changes = {k: getattr(body, k) for k in body.model_fields_set}
        if changes.get("description", "") is None:
            del changes["description"]
        team = store.update_team(name, **changes, audit=guard.context(request, who))
        return TeamOut.model_validate(team)
