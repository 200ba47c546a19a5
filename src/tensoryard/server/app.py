"""The REST API (v1) of the control plane. Thin: validate, call the store, convert."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from tensoryard import __version__
from tensoryard.api.access import JOB_EVENT_KINDS, Action, Principal
from tensoryard.api.guard import INT32, Guard, JobId, Reporter
from tensoryard.api.limits import BodyLimit, NoNulInUrl, RateLimiter
from tensoryard.api.node_telemetry import TelemetryBook
from tensoryard.console import add_console
from tensoryard.errors import (
    Conflict,
    DataError,
    ExecutorError,
    FieldIssue,
    Forbidden,
    NotFound,
    RateLimited,
    SpecError,
    StoreError,
    TensoryardError,
    Unauthenticated,
)
from tensoryard.executors.base import Executor
from tensoryard.images import ImageRefError, validate_image_ref
from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.registry.paths import protected_overlap
from tensoryard.registry.pruning import CheckpointPruner, job_paths
from tensoryard.registry.service import ModelRegistry, detect_format
from tensoryard.registry.webhooks import WebhookDispatcher
from tensoryard.server.faults import crashpoint
from tensoryard.server.routes_access import add_access_routes
from tensoryard.server.routes_models import add_model_routes
from tensoryard.server.routes_nodes import add_node_routes
from tensoryard.server.routes_pipelines import add_pipeline_routes
from tensoryard.server.routes_secrets import add_secret_routes
from tensoryard.server.routes_webhooks import add_webhook_routes
from tensoryard.server.schemas import (
    AttemptOut,
    BatchSubmitIn,
    BatchSubmitOut,
    CheckpointOut,
    CheckpointRemovalOut,
    ErrorOut,
    EventOut,
    JobListOut,
    JobOut,
    MetricOut,
    ReportIn,
    ReportOut,
    SubmitIn,
    SummaryOut,
    TeamGoodputOut,
    TeamIn,
    TeamOut,
    TeamPatch,
)
from tensoryard.server.secrets import SecretStore
from tensoryard.server.summary import summarize, team_goodput
from tensoryard.spec._common import load_yaml_text
from tensoryard.spec.job import NAME_PATTERN, JobSpec, parse_job_spec
from tensoryard.spec.states import TERMINAL_STATES, JobState
from tensoryard.store import JobRecord, Store

__all__ = ["PUBLIC_PATHS", "create_app"]

log = logging.getLogger("tensoryard.api")

API = "/api/v1"
PUBLIC_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""The only routes that answer without a token."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in (
        (401, "No valid token: missing, unknown, expired or revoked."),
        (403, "The token's user or scopes do not allow this; the message says who can grant it."),
        (404, "No such object."),
        (409, "The object's state does not allow this now."),
        (413, "The request body is over the server's limit."),
        (416, "A log offset past the end of the log; X-Next-Offset has its size."),
        (422, "Invalid input; `detail` lists each field with a fix."),
        (429, "Too many requests for this token; see Retry-After."),
    )
}


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
        responses=_ERRORS,
    )
    # The control plane's state directory (tokens, keys, secrets, database): no path that comes
    # from a job or a spec may point into it, but for the jobs' own run directories.
    protected = (runs_dir.parent,)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(NoNulInUrl)
    guard = Guard(
        store, RateLimiter(rate_per_s=rate_limit_per_s, burst=rate_limit_burst, clock=clock)
    )
    _add_error_handlers(app, guard)

    def visible_job(request: Request, who: Principal, job_id: int) -> JobRecord:
        job = store.get_job(job_id)
        guard.check(request, who, Action.JOB_READ, team=job.team, obj=f"job/{job_id}")
        return job

    # ---- routes -------------------------------------------------------------------------------

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, Any]:
        store.ping()  # touches the database
        return {"ok": True, "version": __version__, **loop_status()}

    @app.post(f"{API}/jobs", status_code=201, tags=["jobs"])
    def submit(
        body: SubmitIn,
        request: Request,
        who: Principal = Depends(guard.user),
        idempotency_key: Annotated[str | None, Header()] = None,
    ) -> JobOut:
        """Submit a job to a team you are a member of; `spec.user` is set to you.

        With an `Idempotency-Key` header a retried request returns the job stored the first
        time instead of storing a copy (the CLI and the Python client always send one)."""
        key = _idempotency_key(idempotency_key)
        spec = parse_job_spec({**_submitted_mapping(body), "user": who.name}, source="request")
        _check_inputs(spec, protected)
        _check_submittable(store, spec)
        guard.check(request, who, Action.JOB_SUBMIT, team=spec.team, obj=f"team/{spec.team}")
        fits(spec)
        job = store.create_job(
            spec, run_dir_root=runs_dir, audit=guard.context(request, who), key=key
        )
        kick()
        return JobOut.model_validate(job)

    @app.post(f"{API}/jobs/batch", status_code=201, tags=["jobs"])
    def submit_batch(
        body: BatchSubmitIn,
        request: Request,
        who: Principal = Depends(guard.user),
        idempotency_key: Annotated[str | None, Header()] = None,
    ) -> BatchSubmitOut:
        """Submit up to 1,000 jobs in one transaction (for scripts): all are stored, or none
        (a bad spec is named by its index, like `specs.3.resources.cpu`). An
        `Idempotency-Key` header makes a retry return the ids stored the first time."""
        key = _idempotency_key(idempotency_key)
        specs: list[JobSpec] = []
        issues: list[FieldIssue] = []
        for i, raw in enumerate(body.specs):
            try:
                specs.append(parse_job_spec({**raw, "user": who.name}, source="request"))
            except SpecError as exc:
                issues += [
                    FieldIssue(f"specs.{i}.{x.path}".rstrip("."), x.message, x.fix)
                    for x in exc.issues
                ]
        for i, spec in enumerate(specs):
            for check in (fits, lambda s: _check_inputs(s, protected)):
                try:
                    check(spec)
                except SpecError as exc:
                    issues += [
                        FieldIssue(f"specs.{i}.{x.path}".rstrip("."), x.message, x.fix)
                        for x in exc.issues
                    ]
        if issues:
            raise SpecError(issues, source="request")
        for spec in {s.team: s for s in specs}.values():
            _check_submittable(store, spec)
            guard.check(request, who, Action.JOB_SUBMIT, team=spec.team, obj=f"team/{spec.team}")
        jobs = store.create_jobs(
            specs, run_dir_root=runs_dir, audit=guard.context(request, who), key=key
        )
        kick()
        return BatchSubmitOut(ids=[j.id for j in jobs])

    @app.get(f"{API}/jobs", tags=["jobs"])
    def list_jobs(
        request: Request,
        who: Principal = Depends(guard.user),
        state: Annotated[list[str] | None, Query()] = None,
        team: str | None = None,
        user: str | None = None,
        name: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: str | None = None,
    ) -> JobListOut:
        """Jobs of the teams you may see (every team for platform admins), newest first."""
        states = _parse_states(state)
        if team is not None:
            guard.check(request, who, Action.JOB_READ, team=team, obj=f"team/{team}")
        page = store.list_jobs(
            states=states,
            team=team,
            user=user,
            name=name,
            limit=limit,
            cursor=cursor,
            teams=who.visible_teams(),
        )
        return JobListOut(
            items=[JobOut.model_validate(j) for j in page.items],
            next_cursor=page.next_cursor,
            total=page.total,
        )

    @app.get(f"{API}/jobs/{{job_id}}", tags=["jobs"])
    def get_job(job_id: JobId, request: Request, who: Principal = Depends(guard.user)) -> JobOut:
        return JobOut.model_validate(visible_job(request, who, job_id))

    @app.post(f"{API}/jobs/{{job_id}}/cancel", tags=["jobs"])
    def cancel(job_id: JobId, request: Request, who: Principal = Depends(guard.user)) -> JobOut:
        """Cancel a job of a team where you are a member (or team-admin)."""
        job = store.get_job(job_id)
        guard.check(request, who, Action.JOB_CANCEL, team=job.team, obj=f"job/{job_id}")
        if job.state in TERMINAL_STATES:
            raise Conflict(f"job {job_id} already ended ({job.state.value}); nothing to cancel")
        job = store.request_cancel(job_id, audit=guard.context(request, who))
        kick()
        return JobOut.model_validate(job)

    @app.get(f"{API}/jobs/{{job_id}}/attempts", tags=["jobs"])
    def attempts(
        job_id: JobId, request: Request, who: Principal = Depends(guard.user)
    ) -> list[AttemptOut]:
        visible_job(request, who, job_id)
        return [AttemptOut.model_validate(a) for a in store.list_attempts(job_id)]

    @app.get(f"{API}/jobs/{{job_id}}/events", tags=["jobs"])
    def events(
        job_id: JobId,
        request: Request,
        who: Principal = Depends(guard.user),
        after: Annotated[int, Query(ge=0, le=INT32)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[EventOut]:
        visible_job(request, who, job_id)
        return [
            EventOut.model_validate(e)
            for e in store.list_events(job_id, after_id=after, limit=limit)
        ]

    @app.get(f"{API}/jobs/{{job_id}}/metrics", tags=["jobs"])
    def metrics(
        job_id: JobId,
        request: Request,
        who: Principal = Depends(guard.user),
        attempt: Annotated[int | None, Query(ge=1, le=INT32)] = None,
        after_step: Annotated[int | None, Query(ge=-1, le=INT32)] = None,
    ) -> list[MetricOut]:
        visible_job(request, who, job_id)
        rows = store.list_metrics(job_id, attempt=attempt, after_step=after_step)
        return [MetricOut.model_validate(m) for m in rows]

    @app.get(f"{API}/jobs/{{job_id}}/checkpoints", tags=["jobs"])
    def checkpoints(
        job_id: JobId, request: Request, who: Principal = Depends(guard.user)
    ) -> list[CheckpointOut]:
        visible_job(request, who, job_id)
        rows = store.list_checkpoints(job_id)
        metrics = store.metrics_at_steps(job_id, [c.step for c in rows])
        return [
            CheckpointOut.model_validate(c).model_copy(update={"metrics": metrics.get(c.step, {})})
            for c in rows
        ]

    @app.get(f"{API}/jobs/{{job_id}}/checkpoint-removals", tags=["jobs"])
    def checkpoint_removals(
        job_id: JobId, request: Request, who: Principal = Depends(guard.user)
    ) -> list[CheckpointRemovalOut]:
        """The job's checkpoints that its retention policy removed, by step."""
        visible_job(request, who, job_id)
        return [CheckpointRemovalOut.model_validate(r) for r in store.checkpoint_removals(job_id)]

    @app.get(f"{API}/jobs/{{job_id}}/summary", tags=["jobs"])
    def summary(
        job_id: JobId, request: Request, who: Principal = Depends(guard.user)
    ) -> SummaryOut:
        visible_job(request, who, job_id)
        return summarize(store, job_id, now=datetime.now(UTC))

    @app.get(
        f"{API}/jobs/{{job_id}}/logs",
        tags=["jobs"],
        response_model=None,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    def logs(
        job_id: JobId,
        request: Request,
        who: Principal = Depends(guard.user),
        rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        attempt: Annotated[int | None, Query(ge=1, le=INT32)] = None,
        follow: bool = False,
        offset: Annotated[
            int,
            Query(ge=0, le=2**53 - 1, description="Byte offset: 0, or a previous X-Next-Offset."),
        ] = 0,
    ) -> Any:
        """One rank's log of an attempt (default: the latest); 409 if it never started, 416
        for an offset past the end of the log."""
        job = visible_job(request, who, job_id)
        number = attempt or job.attempts
        if number < 1:
            return PlainTextResponse("", headers={"X-Next-Offset": "0"})
        record = store.get_attempt(job_id, number)
        source = _LogSource(
            _log_path(executor, job, record, rank), _live_reader(executor, record.handle, rank)
        )
        size = source.size()
        if offset > size:
            return JSONResponse(
                status_code=416,
                content={
                    "message": f"offset {offset} is past the end of the log ({size} bytes); "
                    "fix: pass 0 or the X-Next-Offset of your previous read"
                },
                headers={"X-Next-Offset": str(size)},
            )
        if not follow:
            data = source.read(offset)
            return PlainTextResponse(
                data.decode("utf-8", "replace"), headers={"X-Next-Offset": str(offset + len(data))}
            )
        return StreamingResponse(
            _follow(store, job_id, number, source, offset), media_type="text/plain"
        )

    @app.post(f"{API}/jobs/{{job_id}}/report", tags=["runtime"])
    def report(
        job_id: JobId, body: ReportIn, caller: Reporter = Depends(guard.reporter)
    ) -> ReportOut:
        """The in-job runtime's report (docs/contracts.md section 2), with the job's token."""
        moved = _restarted_in_place(store, job_id, caller, body)
        _check_report(caller if not moved else replace(caller, attempt=body.attempt), body)
        job = store.get_job(job_id)
        if moved:
            restarted(job, "in-place")  # tyard_restarts_total{reason="in-place"}
        if body.metrics:
            store.add_metrics(job_id, body.attempt, [m.model_dump() for m in body.metrics])
        known = _known_checkpoints(store, job_id, body) if body.checkpoints else set()
        if body.checkpoints:
            boundary = job_paths(job, protected)
            for c in body.checkpoints:  # all checked before any is stored
                boundary.check(c.path)
        added = 0
        for c in body.checkpoints:
            if (c.step, c.path) in known:  # a re-sent report: stored (or retired) already
                continue
            fmt = c.format or _visible_format(c.path)
            store.add_checkpoint(
                job_id,
                body.attempt,
                step=c.step,
                path=c.path,
                ts=c.ts,
                size_bytes=c.size_bytes,
                format=fmt,
            )
            store.add_event(
                job_id,
                "checkpoint",
                f"checkpoint at step {c.step}" + (f" ({fmt})" if fmt else ""),
                attempt=body.attempt,
            )
            added += 1
        if added:
            _apply_retention(store, job)
        if body.resumed_from_step is not None:
            store.update_attempt(job_id, body.attempt, resumed_from_step=body.resumed_from_step)
        if body.timings is not None:
            store.update_attempt(
                job_id,
                body.attempt,
                checkpoint_save_s=body.timings.checkpoint_save_s,
                checkpoint_restore_s=body.timings.checkpoint_restore_s,
            )
        for e in body.events:
            store.add_event(job_id, e.kind, e.message, attempt=body.attempt)
        if body.heartbeat_at is not None:
            store.heartbeat(job_id, body.attempt, datetime.fromtimestamp(body.heartbeat_at, UTC))
        return ReportOut(cancel=job.cancel_requested)

    @app.get(f"{API}/teams", tags=["teams"])
    def teams(request: Request, who: Principal = Depends(guard.user)) -> list[TeamOut]:
        guard.check(request, who, Action.TEAM_READ)
        return [TeamOut.model_validate(t) for t in store.list_teams()]

    @app.get(f"{API}/teams/{{name}}/goodput", tags=["teams"])
    def goodput_of_team(
        name: str, request: Request, who: Principal = Depends(guard.user)
    ) -> TeamGoodputOut:
        """The team's goodput and badput breakdown, summed over its jobs (docs/goodput.md)."""
        store.get_team(name)  # NotFound for an unknown team
        guard.check(request, who, Action.JOB_READ, team=name, obj=f"team/{name}")
        return team_goodput(store, name, now=datetime.now(UTC))

    @app.post(f"{API}/teams", status_code=201, tags=["teams"])
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

    @app.patch(f"{API}/teams/{{name}}", tags=["teams"])
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
        log_path=lambda job, attempt, rank: _log_path(executor, job, attempt, rank),
        capacity=capacity,
        kick=kick,
        telemetry=telemetry,
    )
    return app


