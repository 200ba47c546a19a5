"""REST routes of pipelines: submit a run, list, show, cancel.

Access follows jobs: a pipeline belongs to a team; members submit and cancel it, viewers see it
(`job.submit`, `job.cancel`, `job.read` on the pipeline's team).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Request

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import INT32, Guard
from tensoryard.errors import FieldIssue, SpecError
from tensoryard.server.pipelines import check_deploy_steps
from tensoryard.server.schemas import PipelineIn, PipelineOut
from tensoryard.spec.pipeline import parse_pipeline_spec, resolve_params
from tensoryard.store import PipelineRecord, Store

__all__ = ["add_pipeline_routes"]

PipelineId = Annotated[int, Path(ge=1, le=INT32, description="Pipeline id.")]
PIPELINE_STATES = ("RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


def add_pipeline_routes(
    app: FastAPI,
    *,
    store: Store,
    guard: Guard,
    prefix: str,
    kick: Callable[[], None],
    kubernetes: bool = False,
) -> None:
    """Add /pipelines routes to the app; ``kubernetes``: GPU engines' deploy steps can run."""

    def visible(request: Request, who: Principal, pipeline_id: int) -> PipelineRecord:
        record = store.get_pipeline(pipeline_id)
        guard.check(request, who, Action.JOB_READ, team=record.team, obj=f"pipeline/{record.id}")
        return record

    @app.post(f"{prefix}/pipelines", status_code=201, tags=["pipelines"])
    def submit_pipeline(
        body: PipelineIn, request: Request, who: Principal = Depends(guard.user)
    ) -> PipelineOut:
        """Start a pipeline run in a team you are a member of. The spec is checked whole
        (unknown steps, cycles, unknown parameters, bad expressions: 422 naming the field)
        before anything is stored."""
        spec = parse_pipeline_spec({**body.spec, "user": who.name}, source="request")
        check_deploy_steps(spec, kubernetes=kubernetes)
        params = resolve_params(spec, body.params)
        guard.check(request, who, Action.JOB_SUBMIT, team=spec.team, obj=f"team/{spec.team}")
        record = store.create_pipeline(spec, params, audit=guard.context(request, who))
        kick()
        return PipelineOut.model_validate(record)

    @app.get(f"{prefix}/pipelines", tags=["pipelines"])
    def list_pipelines(
        request: Request,
        who: Principal = Depends(guard.user),
        team: str | None = None,
        state: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> list[PipelineOut]:
        """Pipelines of the teams you may see, newest first."""
        if team is not None:
            guard.check(request, who, Action.JOB_READ, team=team, obj=f"team/{team}")
        states = None
        if state is not None:
            states = [s.strip().upper() for s in state.split(",")]
            bad = [s for s in states if s not in PIPELINE_STATES]
            if bad:
                raise SpecError(
                    [
                        FieldIssue(
                            "state",
                            f"unknown state {bad[0]!r}",
                            f"use one of: {', '.join(PIPELINE_STATES)}",
                        )
                    ],
                    source="query",
                )
        records = store.list_pipelines(
            teams=who.visible_teams(), team=team, states=states, limit=limit
        )
        return [PipelineOut.model_validate(r) for r in records]

    @app.get(f"{prefix}/pipelines/{{pipeline_id}}", tags=["pipelines"])
    def get_pipeline(
        pipeline_id: PipelineId, request: Request, who: Principal = Depends(guard.user)
    ) -> PipelineOut:
        return PipelineOut.model_validate(visible(request, who, pipeline_id))

    @app.post(f"{prefix}/pipelines/{{pipeline_id}}/cancel", tags=["pipelines"])
    def cancel_pipeline(
        pipeline_id: PipelineId, request: Request, who: Principal = Depends(guard.user)
    ) -> PipelineOut:
        """Cancel a run: its running jobs get the cancel signal (checkpoint first), steps
        that have not started are cancelled; 409 when it already ended."""
        record = store.get_pipeline(pipeline_id)
        guard.check(request, who, Action.JOB_CANCEL, team=record.team, obj=f"pipeline/{record.id}")
        record = store.request_pipeline_cancel(pipeline_id, audit=guard.context(request, who))
        kick()
        return PipelineOut.model_validate(record)
