"""Routes of team secrets: names are listed, values are only ever written (never read back)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Path, Request
from pydantic import BaseModel, Field

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import Guard
from tensoryard.server.secrets import MAX_SECRET_BYTES, SecretStore
from tensoryard.spec.job import NAME_PATTERN
from tensoryard.store import Store

__all__ = ["add_secret_routes"]

TeamName = Annotated[str, Path(pattern=NAME_PATTERN, description="Team name.")]
SecretName = Annotated[str, Path(pattern=NAME_PATTERN, description="Secret name.")]


class SecretIn(BaseModel):
    """A secret's value (stored, injected into jobs that reference it, never shown again)."""

    value: str = Field(..., min_length=1, max_length=MAX_SECRET_BYTES)


def add_secret_routes(
    app: FastAPI, *, store: Store, guard: Guard, secrets: SecretStore, prefix: str
) -> None:
    """Register /teams/{team}/secrets under `prefix`."""

    @app.get(f"{prefix}/teams/{{team}}/secrets", tags=["secrets"])
    def secret_names(
        team: TeamName, request: Request, who: Principal = Depends(guard.user)
    ) -> list[str]:
        """The names of a team's secrets (members of the team)."""
        store.get_team(team)
        guard.check(request, who, Action.SECRET_READ, team=team, obj=f"team/{team}/secrets")
        return secrets.names(team)

    @app.put(f"{prefix}/teams/{{team}}/secrets/{{name}}", status_code=204, tags=["secrets"])
    def set_secret(
        team: TeamName,
        name: SecretName,
        body: SecretIn,
        request: Request,
        who: Principal = Depends(guard.user),
    ) -> None:
        """Create or replace a secret (team-admins of the team)."""
        store.get_team(team)
        obj = f"team/{team}/secret/{name}"
        guard.check(request, who, Action.SECRET_MANAGE, team=team, obj=obj)
        secrets.put(team, name, body.value)
        store.record_audit(guard.context(request, who), str(Action.SECRET_MANAGE), obj)

    @app.delete(f"{prefix}/teams/{{team}}/secrets/{{name}}", status_code=204, tags=["secrets"])
    def delete_secret(
        team: TeamName, name: SecretName, request: Request, who: Principal = Depends(guard.user)
    ) -> None:
        """Delete a secret (team-admins of the team)."""
        store.get_team(team)
        obj = f"team/{team}/secret/{name}"
        guard.check(request, who, Action.SECRET_MANAGE, team=team, obj=obj)
        secrets.delete(team, name)
        store.record_audit(
            guard.context(request, who), str(Action.SECRET_MANAGE), obj, detail="deleted"
        )