def _add_error_handlers(app: FastAPI, guard: Guard) -> None:
    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse(
            status_code=422,
            content={"message": str(exc), "detail": [i.as_dict() for i in exc.issues]},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        issues = [
            FieldIssue(
                ".".join(str(p) for p in e.get("loc", ())[1:]),
                str(e.get("msg", "")),
                _fix_of(e),
            )
            for e in exc.errors()
        ]
        err = SpecError(issues, source="request")
        return JSONResponse(
            status_code=422,
            content={"message": str(err), "detail": [i.as_dict() for i in issues]},
        )

    @app.exception_handler(Unauthenticated)
    async def _unauthenticated(_: Request, exc: Unauthenticated) -> JSONResponse:
        return JSONResponse(
            status_code=401,
            content={"message": str(exc)},
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(Forbidden)
    async def _forbidden(request: Request, exc: Forbidden) -> JSONResponse:
        try:  # every refusal is audited, once (Guard.audit_refusal)
            await run_in_threadpool(guard.audit_refusal, request, exc)
        except TensoryardError as audit_exc:
            log.error("could not audit a refusal (%s): %s", exc, audit_exc)
        return JSONResponse(status_code=403, content={"message": str(exc)})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The framework's own errors (an unparsable body, a method not allowed, an unknown
        # path) in the documented shape, not its default {"detail": ...}.
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400:
            message = (
                f"the request body could not be read ({message}); "
                "fix: send a JSON object with Content-Type: application/json"
            )
        return JSONResponse(
            status_code=exc.status_code,
            content={"message": message},
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RateLimited)
    async def _rate_limited(_: Request, exc: RateLimited) -> JSONResponse:
        return JSONResponse(
            status_code=429,
            content={"message": str(exc)},
            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))},
        )

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"message": str(exc)})

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"message": str(exc)})

    @app.exception_handler(DataError)
    async def _data_error(_: Request, exc: DataError) -> JSONResponse:
        # An artifact or checkpoint that cannot be read or stored (corrupt chunk, bad path).
        return JSONResponse(status_code=422, content={"message": str(exc)})

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse(status_code=503, content={"message": f"database error: {exc}"})


