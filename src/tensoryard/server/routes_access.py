"""Routes of identity and access: users, team members, API tokens, the audit log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.responses import StreamingResponse

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import INT32, Guard
from tensoryard.errors import Forbidden, NotFound
from tensoryard.server.schemas_access import (
    AuditOut,
    MemberIn,
    MemberOut,
    TokenCreatedOut,
    TokenIn,
    TokenOut,
    UserCreatedOut,
    UserIn,
    UserOut,
)
from tensoryard.spec.job import NAME_PATTERN
from tensoryard.store import AuditRecord, Store, utcnow
from tensoryard.store._identity import USER_PATTERN

__all__ = ["add_access_routes"]

TeamName = Annotated[str, Path(pattern=NAME_PATTERN, description="Team name.")]
UserName = Annotated[str, Path(pattern=USER_PATTERN, description="User name.")]
TokenId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$", description="Token id.")]


def add_access_routes(app: FastAPI, *, store: Store, guard: Guard, prefix: str) -> None:
    """Register /users, /teams/{team}/members, /tokens and /audit under `prefix`."""
    # ---- users --------------------------------------------------------------------------------

    @app.get(f"{prefix}/users/me", tags=["access"])
    def me(who: Principal = Depends(guard.user)) -> UserOut:
        """You: your platform-admin flag and your role in each team (any valid token)."""
        return UserOut.model_validate(store.get_user(who.name))

    @app.get(f"{prefix}/users", tags=["access"])
    def users(request: Request, who: Principal = Depends(guard.user)) -> list[UserOut]:
        """Every user; platform admins only."""
        guard.check(request, who, Action.USER_READ, obj="user/*")
        return [UserOut.model_validate(u) for u in store.list_users()]

    @app.post(f"{prefix}/users", status_code=201, tags=["access"])
    def create_user(
        body: UserIn, request: Request, who: Principal = Depends(guard.user)
    ) -> UserCreatedOut:
        """Create a user and their first API token (shown once); platform admins only."""
        guard.check(request, who, Action.USER_CREATE, obj=f"user/{body.name}")
        ctx = guard.context(request, who)
        user = store.create_user(
            body.name, platform_admin=body.platform_admin, description=body.description, audit=ctx
        )
        issued = store.create_token(
            user.name, name="first token", expires_at=utcnow() + timedelta(days=90), audit=ctx
        )
        return UserCreatedOut(
            user=UserOut.model_validate(user), token=issued.token, token_id=issued.record.id
        )

    # ---- team members -------------------------------------------------------------------------

    @app.get(f"{prefix}/teams/{{team}}/members", tags=["access"])
    def members(
        team: TeamName, request: Request, who: Principal = Depends(guard.user)
    ) -> list[MemberOut]:
        """A team's members and roles; anyone in the team (viewer or more)."""
        guard.check(request, who, Action.MEMBER_READ, team=team, obj=f"team/{team}")
        return [MemberOut.model_validate(m) for m in store.list_members(team)]

    @app.put(f"{prefix}/teams/{{team}}/members/{{user}}", tags=["access"])
    def set_member(
        team: TeamName,
        user: UserName,
        body: MemberIn,
        request: Request,
        who: Principal = Depends(guard.user),
    ) -> MemberOut:
        """Add a user to a team or change their role; the team's team-admins and platform
        admins."""
        guard.check(request, who, Action.MEMBER_MANAGE, team=team, obj=f"team/{team}/member/{user}")
        member = store.set_member(team, user, body.role, audit=guard.context(request, who))
        return MemberOut.model_validate(member)

    @app.delete(f"{prefix}/teams/{{team}}/members/{{user}}", tags=["access"])
    def remove_member(
        team: TeamName, user: UserName, request: Request, who: Principal = Depends(guard.user)
    ) -> dict[str, bool]:
        """Take a user out of a team; the team's team-admins and platform admins."""
        guard.check(request, who, Action.MEMBER_MANAGE, team=team, obj=f"team/{team}/member/{user}")
        store.remove_member(team, user, audit=guard.context(request, who))
        return {"ok": True}

    # ---- tokens -------------------------------------------------------------------------------

    @app.get(f"{prefix}/tokens", tags=["access"])
    def tokens(
        request: Request,
        who: Principal = Depends(guard.user),
        user: Annotated[str | None, Query(pattern=USER_PATTERN)] = None,
        all_users: Annotated[bool, Query(alias="all")] = False,
    ) -> list[TokenOut]:
        """Your tokens (never their secrets); another user's or everyone's for platform
        admins."""
        if all_users or (user is not None and user != who.name):
            guard.check(request, who, Action.TOKEN_MANAGE_ANY, obj=f"user/{user or '*'}")
            rows = store.list_tokens(None if all_users else user)
        else:
            guard.check(request, who, Action.TOKEN_READ_OWN, obj=f"user/{who.name}")
            rows = store.list_tokens(who.name)
        return [TokenOut.model_validate(t) for t in rows]

    @app.post(f"{prefix}/tokens", status_code=201, tags=["access"])
    def create_token(
        body: TokenIn, request: Request, who: Principal = Depends(guard.user)
    ) -> TokenCreatedOut:
        """A new token for you (scopes at most those of the token you call with), or for
        another user (platform admins). The secret is in this answer only."""
        owner = body.user or who.name
        if owner != who.name:
            guard.check(request, who, Action.TOKEN_MANAGE_ANY, obj=f"user/{owner}")
        else:
            guard.check(request, who, Action.TOKEN_MANAGE_OWN, obj=f"user/{owner}")
        scopes = list(body.scopes) if body.scopes else sorted(who.scopes)
        extra = sorted(set(scopes) - who.scopes)
        if extra:
            raise Forbidden(
                f"a token cannot grant more than itself: yours lacks {', '.join(extra)} "
                "(fix: ask for fewer scopes, or call with a token that has them)"
            )
        expires = None if body.expires_days is None else utcnow() + timedelta(body.expires_days)
        issued = store.create_token(
            owner,
            name=body.name,
            scopes=scopes,
            expires_at=expires,
            audit=guard.context(request, who),
        )
        out = TokenOut.model_validate(issued.record)
        return TokenCreatedOut(**out.model_dump(), token=issued.token)

    @app.delete(f"{prefix}/tokens/{{token_id}}", tags=["access"])
    def revoke_token(
        token_id: TokenId, request: Request, who: Principal = Depends(guard.user)
    ) -> TokenOut:
        """Revoke a token at once: your own, or anyone's for platform admins."""
        try:
            record = store.get_token(token_id)
        except NotFound:
            record = None
        if record is None or record.user != who.name:
            guard.check(request, who, Action.TOKEN_MANAGE_ANY, obj=f"token/{token_id}")
        else:
            guard.check(request, who, Action.TOKEN_MANAGE_OWN, obj=f"token/{token_id}")
        revoked = store.revoke_token(token_id, audit=guard.context(request, who))
        return TokenOut.model_validate(revoked)

    # ---- audit --------------------------------------------------------------------------------

    def audit_filters(
        actor: Annotated[str | None, Query(max_length=192)] = None,
        action: Annotated[str | None, Query(max_length=64, description="Prefix: job. ...")] = None,
        object: Annotated[
            str | None, Query(max_length=256, description="Prefix, like team/nlp.")
        ] = None,
        outcome: Annotated[str | None, Query(pattern="^(ok|denied|error)$")] = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> dict[str, object]:
        return {
            "actor": actor,
            "action": action,
            "obj": object,
            "outcome": outcome,
            "since": since,
            "until": until,
        }

    @app.get(f"{prefix}/audit", tags=["access"])
    def audit(
        request: Request,
        who: Principal = Depends(guard.user),
        filters: dict[str, object] = Depends(audit_filters),
        after_id: Annotated[int, Query(ge=0, le=INT32)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[AuditOut]:
        """Audit lines oldest first (page with after_id); platform admins only."""
        guard.check(request, who, Action.AUDIT_READ, obj="audit")
        rows = store.list_audit(after_id=after_id, limit=limit, **filters)  # type: ignore[arg-type]
        return [AuditOut.model_validate(a) for a in rows]

    @app.get(
        f"{prefix}/audit/export",
        tags=["access"],
        response_model=None,
        responses={200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}}}},
    )
    def audit_export(
        request: Request,
        who: Principal = Depends(guard.user),
        filters: dict[str, object] = Depends(audit_filters),
    ) -> StreamingResponse:
        """Every matching audit line as JSON lines; platform admins only."""
        guard.check(request, who, Action.AUDIT_READ, obj="audit")
        rows = store.iter_audit(**filters)  # type: ignore[arg-type]
        return StreamingResponse(_json_lines(rows), media_type="application/x-ndjson")


def _json_lines(rows: Iterator[AuditRecord]) -> Iterator[bytes]:
    for row in rows:
        data = asdict(row)
        data["ts"] = row.ts.isoformat()
        yield (json.dumps(data) + "\n").encode()
