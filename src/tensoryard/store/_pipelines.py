"""Pipelines and their steps: the store's pipeline half (a mixin of Store).

Every change is one transaction under the pipeline row's lock and a compare-and-set on the
step's state (and try number), so two advancers (a restarted control plane, a new leader)
cannot submit a step twice: the second one finds the state moved on and gets a Conflict.
A step's job is inserted in the same transaction that moves the step to RUNNING.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tensoryard.errors import Conflict, FieldIssue, NotFound, SpecError
from tensoryard.spec.job import JobSpec
from tensoryard.spec.pipeline import PipelineSpec
from tensoryard.store._rows import RowReader
from tensoryard.store.models import Job, Pipeline, PipelineStep, Team
from tensoryard.store.records import (
    PIPELINE_TERMINAL,
    STEP_TERMINAL,
    AuditContext,
    PipelineRecord,
    StepRecord,
)

__all__ = ["PipelineMixin"]

MAX_PIPELINE_PAGE = 1000


class PipelineMixin:
    """Pipeline rows. Needs ``_tx``, ``_now``, ``_event``, ``_audit`` and ``_new_job``."""

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

        def _event(
            self, s: Session, job_id: int, kind: str, message: str, *, attempt: int | None = None
        ) -> Any: ...

        def _audit(
            self,
            s: Session,
            audit: AuditContext | None,
            action: str,
            obj: str,
            *,
            outcome: str = "ok",
            detail: str = "",
        ) -> Any: ...

        @staticmethod
        def _new_job(spec: JobSpec, now: datetime) -> Job: ...

    def create_pipeline(
        self,
        spec: PipelineSpec,
        params: Mapping[str, Any],
        *,
        audit: AuditContext | None = None,
    ) -> PipelineRecord:
        """Store a RUNNING pipeline and one WAITING row per step, in one transaction."""
        with self._tx(f"create pipeline {spec.name!r}", write=True) as s:
            if s.get(Team, spec.team) is None:
                known = ", ".join(s.scalars(select(Team.name).order_by(Team.name))) or "none"
                raise SpecError(
                    [
                        FieldIssue(
                            "team",
                            f"unknown team {spec.team!r}",
                            f"use one of: {known}; or create it with `tyard teams create`",
                        )
                    ]
                )
            now = self._now()
            row = Pipeline(
                name=spec.name,
                team=spec.team,
                user=spec.user,
                state="RUNNING",
                spec=spec.model_dump(mode="json", by_alias=True),
                params=dict(params),
                created_at=now,
                updated_at=now,
                cancel_requested=False,
                reason="submitted",
            )
            s.add(row)
            s.flush()
            for position, name in enumerate(spec.order()):
                s.add(
                    PipelineStep(
                        pipeline_id=row.id,
                        name=name,
                        position=position,
                        state="WAITING",
                        tries=0,
                        job_ids=[],
                        input_hash="",
                        cached_from="",
                        outputs={},
                        reason="waiting for its needs",
                    )
                )
            self._audit(s, audit, "pipeline.submit", f"pipeline/{row.id}", detail=spec.team)
            s.flush()
            return _record(row, _steps(s, row.id))

    def get_pipeline(self, pipeline_id: int) -> PipelineRecord:
        """The pipeline with its steps, or NotFound."""
        with self._tx(f"read pipeline {pipeline_id}", write=False) as s:
            row = s.get(Pipeline, pipeline_id)
            if row is None:
                raise NotFound(f"pipeline {pipeline_id} does not exist")
            return _record(row, _steps(s, pipeline_id))

    def list_pipelines(
        self,
        *,
        teams: Iterable[str] | None = None,
        team: str | None = None,
        states: Iterable[str] | None = None,
        limit: int = 50,
    ) -> list[PipelineRecord]:
        """Pipelines newest first (with steps); ``teams`` limits to what a caller may see."""
        if not 1 <= limit <= MAX_PIPELINE_PAGE:
            raise SpecError(
                [FieldIssue("limit", f"{limit} is out of range", f"use 1..{MAX_PIPELINE_PAGE}")]
            )
        query = select(Pipeline).order_by(Pipeline.id.desc()).limit(limit)
        if teams is not None:
            query = query.where(Pipeline.team.in_(list(teams)))
        if team is not None:
            query = query.where(Pipeline.team == team)
        if states is not None:
            query = query.where(Pipeline.state.in_(list(states)))
        with self._tx("list pipelines", write=False) as s:
            rows = list(s.scalars(query))
            steps = _steps_of(s, [r.id for r in rows])
            return [_record(r, steps.get(r.id, [])) for r in rows]

    def running_pipelines(self) -> list[PipelineRecord]:
        """Every RUNNING pipeline with its steps, oldest first (what the advancer walks)."""
        with self._tx("list running pipelines", write=False) as s:
            query = select(Pipeline).where(Pipeline.state == "RUNNING").order_by(Pipeline.id)
            rows = list(s.scalars(query))
            if not rows:
                return []
            steps = _steps_of(s, [r.id for r in rows])
            return [_record(r, steps.get(r.id, [])) for r in rows]

    def request_pipeline_cancel(
        self, pipeline_id: int, *, audit: AuditContext | None = None
    ) -> PipelineRecord:
        """Ask the advancer to cancel the pipeline's running jobs and unstarted steps."""
        with self._tx(f"cancel pipeline {pipeline_id}", write=True) as s:
            row = _lock(s, pipeline_id)
            if row.state in PIPELINE_TERMINAL:
                raise Conflict(
                    f"pipeline {pipeline_id} already ended ({row.state}); nothing to cancel"
                )
            row.cancel_requested = True
            row.updated_at = self._now()
            self._audit(s, audit, "pipeline.cancel", f"pipeline/{pipeline_id}")
            return _record(row, _steps(s, pipeline_id))

    def submit_step(
        self,
        pipeline_id: int,
        step: str,
        *,
        expected_tries: int,
        job: JobSpec,
        input_hash: str,
        run_dir_root: Path,
        reason: str,
    ) -> StepRecord:
        """Insert the step's job and move the step to RUNNING, in one transaction.

        Conflict when the step is no longer WAITING at ``expected_tries`` (another advancer
        submitted it) or the pipeline stopped running."""
        with self._tx(f"submit step {step!r} of pipeline {pipeline_id}", write=True) as s:
            pipe = _lock(s, pipeline_id)
            row = _step(s, pipeline_id, step)
            if pipe.state != "RUNNING" or pipe.cancel_requested:
                raise Conflict(f"pipeline {pipeline_id} is {pipe.state}; not submitting {step}")
            if row.state != "WAITING" or row.tries != expected_tries:
                raise Conflict(
                    f"step {step!r} of pipeline {pipeline_id} is {row.state} after "
                    f"{row.tries} tries (expected WAITING after {expected_tries})"
                )
            now = self._now()
            new = self._new_job(job, now)
            s.add(new)
            s.flush()
            new.run_dir = str(Path(run_dir_root) / f"job-{new.id}")
            self._event(
                s,
                new.id,
                "submitted",
                f"submitted by pipeline {pipeline_id} ({pipe.name}) for step {step}, "
                f"try {row.tries + 1}",
            )
            row.state = "RUNNING"
            row.tries += 1
            row.job_id = new.id
            row.job_ids = [*row.job_ids, new.id]
            row.input_hash = input_hash
            row.reason = reason
            row.started_at = row.started_at or now
            pipe.updated_at = now
            return _step_record(row)

    def set_step(
        self,
        pipeline_id: int,
        step: str,
        *,
        expected: Iterable[str],
        state: str,
        reason: str,
        outputs: Mapping[str, Any] | None = None,
        input_hash: str | None = None,
        cached_from: str | None = None,
    ) -> StepRecord:
        """Move a step from one of the ``expected`` states (compare-and-set; else Conflict)."""
        allowed = set(expected)
        with self._tx(f"update step {step!r} of pipeline {pipeline_id}", write=True) as s:
            pipe = _lock(s, pipeline_id)
            row = _step(s, pipeline_id, step)
            if row.state not in allowed:
                raise Conflict(
                    f"step {step!r} of pipeline {pipeline_id} is {row.state}, not one of "
                    f"{', '.join(sorted(allowed))}"
                )
            now = self._now()
            row.state = state
            row.reason = reason
            if outputs is not None:
                row.outputs = dict(outputs)
            if input_hash is not None:
                row.input_hash = input_hash
            if cached_from is not None:
                row.cached_from = cached_from
            if state == "RUNNING":  # a step that runs without a job (deploy) starts here
                row.started_at = row.started_at or now
            if state in STEP_TERMINAL:
                row.finished_at = now
            pipe.updated_at = now
            return _step_record(row)

    def finish_pipeline(self, pipeline_id: int, state: str, reason: str) -> PipelineRecord:
        """Move a RUNNING pipeline to a terminal state (Conflict when it already ended)."""
        with self._tx(f"finish pipeline {pipeline_id}", write=True) as s:
            row = _lock(s, pipeline_id)
            if row.state != "RUNNING":
                raise Conflict(f"pipeline {pipeline_id} already ended ({row.state})")
            now = self._now()
            row.state, row.reason = state, reason
            row.updated_at = row.finished_at = now
            return _record(row, _steps(s, pipeline_id))

    def find_cached_step(self, team: str, input_hash: str) -> StepRecord | None:
        """The newest SUCCEEDED step of the team's pipelines with these inputs, or None."""
        query = (
            select(PipelineStep)
            .join(Pipeline, Pipeline.id == PipelineStep.pipeline_id)
            .where(
                Pipeline.team == team,
                PipelineStep.input_hash == input_hash,
                PipelineStep.state == "SUCCEEDED",
            )
            .order_by(PipelineStep.finished_at.desc())
            .limit(1)
        )
        with self._tx("look up a cached step", write=False) as s:
            row = s.scalars(query).first()
            return None if row is None else _step_record(row)

    def pipeline_counts(self) -> dict[str, int]:
        """State -> number of pipelines."""
        with self._tx("count pipelines", write=False) as s:
            query = select(Pipeline.state, func.count()).group_by(Pipeline.state)
            return {str(st): int(n) for st, n in s.execute(query)}