def _fix_of(error: Mapping[str, Any]) -> str:
    """A fix for a request field the framework refused (the message says what is wrong)."""
    ctx = error.get("ctx") or {}
    kind = error.get("type", "")
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
        return "use lowercase letters, digits and '-', starting with a letter (at most 63)"
    if kind == "string_pattern_mismatch":
        return f"write it to match {ctx.get('pattern')}"
    if kind in ("json_invalid", "model_attributes_type", "dict_type"):
        return "send a JSON object with Content-Type: application/json"
    if kind == "finite_number":
        return "send a finite number (not NaN or Infinity)"
    if kind == "missing":
        return "add the field"
    if kind == "extra_forbidden":
        return "remove the field (see the API reference at /docs)"
    return ""


def _restarted_in_place(store: Store, job_id: int, caller: Reporter, body: ReportIn) -> bool:
    """The first report of workers that torchrun restarted in place (they report as the next
    attempt, naming their launch): record the restart, which moves the job's token to them.
    True when this report's attempt is the one now current."""
    launch = body.launch_attempt
    if launch is None or body.attempt <= launch:
        return False
    if caller.attempt is not None and not launch <= caller.attempt <= body.attempt:
        return False  # another launch's token: _check_report refuses it
    if caller.attempt == body.attempt:
        return False  # recorded already; the token moved with it
    granted = _in_place_granted(store.get_job(job_id))
    if body.attempt - launch > granted:
        # Each restart is an attempt row: an unbounded number would let one report (a job's
        # own code holds its token) write millions of rows in one transaction.
        raise Forbidden(
            f"attempt {body.attempt} would be in-place restart {body.attempt - launch} of "
            f"launch {launch}, and job {job_id} grants at most {granted} (restart.in_place); "
            "this report is not accepted"
        )
    try:
        store.restart_in_place(job_id, launch=launch, number=body.attempt)
    except Conflict as exc:
        raise Forbidden(f"{exc}; this report is not accepted") from exc
    return True


