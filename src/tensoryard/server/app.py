"""The REST API (v1) of the control plane. Thin: validate, call the store, convert."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tensoryard import __version__
from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import Guard
from tensoryard.api.limits import BodyLimit, NoNulInUrl, RateLimiter
from tensoryard.api.node_telemetry import TelemetryBook
from tensoryard.console import add_console
from tensoryard.executors.base import Executor
from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.registry.service import ModelRegistry
from tensoryard.registry.webhooks import WebhookDispatcher
from tensoryard.server.http_errors import ERRORS, add_error_handlers
from tensoryard.server.routes_access import add_access_routes
from tensoryard.server.routes_jobs import add_job_routes
from tensoryard.server.routes_logs import add_log_routes, log_path
from tensoryard.server.routes_models import add_model_routes
from tensoryard.server.routes_nodes import add_node_routes
from tensoryard.server.routes_pipelines import add_pipeline_routes
from tensoryard.server.routes_report import add_report_routes
from tensoryard.server.routes_secrets import add_secret_routes
from tensoryard.server.routes_teams import add_team_routes
from tensoryard.server.routes_webhooks import add_webhook_routes
from tensoryard.server.secrets import SecretStore
from tensoryard.spec.job import JobSpec
from tensoryard.store import JobRecord, Store

__all__ = ["PUBLIC_PATHS", "create_app"]

log = logging.getLogger("tensoryard.api")

API = "/api/v1"
PUBLIC_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""The only routes that answer without a token."""


def create_app(
    *,
    store: Store,
    executor: Executor,
    runs_dir: Path,
    secrets: SecretStore | None = None,
    artifacts: ArtifactStore | None = None,
    webhooks: WebhookDispatcher | None = None,
    registry: CollectorRegistry | None = None,
    kick: Callable[[], None] = lambda: None,
    loop_status: Callable[[], dict[str, Any]] = lambda: {},
    max_body_bytes: int = 2 * 1024 * 1024,
    rate_limit_per_s: float = 50.0,
    rate_limit_burst: int = 200,
    clock: Callable[[], float] = time.monotonic,
    fits: Callable[[JobSpec], None] = lambda spec: None,
    restarted: Callable[[JobRecord, str], None] = lambda job, reason: None,
    extra_routes: Callable[[FastAPI, Guard], None] | None = None,
    capacity: Callable[[], Sequence[Any]] = lambda: (),
) -> FastAPI:
    """Build the API. `kick` wakes the control loop after a submit or cancel; `loop_status`
    tells /healthz whether this replica leads the loop; `clock` paces the per-token rate
    limit; `fits` raises SpecError for a job the cluster could never hold (refused at
    submission, before anything is stored or created); `extra_routes(app, guard)` mounts
    optional parts (model serving); `webhooks` is the delivery loop to wake after a registry
    change (the store has written its outbox rows in the change's transaction); `capacity`
    lists the executor's nodes for the web console's cluster page."""
    app = FastAPI(
        title="tensoryard",
        version=__version__,
        description="Submit, watch and control training jobs on a shared GPU cluster.",
        responses=ERRORS,
    )
    # The control plane's state directory (tokens, keys, secrets, database): no path that comes
    # from a job or a spec may point into it, but for the jobs' own run directories.
    protected = (runs_dir.parent,)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(NoNulInUrl)
    guard = Guard(
        store, RateLimiter(rate_per_s=rate_limit_per_s, burst=rate_limit_burst, clock=clock)
    )
    add_error_handlers(app, guard)

    # ---- routes -------------------------------------------------------------------------------

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, Any]:
        store.ping()  # touches the database
        return {"ok": True, "version": __version__, **loop_status()}

    add_job_routes(
        app,
        store=store,
        guard=guard,
        prefix=API,
        runs_dir=runs_dir,
        protected=protected,
        kick=kick,
        fits=fits,
    )
    add_log_routes(app, store=store, guard=guard, prefix=API, executor=executor)
    add_report_routes(
        app, store=store, guard=guard, prefix=API, protected=protected, restarted=restarted
    )
    add_team_routes(app, store=store, guard=guard, prefix=API)

    @app.get(
        "/metrics",
        tags=["ops"],
        response_model=None,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    def prometheus_metrics(request: Request, who: Principal = Depends(guard.user)) -> Response:
        """Prometheus metrics of the platform (platform admins; give Prometheus a read-scoped
        token of one). docs/metrics.md lists them."""
        guard.check(request, who, Action.METRICS_READ, obj="metrics")
        body = generate_latest(registry) if registry is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    add_access_routes(app, store=store, guard=guard, prefix=API)
    add_pipeline_routes(
        app,
        store=store,
        guard=guard,
        prefix=API,
        kick=kick,
        kubernetes=getattr(executor, "name", "") == "kubernetes",
    )
    telemetry = TelemetryBook()  # the agents' heartbeats fill it; nodes and job pages read it
    add_node_routes(
        app,
        store=store,
        guard=guard,
        prefix=API,
        kick=kick,
        capacity=capacity,
        telemetry=telemetry,
    )
    add_secret_routes(
        app,
        store=store,
        guard=guard,
        secrets=secrets or SecretStore(runs_dir / "secrets"),
        prefix=API,
    )
    add_model_routes(
        app,
        registry=ModelRegistry(
            store,
            artifacts or ArtifactStore(open_blobs(str(runs_dir.parent / "artifacts"))),
            protected=protected,
        ),
        guard=guard,
        prefix=API,
        kick_webhooks=webhooks.kick if webhooks is not None else lambda: None,
    )
    add_webhook_routes(
        app,
        store=store,
        guard=guard,
        prefix=API,
        kick=webhooks.kick if webhooks is not None else lambda: None,
    )
    if extra_routes is not None:
        extra_routes(app, guard)
    add_console(
        app,
        store=store,
        guard=guard,
        prefix=API,
        runs_dir=runs_dir,
        log_path=lambda job, attempt, rank: log_path(executor, job, attempt, rank),
        capacity=capacity,
        kick=kick,
        telemetry=telemetry,
    )
    return app
