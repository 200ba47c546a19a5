"""The in-job runtime's report: metrics, checkpoints (checked against the job's paths, then
its retention policy), events, timings, heartbeats and in-place restarts (docs/contracts.md
section 2)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from fastapi import Depends, FastAPI
from pydantic import ValidationError

from tensoryard.api.access import JOB_EVENT_KINDS
from tensoryard.api.guard import Guard, JobId, Reporter
from tensoryard.errors import (
    Conflict,
    Forbidden,
    TensoryardError,
)
from tensoryard.registry.pruning import CheckpointPruner, job_paths
from tensoryard.registry.service import detect_format
from tensoryard.server.faults import crashpoint
from tensoryard.server.schemas import (
    ReportIn,
    ReportOut,
)
from tensoryard.spec.job import JobSpec
from tensoryard.store import JobRecord, Store

__all__ = ["add_report_routes"]

log = logging.getLogger("tensoryard.api")


def add_report_routes(
    app: FastAPI,
    *,
    store: Store,
    guard: Guard,
    prefix: str,
    protected: tuple[Path, ...],
    restarted: Callable[[JobRecord, str], None],
) -> None:
    """Register /jobs/{id}/report under `prefix` (job tokens); `restarted` counts an in-place
    restart it records."""

    @app.post(f"{prefix}/jobs/{{job_id}}/report", tags=["runtime"])
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


def _visible_format(path: str) -> str | None:
    """The format of a reported checkpoint the runtime did not name, when this control plane
    can see its path (the local executor); None otherwise (e.g. a pod-local volume)."""
    try:
        where = Path(path)
        return detect_format(where) if where.exists() else None
    except OSError:
        return None


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