def _in_place_granted(job: JobRecord) -> int:
    """The most in-place restarts the job's spec grants one launch (restart.in_place)."""
    try:
        return JobSpec.model_validate(job.spec).restart.in_place
    except ValidationError:
        return 0  # a stored spec this version cannot read grants nothing


def _check_report(caller: Reporter, body: ReportIn) -> None:
    """A job token reports for its own attempt, and only runtime event kinds."""
    if caller.attempt is not None and body.attempt != caller.attempt:
        raise Forbidden(
            f"this job token was issued for attempt {caller.attempt} of job {caller.job_id}; "
            f"it cannot report for attempt {body.attempt}"
        )
    if caller.principal is not None:
        return
    bad = sorted({e.kind for e in body.events} - JOB_EVENT_KINDS)
    if bad:
        raise Forbidden(
            f"a job may not post events of kind {', '.join(bad)}; allowed: "
            f"{', '.join(sorted(JOB_EVENT_KINDS))} (the control plane writes the others)"
        )


def _check_inputs(spec: JobSpec, protected: tuple[Path, ...]) -> None:
    """422 for a spec whose checkpoint directory lies in the control plane's own state
    directory (registry/paths.py; checkpoints reported from there would be refused anyway), or
    whose `image` is no OCI reference (whitespace, upper case, a bad tag or digest)."""
    issues = []
    if spec.image is not None:
        try:
            validate_image_ref(spec.image)
        except ImageRefError as exc:
            issues.append(FieldIssue("image", f"{exc.value!r} {exc.problem}", exc.fix))
    value = spec.checkpoint.dir
    if value:
        guarded = protected_overlap(value, protected)
        if guarded is not None:
            issues.append(
                FieldIssue(
                    "checkpoint.dir",
                    f"{value!r} lies in the control plane's state directory {guarded}",
                    "use a directory of your own (default: the job's run directory)",
                )
            )
    if issues:
        raise SpecError(issues, source="request")


