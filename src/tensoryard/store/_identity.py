"""Users, team memberships, API tokens and the audit log: the store's identity half.

A mixin of :class:`tensoryard.store.Store` (same transactions, clock and error translation).
API tokens look like ``tyd_<id>_<secret>``: the id finds the row in O(1), and only the sha256
of the whole token is stored. No slow hash is needed: the secret is 256 random bits, so the
hash cannot be reversed by guessing, unlike a password.
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from tensoryard.errors import Conflict, FieldIssue, NotFound, SpecError, Unauthenticated
from tensoryard.store import _inputs as _in
from tensoryard.store import _rows
from tensoryard.store.models import ApiToken, AuditEntry, Membership, Team, User
from tensoryard.store.records import (
    TEAM_ROLES,
    TOKEN_SCOPES,
    AuditContext,
    AuditRecord,
    IssuedToken,
    MemberRecord,
    TokenRecord,
    UserRecord,
)

__all__ = ["USER_PATTERN", "IdentityMixin", "parse_api_token"]

USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$"
TOKEN_PREFIX = "tyd_"
_TOKEN_RE = re.compile(r"^tyd_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
LAST_USED_RESOLUTION = timedelta(seconds=60)  # fewer writes: last_used is a hint, not a log
MAX_AUDIT_PAGE = 10_000
OUTCOMES = ("ok", "denied", "error")


def parse_api_token(token: str) -> str | None:
    """The id of a well-formed user token, else None (a job token, or garbage)."""
    match = _TOKEN_RE.match(token)
    return match.group(1) if match else None


class IdentityMixin:
    """Users, memberships, API tokens, audit log. Needs ``_tx`` and ``_now`` of the Store."""

    # Bumped after every committed change to users, memberships or tokens made through this
    # Store: the API's authentication cache (server/guard.py) drops what it holds when it moves.
    identity_epoch: int = 0

    def _identity_changed(self) -> None:
        self.identity_epoch += 1

    def now(self) -> datetime:
        """The store's clock (timezone-aware UTC): what token expiry is checked against."""
        return self._now()

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

    # -- users -----------------------------------------------------------------------------

    def create_user(
        self,
        name: str,
        *,
        platform_admin: bool = False,
        description: str = "",
        audit: AuditContext | None = None,
    ) -> UserRecord:
        """Create a user; Conflict if the name is taken."""
        _check_user_name(name)
        with self._tx(f"create user {name!r}", write=True) as s:
            if s.get(User, name) is not None:
                raise Conflict(f"user {name!r} exists already")
            s.add(
                User(
                    name=name,
                    created_at=self._now(),
                    platform_admin=platform_admin,
                    description=description,
                )
            )
            role = " as platform admin" if platform_admin else ""
            self._audit(s, audit, "user.create", f"user/{name}", detail=f"created{role}")
            s.flush()
            return _rows.user_record(_get_user(s, name), {})

    def ensure_user(self, name: str, *, platform_admin: bool = False) -> UserRecord:
        """Create the user if absent; make them platform admin if asked (never demotes)."""
        _check_user_name(name)
        with self._tx(f"ensure user {name!r}", write=True) as s:
            user = s.get(User, name, with_for_update=True)
            if user is None:
                user = User(name=name, created_at=self._now(), platform_admin=False, description="")
                s.add(user)
            user.platform_admin = user.platform_admin or platform_admin
            s.flush()
            out = _rows.user_record(user, _teams_of(s, name))
        self._identity_changed()
        return out

    def get_user(self, name: str) -> UserRecord:
        """The user with their team roles, or NotFound."""
        with self._tx(f"read user {name!r}", write=False) as s:
            return _rows.user_record(_get_user(s, name), _teams_of(s, name))

    def list_users(self) -> list[UserRecord]:
        """All users by name, with their team roles."""
        with self._tx("list users", write=False) as s:
            roles: dict[str, dict[str, str]] = {}
            for m in s.scalars(select(Membership)):
                roles.setdefault(m.user_name, {})[m.team] = m.role
            users = s.scalars(select(User).order_by(User.name))
            return [_rows.user_record(u, roles.get(u.name, {})) for u in users]

    # -- memberships -----------------------------------------------------------------------

    def set_member(
        self, team: str, user: str, role: str, *, audit: AuditContext | None = None
    ) -> MemberRecord:
        """Give ``user`` the ``role`` in ``team`` (added, or changed if a member already)."""
        if role not in TEAM_ROLES:
            raise SpecError(
                [
                    FieldIssue(
                        "role", f"unknown role {role!r}", f"use one of: {', '.join(TEAM_ROLES)}"
                    )
                ]
            )
        with self._tx(f"add {user!r} to team {team!r}", write=True) as s:
            _get(s, Team, team, f"team {team!r}")
            _get_user(s, user)
            row = s.get(Membership, (team, user), with_for_update=True)
            if row is None:
                row = Membership(team=team, user_name=user, role=role, created_at=self._now())
                s.add(row)
                detail = f"added as {role}"
            else:
                detail = f"role {row.role} -> {role}"
                row.role = role
            self._audit(s, audit, "team.member.set", f"team/{team}/member/{user}", detail=detail)
            s.flush()
            out = _rows.member_record(row)
        self._identity_changed()
        return out

    def remove_member(self, team: str, user: str, *, audit: AuditContext | None = None) -> None:
        """Take ``user`` out of ``team``; NotFound if they are not a member."""
        with self._tx(f"remove {user!r} from team {team!r}", write=True) as s:
            row = _get(s, Membership, (team, user), f"{user!r} as a member of team {team!r}")
            s.delete(row)
            self._audit(
                s, audit, "team.member.remove", f"team/{team}/member/{user}", detail=row.role
            )
        self._identity_changed()

    def list_members(self, team: str) -> list[MemberRecord]:
        """A team's members by name; NotFound for an unknown team."""
        with self._tx(f"list members of team {team!r}", write=False) as s:
            _get(s, Team, team, f"team {team!r}")
            query = select(Membership).where(Membership.team == team)
            return [_rows.member_record(m) for m in s.scalars(query.order_by(Membership.user_name))]

    # -- API tokens ------------------------------------------------------------------------

    def create_token(
        self,
        user: str,
        *,
        name: str = "",
        scopes: Iterable[str] = TOKEN_SCOPES,
        expires_at: datetime | None = None,
        audit: AuditContext | None = None,
    ) -> IssuedToken:
        """A new token for ``user``; the secret is in the answer only (its hash is stored)."""
        wanted = _check_scopes(scopes)
        if expires_at is not None and _in.as_utc(expires_at) <= self._now():
            raise SpecError(
                [FieldIssue("expires", "the expiry is in the past", "give a future time")]
            )
        token_id = secrets.token_hex(6)
        token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        with self._tx(f"create a token for {user!r}", write=True) as s:
            _get_user(s, user)
            row = ApiToken(
                id=token_id,
                user_name=user,
                token_hash=_in.token_hash(token),
                name=name[:126],
                scopes=list(wanted),
                created_at=self._now(),
                expires_at=None if expires_at is None else _in.as_utc(expires_at),
                revoked_at=None,
                last_used_at=None,
            )
            s.add(row)
            self._audit(
                s,
                audit,
                "token.create",
                f"token/{token_id}",
                detail=f"for {user}, scopes {','.join(wanted)}",
            )
            s.flush()
            return IssuedToken(record=_rows.token_record(row), token=token)

    def authenticate(self, token: str) -> tuple[UserRecord, TokenRecord]:
        """The user and token behind a bearer token; Unauthenticated (saying why) otherwise."""
        token_id = parse_api_token(token)
        if token_id is None:
            raise Unauthenticated("invalid token (fix: pass a token made by `tyard tokens create`)")
        with self._tx("check a token", write=False) as s:
            # The token, its user and the user's teams in one query: every API request
            # starts here, and on PostgreSQL each query is a round trip.
            query = (
                select(ApiToken, User, Membership.team, Membership.role)
                .join(User, User.name == ApiToken.user_name)
                .outerjoin(Membership, Membership.user_name == ApiToken.user_name)
                .where(ApiToken.id == token_id)
            )
            found = s.execute(query).all()
            row = found[0][0] if found else None
            stored = row.token_hash if row is not None else "0" * 64
            # Compare even when absent, so timing does not tell which ids exist.
            if not hmac.compare_digest(stored, _in.token_hash(token)) or row is None:
                raise Unauthenticated("invalid token (unknown or mistyped)")
            now = self._now()
            if row.revoked_at is not None:
                raise Unauthenticated(
                    f"token {token_id} was revoked (fix: create a new one with "
                    "`tyard tokens create`, or ask a platform admin)"
                )
            if row.expires_at is not None and row.expires_at <= now:
                raise Unauthenticated(
                    f"token {token_id} expired at {row.expires_at:%Y-%m-%d %H:%M} UTC "
                    "(fix: create a new one with `tyard tokens create`)"
                )
            teams = {team: role for _, _, team, role in found if team is not None}
            user = _rows.user_record(found[0][1], teams)
            record = _rows.token_record(row)
        if record.last_used_at is None or now - record.last_used_at > LAST_USED_RESOLUTION:
            self._touch_token(token_id, now)
        return user, record

    def _touch_token(self, token_id: str, now: datetime) -> None:
        with self._tx("note a token's use", write=True) as s:
            row = s.get(ApiToken, token_id)
            if row is not None:
                row.last_used_at = now

    def get_token(self, token_id: str) -> TokenRecord:
        """A token's record (never its secret), or NotFound."""
        with self._tx(f"read token {token_id!r}", write=False) as s:
            return _rows.token_record(_get(s, ApiToken, token_id, f"token {token_id!r}"))

    def list_tokens(self, user: str | None = None) -> list[TokenRecord]:
        """Tokens (of one user, or all), oldest first; revoked ones included."""
        query = select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)
        if user is not None:
            query = query.where(ApiToken.user_name == user)
        with self._tx("list tokens", write=False) as s:
            return [_rows.token_record(t) for t in s.scalars(query)]

    def revoke_token(self, token_id: str, *, audit: AuditContext | None = None) -> TokenRecord:
        """Revoke a token at once (idempotent); NotFound if it never existed."""
        with self._tx(f"revoke token {token_id!r}", write=True) as s:
            row = _get(s, ApiToken, token_id, f"token {token_id!r}", lock=True)
            if row.revoked_at is None:
                row.revoked_at = self._now()
            self._audit(s, audit, "token.revoke", f"token/{token_id}", detail=f"of {row.user_name}")
            out = _rows.token_record(row)
        self._identity_changed()
        return out

    # -- audit log -------------------------------------------------------------------------

    def record_audit(
        self,
        audit: AuditContext,
        action: str,
        obj: str,
        *,
        outcome: str = "ok",
        detail: str = "",
    ) -> AuditRecord:
        """Append one line to the audit log on its own (for refusals and read-only actions)."""
        with self._tx(f"audit {action}", write=True) as s:
            row = self._audit(s, audit, action, obj, outcome=outcome, detail=detail)
            assert row is not None
            return _rows.audit_record(row)

    def list_audit(
        self,
        *,
        actor: str | None = None,
        action: str | None = None,
        obj: str | None = None,
        outcome: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after_id: int = 0,
        limit: int = 1000,
    ) -> list[AuditRecord]:
        """Audit lines matching every filter, oldest first. ``action`` and ``obj`` match a
        prefix (``job.`` finds every job action, ``team/nlp`` everything about team nlp)."""
        if not 1 <= limit <= MAX_AUDIT_PAGE:
            raise SpecError(
                [FieldIssue("limit", f"{limit} is out of range", f"use 1 to {MAX_AUDIT_PAGE}")]
            )
        where: list[ColumnElement[bool]] = [AuditEntry.id > after_id]
        if actor is not None:
            where.append(AuditEntry.actor == actor)
        if action is not None:
            where.append(AuditEntry.action.startswith(action, autoescape=True))
        if obj is not None:
            where.append(AuditEntry.object.startswith(obj, autoescape=True))
        if outcome is not None:
            where.append(AuditEntry.outcome == outcome)
        if since is not None:
            where.append(AuditEntry.ts >= _in.as_utc(since))
        if until is not None:
            where.append(AuditEntry.ts < _in.as_utc(until))
        query = select(AuditEntry).where(*where).order_by(AuditEntry.id).limit(limit)
        with self._tx("read the audit log", write=False) as s:
            return [_rows.audit_record(a) for a in s.scalars(query)]

    def iter_audit(self, *, page: int = 1000, **filters: Any) -> Iterator[AuditRecord]:
        """Every matching audit line, oldest first, read a page at a time (for exports)."""
        after = int(filters.pop("after_id", 0))
        while True:
            rows = self.list_audit(after_id=after, limit=page, **filters)
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1].id

    def _audit(
        self,
        s: Session,
        audit: AuditContext | None,
        action: str,
        obj: str,
        *,
        outcome: str = "ok",
        detail: str = "",
    ) -> AuditEntry | None:
        """Insert an audit row in the caller's transaction (nothing without a context)."""
        if audit is None:
            return None
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        row = AuditEntry(
            ts=self._now(),
            actor=audit.actor[:192],
            action=action[:64],
            object=obj[:256],
            outcome=outcome,
            source_ip=audit.source_ip[:64],
            detail=detail,
        )
        s.add(row)
        s.flush()
        return row


