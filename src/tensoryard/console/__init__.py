"""The web console: static pages served by the control plane at ``/``, same origin as the API.

The pages are plain ES modules and CSS in ``static/`` (no build step, nothing fetched from the
internet); they read the REST API with a session cookie (:mod:`.session`) and follow changes
through server-sent events (:mod:`.live`). :func:`add_console` mounts everything on the API's
FastAPI app.
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from tensoryard.api.guard import Guard
from tensoryard.api.node_telemetry import TelemetryBook
from tensoryard.console.live import LiveHub
from tensoryard.console.routes import ConsoleDeps, LogPath, add_console_routes
from tensoryard.console.session import SessionCookies, add_session_routes
from tensoryard.store import Store

__all__ = ["ASSETS", "STATIC", "add_console", "load_assets"]

STATIC = Path(__file__).parent / "static"
ASSETS = "/ui"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes
    etag: str
    media_type: str


def load_assets(root: Path = STATIC) -> dict[str, Asset]:
    """Every file under ``root`` by its relative path, with a gzipped copy and an ETag."""
    out: dict[str, Asset] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        body = path.read_bytes()
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix in (".js", ".mjs"):
            kind = "text/javascript"
        if kind.startswith("text/") or kind.endswith(("json", "javascript", "svg+xml")):
            kind += "; charset=utf-8"
        out[path.relative_to(root).as_posix()] = Asset(
            body=body,
            gzipped=gzip.compress(body, 9, mtime=0),
            etag='"' + hashlib.sha256(body).hexdigest()[:20] + '"',
            media_type=kind,
        )
    return out


def _serve(asset: Asset, request: Request, cache: str) -> Response:
    headers = {**_HEADERS, "ETag": asset.etag, "Cache-Control": cache, "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped, media_type=asset.media_type, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


def add_console(
    app: FastAPI,
    *,
    store: Store,
    guard: Guard,
    prefix: str,
    runs_dir: Path,
    log_path: LogPath,
    capacity: Callable[[], Sequence[Any]] = lambda: (),
    kick: Callable[[], None] = lambda: None,
    live_interval_s: float = 0.5,
    telemetry: TelemetryBook | None = None,
) -> LiveHub:
    """Mount the console: ``/`` (the page), ``/ui/*`` (its files), the session cookie
    middleware, and the console's API routes under ``prefix``. Returns the live hub."""
    assets = load_assets()
    hub = LiveHub(store, interval_s=live_interval_s)
    app.add_middleware(SessionCookies, prefix="/api/", guard=guard)
    add_session_routes(app, store=store, guard=guard, prefix=prefix)
    deps = ConsoleDeps(
        runs_dir=runs_dir,
        capacity=capacity,
        log_path=log_path,
        kick=kick,
        telemetry=telemetry if telemetry is not None else TelemetryBook(),
    )
    add_console_routes(app, store=store, guard=guard, prefix=prefix, deps=deps, hub=hub)

    async def index(request: Request) -> Response:
        return _serve(assets["index.html"], request, "no-cache")

    async def asset(request: Request) -> Response:
        found = assets.get(str(request.path_params["path"]))
        if found is None:
            return Response("not found", status_code=404, media_type="text/plain")
        return _serve(found, request, "no-cache")

    app.add_route("/", index, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_route(
        f"{ASSETS}/{{path:path}}", asset, methods=["GET", "HEAD"], include_in_schema=False
    )
    app.router.add_event_handler("shutdown", hub.close)
    return hub