def _visible_format(path: str) -> str | None:
    """The format of a reported checkpoint the runtime did not name, when this control plane
    can see its path (the local executor); None otherwise (e.g. a pod-local volume)."""
    try:
        where = Path(path)
        return detect_format(where) if where.exists() else None
    except OSError:
        return None


def _submitted_mapping(body: SubmitIn) -> dict[str, Any]:
    """The spec of a submission as a mapping: `spec` as sent, or `spec_yaml` parsed with the
    CLI's safe loader and limits. Errors name `spec`/`spec_yaml` and the fix."""
    if (body.spec is None) == (body.spec_yaml is None):
        raise SpecError(
            [FieldIssue("spec", "give the job spec once", "send either spec or spec_yaml")],
            source="request",
        )
    if body.spec is not None:
        return body.spec
    try:
        data = load_yaml_text(body.spec_yaml or "", source="spec_yaml")
    except SpecError as exc:
        issues = [FieldIssue(i.path or "spec_yaml", i.message, i.fix) for i in exc.issues]
        raise SpecError(issues, source="request") from None
    if not isinstance(data, dict):
        raise SpecError(
            [
                FieldIssue(
                    "spec_yaml",
                    "a job spec must be a mapping of fields",
                    "start with 'name: ...' (the text of a job.yaml)",
                )
            ],
            source="request",
        )
    return data