def _lock(s: Session, pipeline_id: int) -> Pipeline:
    row = s.get(Pipeline, pipeline_id, with_for_update=True)
    if row is None:
        raise NotFound(f"pipeline {pipeline_id} does not exist")
    return row


def _step(s: Session, pipeline_id: int, name: str) -> PipelineStep:
    row = s.get(PipelineStep, (pipeline_id, name))
    if row is None:
        raise NotFound(f"pipeline {pipeline_id} has no step {name!r}")
    return row


def _steps(s: Session, pipeline_id: int) -> list[PipelineStep]:
    query = (
        select(PipelineStep)
        .where(PipelineStep.pipeline_id == pipeline_id)
        .order_by(PipelineStep.position)
    )
    return list(s.scalars(query))


def _steps_of(s: Session, ids: list[int]) -> dict[int, list[PipelineStep]]:
    out: dict[int, list[PipelineStep]] = {}
    if not ids:
        return out
    query = (
        select(PipelineStep)
        .where(PipelineStep.pipeline_id.in_(ids))
        .order_by(PipelineStep.pipeline_id, PipelineStep.position)
    )
    for row in s.scalars(query):
        out.setdefault(row.pipeline_id, []).append(row)
    return out


_step_record = RowReader(
    StepRecord,
    PipelineStep,
    convert={"job_ids": lambda ids: tuple(int(j) for j in ids), "outputs": dict},
)
_pipeline_record = RowReader(
    PipelineRecord, Pipeline, convert={"spec": dict, "params": dict}, given=("steps",)
)


def _record(row: Pipeline, steps: list[PipelineStep]) -> PipelineRecord:
    return _pipeline_record(row, steps=tuple(_step_record(st) for st in steps))
