"""The REST API (v1) of the control plane. Thin: validate, call the store, convert."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from tensoryard import __version__
from tensoryard.errors import (
    Conflict,
    FieldIssue,
    NotFound,
    SpecError,
    StoreError,
    TensoryardError,
)
from tensoryard.executors.base import Executor
from tensoryard.server.auth import tokens_equal
from tensoryard.server.schemas import (
    AttemptOut,
    BatchSubmitIn,
    BatchSubmitOut,
    CheckpointOut,
    EventOut,
    JobListOut,
    JobOut,
    MetricOut,
    ReportIn,
    ReportOut,
    SubmitIn,
    SummaryOut,
    TeamIn,
    TeamOut,
)
from tensoryard.server.summary import summarize
from tensoryard.spec.job import JobSpec, parse_job_spec
from tensoryard.spec.states import TERMINAL_STATES, JobState
from tensoryard.store import Store

__all__ = ["create_app"]

API = "/api/v1"


class _Unauthorized(TensoryardError):
    pass


def _bearer(authorization: str | None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise _Unauthorized("missing bearer token (set TYARD_TOKEN or pass --token)")
    return authorization[7:].strip()


def create_app(
    *,
    store: Store,
    executor: Executor,
    admin_token: str,
    runs_dir: Path,
    kick: Callable[[], None] = lambda: None,
    loop_status: Callable[[], dict[str, Any]] = lambda: {},
) -> FastAPI:
    """Build the API. `kick` wakes the control loop after a submit or cancel; `loop_status`
    tells /healthz whether this replica leads the loop."""
    app = FastAPI(
        title="tensoryard",
        version=__version__,
        description="Submit, watch and control training jobs on a shared GPU cluster.",
    )

    # ---- errors -------------------------------------------------------------------------------

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse(
            status_code=422,
            content={"message": str(exc), "detail": [i.as_dict() for i in exc.issues]},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        issues = [
            FieldIssue(".".join(str(p) for p in e.get("loc", ())[1:]), str(e.get("msg", "")))
            for e in exc.errors()
        ]
        err = SpecError(issues, source="request")
        return JSONResponse(
            status_code=422,
            content={"message": str(err), "detail": [i.as_dict() for i in issues]},
        )

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(_: Request, exc: _Unauthorized) -> JSONResponse:
        return JSONResponse(
            status_code=401,
            content={"message": str(exc)},
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"message": str(exc)})

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"message": str(exc)})

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse(status_code=503, content={"message": f"database error: {exc}"})

    # ---- auth ---------------------------------------------------------------------------------

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        if not tokens_equal(_bearer(authorization), admin_token):
            raise _Unauthorized("invalid token")

    def job_or_admin(job_id: int, authorization: Annotated[str | None, Header()] = None) -> None:
        token = _bearer(authorization)
        if tokens_equal(token, admin_token) or store.check_job_token(job_id, token):
            return
        raise _Unauthorized("invalid token for this job")

    Admin = Depends(admin)

    # ---- routes -------------------------------------------------------------------------------

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, Any]:
        store.ping()  # touches the database
        return {"ok": True, "version": __version__, **loop_status()}

    @app.post(f"{API}/jobs", status_code=201, tags=["jobs"], dependencies=[Admin])
    def submit(body: SubmitIn) -> JobOut:
        spec = parse_job_spec(body.spec, source="request")
        try:
            job = store.create_job(spec, run_dir_root=runs_dir)
        except NotFound:  # the team: said in the spec's terms
            _check_submittable(store, spec)
            raise
        kick()
        return JobOut.model_validate(job)

    @app.post(f"{API}/jobs/batch", status_code=201, tags=["jobs"], dependencies=[Admin])
    def submit_batch(body: BatchSubmitIn) -> BatchSubmitOut:
        """Submit up to 1,000 jobs in one transaction (for scripts): all are stored, or none
        (a bad spec is named by its index, like `specs.3.resources.cpu`)."""
        specs: list[JobSpec] = []
        issues: list[FieldIssue] = []
        for i, raw in enumerate(body.specs):
            try:
                specs.append(parse_job_spec(raw, source="request"))
            except SpecError as exc:
                issues += [
                    FieldIssue(f"specs.{i}.{x.path}".rstrip("."), x.message, x.fix)
                    for x in exc.issues
                ]
        if issues:
            raise SpecError(issues, source="request")
        try:
            jobs = store.create_jobs(specs, run_dir_root=runs_dir)
        except NotFound:
            for spec in {s.team: s for s in specs}.values():
                _check_submittable(store, spec)
            raise
        kick()
        return BatchSubmitOut(ids=[j.id for j in jobs])

    @app.get(f"{API}/jobs", tags=["jobs"], dependencies=[Admin])
    def list_jobs(
        state: Annotated[list[str] | None, Query()] = None,
        team: str | None = None,
        user: str | None = None,
        name: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: str | None = None,
    ) -> JobListOut:
        states = _parse_states(state)
        page = store.list_jobs(
            states=states, team=team, user=user, name=name, limit=limit, cursor=cursor
        )
        return JobListOut(
            items=[JobOut.model_validate(j) for j in page.items],
            next_cursor=page.next_cursor,
            total=page.total,
        )

    @app.get(f"{API}/jobs/{{job_id}}", tags=["jobs"], dependencies=[Admin])
    def get_job(job_id: int) -> JobOut:
        return JobOut.model_validate(store.get_job(job_id))

    @app.post(f"{API}/jobs/{{job_id}}/cancel", tags=["jobs"], dependencies=[Admin])
    def cancel(job_id: int) -> JobOut:
        job = store.get_job(job_id)
        if job.state in TERMINAL_STATES:
            raise Conflict(f"job {job_id} already ended ({job.state.value}); nothing to cancel")
        job = store.request_cancel(job_id)
        kick()
        return JobOut.model_validate(job)

    @app.get(f"{API}/jobs/{{job_id}}/attempts", tags=["jobs"], dependencies=[Admin])
    def attempts(job_id: int) -> list[AttemptOut]:
        store.get_job(job_id)
        return [AttemptOut.model_validate(a) for a in store.list_attempts(job_id)]

    @app.get(f"{API}/jobs/{{job_id}}/events", tags=["jobs"], dependencies=[Admin])
    def events(
        job_id: int, after: Annotated[int, Query(ge=0)] = 0, limit: int = 1000
    ) -> list[EventOut]:
        store.get_job(job_id)
        return [
            EventOut.model_validate(e)
            for e in store.list_events(job_id, after_id=after, limit=limit)
        ]

    @app.get(f"{API}/jobs/{{job_id}}/metrics", tags=["jobs"], dependencies=[Admin])
    def metrics(
        job_id: int, attempt: int | None = None, after_step: int | None = None
    ) -> list[MetricOut]:
        store.get_job(job_id)
        rows = store.list_metrics(job_id, attempt=attempt, after_step=after_step)
        return [MetricOut.model_validate(m) for m in rows]

    @app.get(f"{API}/jobs/{{job_id}}/checkpoints", tags=["jobs"], dependencies=[Admin])
    def checkpoints(job_id: int) -> list[CheckpointOut]:
        store.get_job(job_id)
        return [CheckpointOut.model_validate(c) for c in store.list_checkpoints(job_id)]

    @app.get(f"{API}/jobs/{{job_id}}/summary", tags=["jobs"], dependencies=[Admin])
    def summary(job_id: int) -> SummaryOut:
        return summarize(store, job_id, now=datetime.now(UTC))

    @app.get(
        f"{API}/jobs/{{job_id}}/logs",
        tags=["jobs"],
        dependencies=[Admin],
        response_class=PlainTextResponse,
    )
    def logs(
        job_id: int,
        rank: Annotated[int, Query(ge=0)] = 0,
        attempt: int | None = None,
        follow: bool = False,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> Any:
        job = store.get_job(job_id)
        number = attempt or job.attempts
        if number < 1:
            return PlainTextResponse("", headers={"X-Next-Offset": "0"})
        record = store.get_attempt(job_id, number)
        paths = executor.log_paths(record.handle)
        if rank not in paths:
            raise NotFound(
                f"job {job_id} attempt {number} has no rank {rank}; ranks: "
                + ", ".join(str(r) for r in sorted(paths))
            )
        path = paths[rank]
        if not follow:
            data = _read_from(path, offset)
            return PlainTextResponse(
                data.decode("utf-8", "replace"), headers={"X-Next-Offset": str(offset + len(data))}
            )
        return StreamingResponse(
            _follow(store, job_id, number, path, offset), media_type="text/plain"
        )

    @app.post(f"{API}/jobs/{{job_id}}/report", tags=["runtime"])
    def report(job_id: int, body: ReportIn, _: None = Depends(job_or_admin)) -> ReportOut:
        job = store.get_job(job_id)
        if body.metrics:
            store.add_metrics(job_id, body.attempt, [m.model_dump() for m in body.metrics])
        known = (
            {(c.step, c.path) for c in store.list_checkpoints(job_id)}
            if body.checkpoints
            else set()
        )
        for c in body.checkpoints:
            if (c.step, c.path) in known:  # a re-sent report: stored already
                continue
            store.add_checkpoint(
                job_id, body.attempt, step=c.step, path=c.path, ts=c.ts, size_bytes=c.size_bytes
            )
            store.add_event(
                job_id, "checkpoint", f"checkpoint at step {c.step}", attempt=body.attempt
            )
        if body.resumed_from_step is not None:
            store.update_attempt(job_id, body.attempt, resumed_from_step=body.resumed_from_step)
        for e in body.events:
            store.add_event(job_id, e.kind, e.message, attempt=body.attempt)
        if body.heartbeat_at is not None:
            store.heartbeat(job_id, body.attempt, datetime.fromtimestamp(body.heartbeat_at, UTC))
        return ReportOut(cancel=job.cancel_requested)

    @app.get(f"{API}/teams", tags=["teams"], dependencies=[Admin])
    def teams() -> list[TeamOut]:
        return [TeamOut.model_validate(t) for t in store.list_teams()]

    @app.post(f"{API}/teams", status_code=201, tags=["teams"], dependencies=[Admin])
    def create_team(body: TeamIn) -> TeamOut:
        team = store.ensure_team(
            body.name,
            gpu_quota=body.gpu_quota,
            cpu_quota=body.cpu_quota,
            description=body.description,
        )
        return TeamOut.model_validate(team)

    return app


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


def _read_from(path: Path, offset: int, limit: int = 8 * 1024 * 1024) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(limit)
    except FileNotFoundError:
        return b""


async def _follow(
    store: Store, job_id: int, attempt: int, path: Path, offset: int
) -> AsyncIterator[bytes]:
    """Yield new bytes of `path` until the attempt has finished and the file is drained."""
    while True:
        chunk = await asyncio.to_thread(_read_from, path, offset, 1024 * 1024)
        if chunk:
            offset += len(chunk)
            yield chunk
            continue
        record = await asyncio.to_thread(store.get_attempt, job_id, attempt)
        if record.finished_at is not None:
            tail = await asyncio.to_thread(_read_from, path, offset)
            if tail:
                yield tail
            return
        await asyncio.sleep(0.25)