def _known_checkpoints(store: Store, job_id: int, body: ReportIn) -> set[tuple[int, str]]:
    """(step, path) of the job's checkpoints, stored or already removed by retention."""
    stored = {(c.step, c.path) for c in store.list_checkpoints(job_id)}
    steps = [c.step for c in body.checkpoints]
    return stored | store.removed_checkpoint_keys(job_id, steps)


def _apply_retention(store: Store, job: JobRecord) -> None:
    """The job's retention policy, after a new checkpoint; a failure never fails the report
    (the next checkpoint, or the next start of the control loop, finishes the work)."""
    try:
        pruner = CheckpointPruner(store, after_rows=lambda: crashpoint("retention.after_rows"))
        pruner.apply_to_job(job)
    except TensoryardError as exc:
        log.warning("job %s: retention failed, retried at the next checkpoint: %s", job.id, exc)


def _log_path(executor: Executor, job: JobRecord, attempt: Any, rank: int) -> Path:
    """The rank's log file of an attempt; Conflict when the attempt never launched."""
    number = attempt.number
    if not attempt.handle:
        why = f": {attempt.reason}" if attempt.reason else ""
        raise Conflict(
            f"attempt {number} of job {job.id} has no logs, it was never launched{why}; "
            f"`tyard describe {job.id}` shows every attempt, `--attempt N` picks another one"
        )
    try:
        paths = executor.log_paths(attempt.handle)
    except (ExecutorError, KeyError, TypeError, ValueError) as exc:
        raise Conflict(
            f"attempt {number} of job {job.id} has no readable log location ({exc})"
        ) from exc
    if rank not in paths:
        raise NotFound(
            f"job {job.id} attempt {number} has no rank {rank}; ranks: "
            + ", ".join(str(r) for r in sorted(paths))
        )
    path = Path(paths[rank])
    # Defence in depth: never serve a file outside the job's own run directory.
    if job.run_dir and not path.resolve().is_relative_to(Path(job.run_dir).resolve()):
        raise NotFound(f"job {job.id} attempt {number} rank {rank} has no log in its run dir")
    return path


