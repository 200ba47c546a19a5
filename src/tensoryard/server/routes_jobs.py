"""Routes of jobs: submit (one or a batch, idempotent by key), list, read, cancel, and what a
job has recorded (attempts, events, metrics, checkpoints, summary)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request

from tensoryard.api.access import Action, Principal, authorize
from tensoryard.api.guard import INT32, Guard, JobId
from tensoryard.errors import (
    Conflict,
    FieldIssue,
    Forbidden,
    NotFound,
    SpecError,
)
from tensoryard.images import ImageRefError, validate_image_ref
from tensoryard.registry.paths import protected_overlap
from tensoryard.server.schemas import (
    AttemptOut,
    BatchSubmitIn,
    BatchSubmitOut,
    CheckpointOut,
    CheckpointRemovalOut,
    EventOut,
    JobListOut,
    JobOut,
    MetricOut,
    SubmitIn,
    SummaryOut,
)
from tensoryard.server.summary import summarize
from tensoryard.spec._common import load_yaml_text
from tensoryard.spec.job import JobSpec, parse_job_spec
from tensoryard.spec.states import TERMINAL_STATES, JobState
from tensoryard.store import JobRecord, Store

__all__ = ["IDEMPOTENCY_KEY_MAX", "add_job_routes"]


def add_job_routes(
    app: FastAPI,
    *,
    store: Store,
    guard: Guard,
    prefix: str,
    runs_dir: Path,
    protected: tuple[Path, ...],
    kick: Callable[[], None],
    fits: Callable[[JobSpec], None],
) -> None:
    """Register /jobs (submit, batch submit, list) and /jobs/{id} (read, cancel, attempts,
    events, metrics, checkpoints, summary) under `prefix`. `protected` are the directories no
    spec may point into; `fits` refuses a job the cluster could never hold; `kick` wakes the
    control loop."""

    def visible_job(request: Request, who: Principal, job_id: int) -> JobRecord:
        job = store.get_job(job_id)
        guard.check(request, who, Action.JOB_READ, team=job.team, obj=f"job/{job_id}")
        return job

    @app.post(f"{prefix}/jobs", status_code=201, tags=["jobs"])
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
        # The team's existence is checked by the insert's own transaction (one per submit):
        # read here first only for a refusal, so that an unknown team is named as such.
        try:
            authorize(who, Action.JOB_SUBMIT, spec.team)
        except Forbidden:
            _check_submittable(store, spec)
        guard.check(request, who, Action.JOB_SUBMIT, team=spec.team, obj=f"team/{spec.team}")
        fits(spec)
        try:
            job = store.create_job(
                spec, run_dir_root=runs_dir, audit=guard.context(request, who), key=key
            )
        except NotFound:
            _check_submittable(store, spec)  # the team went away, or never was: named so
            raise
        kick()
        return JobOut.model_validate(job)

    @app.post(f"{prefix}/jobs/batch", status_code=201, tags=["jobs"])
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

    @app.get(f"{prefix}/jobs", tags=["jobs"])
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

    @app.get(f"{prefix}/jobs/{{job_id}}", tags=["jobs"])
    def get_job(job_id: JobId, request: Request, who: Principal = Depends(guard.user)) -> JobOut:
        return JobOut.model_validate(visible_job(request, who, job_id))

    @app.post(f"{prefix}/jobs/{{job_id}}/cancel", tags=["jobs"])
    def cancel(job_id: JobId, request: Request, who: Principal = Depends(guard.user)) -> JobOut:
        """Cancel a job of a team where you are a member (or team-admin)."""
        job = store.get_job(job_id)
        guard.check(request, who, Action.JOB_CANCEL, team=job.team, obj=f"job/{job_id}")
        if job.state in TERMINAL_STATES:
            raise Conflict(f"job {job_id} already ended ({job.state.value}); nothing to cancel")
        job = store.request_cancel(job_id, audit=guard.context(request, who))
        kick()
        return JobOut.model_validate(job)

    @app.get(f"{prefix}/jobs/{{job_id}}/attempts", tags=["jobs"])
    def attempts(
        job_id: JobId, request: Request, who: Principal = Depends(guard.user)
    ) -> list[AttemptOut]:
        visible_job(request, who, job_id)
        return [AttemptOut.model_validate(a) for a in store.list_attempts(job_id)]

    @app.get(f"{prefix}/jobs/{{job_id}}/events", tags=["jobs"])
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

    @app.get(f"{prefix}/jobs/{{job_id}}/metrics", tags=["jobs"])
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

    @app.get(f"{prefix}/jobs/{{job_id}}/checkpoints", tags=["jobs"])
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

    @app.get(f"{prefix}/jobs/{{job_id}}/checkpoint-removals", tags=["jobs"])
    def checkpoint_removals(
        job_id: JobId, request: Request, who: Principal = Depends(guard.user)
    ) -> list[CheckpointRemovalOut]:
        """The job's checkpoints that its retention policy removed, by step."""
        visible_job(request, who, job_id)
        return [CheckpointRemovalOut.model_validate(r) for r in store.checkpoint_removals(job_id)]

    @app.get(f"{prefix}/jobs/{{job_id}}/summary", tags=["jobs"])
    def summary(
        job_id: JobId, request: Request, who: Principal = Depends(guard.user)
    ) -> SummaryOut:
        visible_job(request, who, job_id)
        return summarize(store, job_id, now=datetime.now(UTC))


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
