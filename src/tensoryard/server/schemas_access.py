"""Wire models of the identity and access routes: users, team members, API tokens, the audit
log."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from tensoryard.server.schemas import FromRecord, Role, Scope
from tensoryard.store._identity import USER_PATTERN
from tensoryard.store.records import AuditRecord, MemberRecord, TokenRecord, UserRecord

__all__ = [
    "AuditOut",
    "MemberIn",
    "MemberOut",
    "TokenCreatedOut",
    "TokenIn",
    "TokenOut",
    "UserCreatedOut",
    "UserIn",
    "UserOut",
]


class UserIn(BaseModel):
    name: str = Field(..., pattern=USER_PATTERN)
    platform_admin: bool = False
    description: str = Field("", max_length=10_000)


class UserOut(FromRecord, record=UserRecord):
    name: str
    created_at: datetime
    platform_admin: bool
    description: str
    teams: dict[str, str] = Field(..., description="team -> role")


class UserCreatedOut(BaseModel):
    user: UserOut
    token: str = Field(..., description="The user's first API token; shown this once.")
    token_id: str


class MemberIn(BaseModel):
    role: Role = "member"


class MemberOut(FromRecord, record=MemberRecord):
    team: str
    user: str
    role: str
    created_at: datetime


class TokenIn(BaseModel):
    name: str = Field("", max_length=126, description="A label, like 'laptop' or 'ci'.")
    scopes: list[Scope] | None = Field(
        None, min_length=1, description="Default: every scope of the token making the call."
    )
    expires_days: int | None = Field(
        90, ge=1, le=3650, description="Days until it expires; null: never."
    )
    user: str | None = Field(
        None, pattern=USER_PATTERN, description="For another user (platform admins only)."
    )


class TokenOut(FromRecord, record=TokenRecord):
    id: str
    user: str
    name: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreatedOut(TokenOut):
    token: str = Field(..., description="The secret; shown this once, only its hash is kept.")


class AuditOut(FromRecord, record=AuditRecord):
    id: int
    ts: datetime
    actor: str
    action: str
    object: str
    outcome: str
    source_ip: str
    detail: str