def _check_submittable(store: Store, spec: JobSpec) -> None:
    """Checks that need the store: the team must exist."""
    try:
        store.get_team(spec.team)
    except NotFound:
        known = ", ".join(t.name for t in store.list_teams()) or "none"
        raise SpecError(
            [
                FieldIssue(
                    "team",
                    f"unknown team {spec.team!r}",
                    f"use one of: {known}; or create it with `tyard teams create {spec.team}`",
                )
            ],
            source="request",
        ) from None


def _parse_states(values: list[str] | None) -> list[JobState] | None:
    if not values:
        return None
    states: list[JobState] = []
    for raw in values:
        for part in raw.split(","):
            try:
                states.append(JobState(part.strip().upper()))
            except ValueError:
                allowed = ", ".join(s.value for s in JobState)
                raise SpecError(
                    [FieldIssue("state", f"unknown state {part!r}", f"use one of: {allowed}")],
                    source="query",
                ) from None
    return states


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int, limit: int = 8 * 1024 * 1024) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(limit)
    except OSError:  # gone, or truncated below the offset by its writer: nothing to read now
        return b""


class _LogSource:
    """One rank's log: its file when there is one (the local executor's live file, or the log
    a cluster executor kept when the attempt ended), else what the executor reads live from the
    workload (a running pod's log through the Kubernetes API)."""

    def __init__(self, path: Path, live: Callable[[], bytes | None] | None) -> None:
        self.path = path
        self.live = live

    def _live(self) -> bytes | None:
        if self.live is None or self.path.exists():
            return None
        try:
            return self.live()
        except TensoryardError:
            return None

    def size(self) -> int:
        live = self._live()
        return len(live) if live is not None else _size_of(self.path)

    def read(self, offset: int, limit: int = 8 * 1024 * 1024) -> bytes:
        live = self._live()
        if live is not None:
            return live[offset : offset + limit]
        return _read_from(self.path, offset, limit)


def _live_reader(
    executor: Executor, handle: dict[str, Any] | None, rank: int
) -> Callable[[], bytes | None] | None:
    reader = getattr(executor, "live_log", None)
    if reader is None or not handle:
        return None
    return lambda: reader(handle, rank)  # type: ignore[no-any-return]


async def _follow(
    store: Store, job_id: int, attempt: int, source: _LogSource, offset: int
) -> AsyncIterator[bytes]:
    """Yield new bytes of the log until the attempt has finished and the log is drained."""
    while True:
        chunk = await asyncio.to_thread(source.read, offset, 1024 * 1024)
        if chunk:
            offset += len(chunk)
            yield chunk
            continue
        record = await asyncio.to_thread(store.get_attempt, job_id, attempt)
        if record.finished_at is not None:
            tail = await asyncio.to_thread(source.read, offset)
            if tail:
                yield tail
            return
        await asyncio.sleep(0.25 if source.live is None else 1.0)  # a pod log is re-read whole


IDEMPOTENCY_KEY_MAX = 100


def _idempotency_key(value: str | None) -> str | None:
    """The Idempotency-Key header, checked: 1-100 printable ASCII characters without '#'."""
    if value is None:
        return None
    if not 1 <= len(value) <= IDEMPOTENCY_KEY_MAX or not all(
        33 <= ord(c) <= 126 and c != "#" for c in value
    ):
        raise SpecError(
            [
                FieldIssue(
                    "Idempotency-Key",
                    f"{value[:40]!r} is not a valid key",
                    f"send 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters without "
                    "spaces or '#', e.g. a UUID",
                )
            ],
            source="request header",
        )
    return value
