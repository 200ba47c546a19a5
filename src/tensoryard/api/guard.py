"""The API's door: bearer token -> rate limit -> principal, and checks that audit refusals.

Every route except the public ones (``/healthz``, the OpenAPI document and its pages) depends
on :meth:`Guard.user` or, for the report endpoint, :meth:`Guard.reporter`. Both declare the
``HTTPBearer`` security scheme, so the OpenAPI document shows which routes need a token.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tensoryard.api.access import Action, Principal, authorize, principal_of
from tensoryard.api.limits import RateLimiter
from tensoryard.errors import Forbidden, Unauthenticated
from tensoryard.store import AuditContext, Store
from tensoryard.store._identity import parse_api_token

__all__ = ["INT32", "Guard", "JobId", "Reporter"]

INT32 = 2**31 - 1
JobId = Annotated[int, Path(ge=1, le=INT32, description="Job id.")]

_bearer_scheme = HTTPBearer(auto_error=False, description="An API token, or a job's token.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer_scheme)]

AUTH_CACHE_S = 2.0
"""How long a token's principal is reused without reading the database. A revoked token, or a
changed membership, takes effect at once on the control plane that made the change (its
store's identity epoch moves) and within this long on the others."""
_AUTH_CACHE_MAX = 10_000

MISSING = "missing bearer token (fix: run `tyard login`, set TYARD_TOKEN or pass --token)"


@dataclass(frozen=True)
class Reporter:
    """Who may post a report for a job: its job token (for one attempt), or a platform admin."""

    job_id: int
    attempt: int | None  # None: any attempt (a platform admin, or a token from before 0002)
    principal: Principal | None  # set for a platform admin's user token


class Guard:
    """Resolves tokens to principals (with a per-token rate limit) and checks actions."""

    def __init__(
        self,
        store: Store,
        limiter: RateLimiter,
        *,
        cache_s: float = AUTH_CACHE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.limiter = limiter
        self.cache_s = cache_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # sha256(token) -> (cached at, store identity epoch, principal, token expiry)
        self._cache: dict[bytes, tuple[float, int, Principal, datetime | None]] = {}

    # -- dependencies ----------------------------------------------------------------------

    def user(self, request: Request, credentials: Credentials) -> Principal:
        """The user behind an API token; 401 for none, a bad, expired or revoked one."""
        token = _token_of(credentials)
        token_id = parse_api_token(token)
        if token_id is None:
            self.limiter.check(f"address:{_ip(request)}")
            raise Unauthenticated(
                "invalid token (fix: use a token from `tyard tokens create` or "
                "$TYARD_HOME/admin.token; job tokens only work for their job's report)"
            )
        self.limiter.check(f"token:{token_id}")
        key = hashlib.sha256(token.encode()).digest()
        who = self._cached(key)
        if who is None:
            epoch = self.store.identity_epoch  # read before: a change during the read misses
            try:
                user, record = self.store.authenticate(token)
            except Unauthenticated:
                self.limiter.check(f"address:{_ip(request)}")  # guessing costs the guesser
                raise
            who = principal_of(user, record)
            self._remember(key, epoch, who, record.expires_at)
        request.state.principal = who
        return who

    def cached_user(
        self, request: Request, credentials: HTTPAuthorizationCredentials | None
    ) -> Principal | None:
        """:meth:`user` when the token's principal is cached (no database read: the gateway
        calls this on its event loop), else None. Errors as :meth:`user`'s."""
        token = _token_of(credentials)
        token_id = parse_api_token(token)
        if token_id is None:
            return None  # user() refuses it, counting the address
        who = self._cached(hashlib.sha256(token.encode()).digest())
        if who is not None:
            self.limiter.check(f"token:{token_id}")
            request.state.principal = who
        return who

    def _cached(self, key: bytes) -> Principal | None:
        if self.cache_s <= 0:
            return None
        with self._lock:
            hit = self._cache.get(key)
        if hit is None:
            return None
        at, epoch, who, expires_at = hit
        if (
            self._monotonic() - at > self.cache_s
            or epoch != self.store.identity_epoch
            or (expires_at is not None and expires_at <= self.store.now())
        ):
            with self._lock:
                self._cache.pop(key, None)
            return None
        return who

    def _remember(
        self, key: bytes, epoch: int, who: Principal, expires_at: datetime | None
    ) -> None:
        if self.cache_s <= 0:
            return
        with self._lock:
            if len(self._cache) >= _AUTH_CACHE_MAX:
                self._cache.clear()
            self._cache[key] = (self._monotonic(), epoch, who, expires_at)

    def reporter(self, job_id: JobId, request: Request, credentials: Credentials) -> Reporter:
        """A job's own token (bound to one attempt), or a platform admin's user token."""
        token = _token_of(credentials)
        if parse_api_token(token) is not None:
            who = self.user(request, credentials)
            self.check(request, who, Action.JOB_REPORT, obj=f"job/{job_id}")
            return Reporter(job_id=job_id, attempt=None, principal=who)
        self.limiter.check(f"job:{job_id}")
        grant = self.store.job_token_grant(job_id, token)
        if grant is None:
            raise Unauthenticated(
                f"invalid token for job {job_id} (a job token works only "
                "for its own job's current attempt)"
            )
        request.state.actor = f"job/{job_id}/attempt/{grant.attempt}"  # for refusal audits
        return Reporter(job_id=job_id, attempt=grant.attempt, principal=None)

    # -- checks ----------------------------------------------------------------------------

    def check(
        self,
        request: Request,
        who: Principal,
        action: Action,
        *,
        team: str | None = None,
        obj: str = "",
    ) -> None:
        """authorize(), writing a `denied` audit line before a 403."""
        try:
            authorize(who, action, team)
        except Forbidden as exc:
            self.audit_refusal(request, exc, action=str(action), obj=obj or f"team/{team or '-'}")
            raise

    def audit_refusal(
        self, request: Request, exc: Forbidden, *, action: str = "", obj: str = ""
    ) -> None:
        """Write the `denied` audit line of a 403, once per refusal. Every Forbidden raised
        while serving a request comes through here: from :meth:`check`, or from the app's
        error handler for refusals raised elsewhere (a scope a token lacks, a job path outside
        the job's files), so no refusal goes unaudited."""
        if getattr(exc, "audited", False):
            return
        who: Principal | None = getattr(request.state, "principal", None)
        actor = who.name if who is not None else getattr(request.state, "actor", "anonymous")
        route = request.scope.get("route")
        self.store.record_audit(
            AuditContext(actor=actor, source_ip=_ip(request)),
            action or f"{request.method} {getattr(route, 'path', request.url.path)}",
            obj or request.url.path,
            outcome="denied",
            detail=str(exc),
        )
        exc.audited = True  # type: ignore[attr-defined]

    @staticmethod
    def context(request: Request, who: Principal) -> AuditContext:
        return AuditContext(actor=who.name, source_ip=_ip(request))


def _token_of(credentials: HTTPAuthorizationCredentials | None) -> str:
    if credentials is None or not credentials.credentials.strip():
        raise Unauthenticated(MISSING)
    return credentials.credentials.strip()


def _ip(request: Request) -> str:
    return request.client.host if request.client else ""
