"""Sign-in for the console: an API token exchanged for a session cookie, and CSRF checks.

Signing in (``POST /api/v1/console/session`` with the user's token as a bearer token, the
same check as every API call) creates a new API token for the user with the same scopes that
expires after :data:`SESSION_HOURS` and sets it as an ``HttpOnly; SameSite=Strict`` cookie, so
page scripts never hold a secret and the store's token rules (hashing, expiry, revocation,
``last used``) apply to sessions unchanged. Signing out revokes it.

:class:`SessionCookies` (ASGI middleware) turns that cookie into the request's bearer token
for ``/api/`` routes that carry no ``Authorization`` header, so every console action goes
through the very same route, permission check and audit line as its API twin. A request that
changes something (any method but GET, HEAD, OPTIONS) and is authenticated by the cookie
must carry ``X-CSRF-Token``: an HMAC of the session token that only a page which could read
``GET /api/v1/console/session`` (same origin) knows.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from datetime import timedelta
from enum import Enum
from http.cookies import SimpleCookie
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from tensoryard.api.access import Principal
from tensoryard.api.guard import Guard
from tensoryard.errors import Forbidden
from tensoryard.store import Store

__all__ = ["COOKIE", "CSRF_HEADER", "SESSION_HOURS", "SessionCookies", "add_session_routes"]

COOKIE = "tyard_session"
CSRF_HEADER = "x-csrf-token"
SESSION_HOURS = 12
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


def csrf_of(token: str) -> str:
    """The CSRF token of a session: derived from the secret cookie, never stored."""
    return hmac.new(token.encode(), b"tensoryard-console-csrf", hashlib.sha256).hexdigest()[:40]


def _cookie_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # a malformed Cookie header: treated as no session
                return None
            morsel = jar.get(COOKIE)
            if morsel is not None and morsel.value:
                return morsel.value
    return None


class SessionCookies:
    """The console's cookie becomes the bearer token of API calls, checked for CSRF."""

    def __init__(
        self,
        app: ASGIApp,
        prefix: str = "/api/",
        guard: Guard | None = None,
    ) -> None:
        self.app = app
        self.prefix = prefix
        # Audits the refusals this middleware answers itself (every 403 is audited).
        self.audit: Callable[[Scope, str], None] = (
            (lambda scope, message: _audit(guard, scope, message)) if guard else _no_audit
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
        if any(name == b"authorization" for name, _ in headers):
            await self.app(scope, receive, send)
            return
        token = _cookie_token(scope)
        if token is None:
            await self.app(scope, receive, send)
            return
        if scope.get("method", "GET") not in _SAFE:
            sent = next((v for n, v in headers if n == CSRF_HEADER.encode()), b"")
            if not hmac.compare_digest(sent.decode("latin-1"), csrf_of(token)):
                message = (
                    "missing or wrong X-CSRF-Token for this session "
                    "(fix: reload the console page, or sign in again)"
                )
                self.audit(scope, message)
                await _refuse(send, message)
                return
        headers.append((b"authorization", b"Bearer " + token.encode("latin-1")))
        await self.app({**scope, "headers": headers}, receive, send)


def _no_audit(scope: Scope, message: str) -> None:
    return None


def _audit(guard: Guard, scope: Scope, message: str) -> None:
    """A `denied` audit line for a refusal answered before any route (the actor is unknown:
    the cookie's token is not resolved for a request that is refused anyway)."""
    request = Request(scope)
    request.state.actor = "console session (CSRF check failed)"
    guard.audit_refusal(request, Forbidden(message), action=f"{request.method} {request.url.path}")


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SessionOut(BaseModel):
    user: str
    platform_admin: bool
    teams: dict[str, str]
    scopes: list[str]
    csrf: str
    token_id: str


def _out(who: Principal, token: str) -> SessionOut:
    return SessionOut(
        user=who.name,
        platform_admin=who.platform_admin,
        teams=dict(who.roles),
        scopes=sorted(who.scopes),
        csrf=csrf_of(token),
        token_id=who.token_id,
    )


def _bearer(request: Request) -> str:
    value = request.headers.get("authorization", "")
    return value.split(" ", 1)[1].strip() if " " in value else ""


def add_session_routes(app: FastAPI, *, store: Store, guard: Guard, prefix: str) -> None:
    path = f"{prefix}/console/session"
    tags: list[str | Enum] = ["console"]

    @app.post(path, status_code=201, tags=tags)
    def sign_in(
        request: Request, response: Response, who: Principal = Depends(guard.user)
    ) -> SessionOut:
        """Exchange the bearer token for a console session: a new token of yours with the
        same scopes, valid for 12 hours, set as an HttpOnly SameSite=Strict cookie."""
        # A session never outlives the token that opened it: signing in again with a token
        # about to expire cannot stretch its life by 12 hours each time.
        expires = store.now() + timedelta(hours=SESSION_HOURS)
        parent = store.get_token(who.token_id).expires_at
        if parent is not None:
            expires = min(expires, parent)
        issued = store.create_token(
            who.name,
            name="console session",
            scopes=sorted(who.scopes),
            expires_at=expires,
            audit=guard.context(request, who),
        )
        response.set_cookie(
            COOKIE,
            issued.token,
            max_age=max(int((expires - store.now()).total_seconds()), 0),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        session = Principal(
            name=who.name,
            platform_admin=who.platform_admin,
            token_id=issued.record.id,
            scopes=who.scopes,
            roles=who.roles,
        )
        return _out(session, issued.token)

    @app.get(path, tags=tags)
    def session(request: Request, who: Principal = Depends(guard.user)) -> SessionOut:
        """Who this session (or token) is, and the CSRF token its pages send with actions."""
        return _out(who, _bearer(request))

    @app.delete(path, tags=tags)
    def sign_out(
        request: Request, response: Response, who: Principal = Depends(guard.user)
    ) -> dict[str, Any]:
        """Sign out: the session's token is revoked and the cookie cleared."""
        if request.cookies.get(COOKIE) == _bearer(request):
            store.revoke_token(who.token_id, audit=guard.context(request, who))
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return {"signed_out": who.name}