# -- helpers ---------------------------------------------------------------------------------


def _get(s: Session, model: Any, key: Any, what: str, *, lock: bool = False) -> Any:
    row = s.get(model, key, with_for_update=lock or None)
    if row is None:
        raise NotFound(f"{what} does not exist")
    return row


def _get_user(s: Session, name: str) -> User:
    row = s.get(User, name)
    if row is None:
        raise NotFound(
            f"user {name!r} does not exist (fix: a platform admin creates it with "
            f"`tyard users create {name}`)"
        )
    return row


def _teams_of(s: Session, user: str) -> dict[str, str]:
    query = select(Membership).where(Membership.user_name == user)
    return {m.team: m.role for m in s.scalars(query)}


def _check_user_name(name: str) -> None:
    if not re.match(USER_PATTERN, name):
        raise SpecError(
            [
                FieldIssue(
                    "name",
                    f"{name!r} is not a valid user name",
                    "use letters, digits and _ . @ - (start with a letter or digit, at most 128)",
                )
            ]
        )


def _check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    wanted = tuple(dict.fromkeys(scopes))
    unknown = [x for x in wanted if x not in TOKEN_SCOPES]
    if unknown or not wanted:
        raise SpecError(
            [
                FieldIssue(
                    "scopes",
                    f"unknown scope(s) {', '.join(unknown)}" if unknown else "no scope given",
                    f"use some of: {', '.join(TOKEN_SCOPES)}",
                )
            ]
        )
    return tuple(x for x in TOKEN_SCOPES if x in wanted)
