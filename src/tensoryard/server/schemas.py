"""Wire models of the REST API (v1). Store records are converted here, never leaked."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from tensoryard.store import (
    AttemptRecord,
    CheckpointRecord,
    EventRecord,
    JobRecord,
    MetricRecord,
    TeamRecord,
)

__all__ = [
    "AttemptOut",
    "CheckpointOut",
    "EventOut",
    "JobListOut",
    "JobOut",
    "MetricOut",
    "ReportIn",
    "ReportOut",
    "SubmitIn",
    "SummaryOut",
    "TeamIn",
    "TeamOut",
]


class SubmitIn(BaseModel):
    """A submission: the JobSpec as a mapping (validated by the spec language, not here)."""

    spec: dict[str, Any] = Field(..., description="A JobSpec, as in a job YAML file.")


class JobOut(BaseModel):
    id: int
    name: str
    team: str
    user: str
    priority: int
    state: str
    reason: str
    pending_reason: str
    pending_eta: datetime | None
    created_at: datetime
    updated_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    restarts: int
    cancel_requested: bool
    placement: dict[str, list[int]]
    run_dir: str
    last_heartbeat: datetime | None
    spec: dict[str, Any]

    @classmethod
    def of(cls, job: JobRecord) -> JobOut:
        return cls(
            id=job.id,
            name=job.name,
            team=job.team,
            user=job.user,
            priority=job.priority,
            state=job.state.value,
            reason=job.reason,
            pending_reason=job.pending_reason,
            pending_eta=job.pending_eta,
            created_at=job.created_at,
            updated_at=job.updated_at,
            admitted_at=job.admitted_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            attempts=job.attempts,
            restarts=job.restarts,
            cancel_requested=job.cancel_requested,
            placement={k: list(v) for k, v in job.placement.items()},
            run_dir=job.run_dir,
            last_heartbeat=job.last_heartbeat,
            spec=job.spec,
        )


class JobListOut(BaseModel):
    items: list[JobOut]
    next_cursor: str | None
    total: int


class AttemptOut(BaseModel):
    number: int
    state: str
    started_at: datetime
    finished_at: datetime | None
    exit_code: int | None
    reason: str
    resumed_from_step: int | None
    last_heartbeat: datetime | None

    @classmethod
    def of(cls, a: AttemptRecord) -> AttemptOut:
        return cls(
            number=a.number,
            state=a.state,
            started_at=a.started_at,
            finished_at=a.finished_at,
            exit_code=a.exit_code,
            reason=a.reason,
            resumed_from_step=a.resumed_from_step,
            last_heartbeat=a.last_heartbeat,
        )


class EventOut(BaseModel):
    id: int
    ts: datetime
    kind: str
    message: str
    attempt: int | None

    @classmethod
    def of(cls, e: EventRecord) -> EventOut:
        return cls(id=e.id, ts=e.ts, kind=e.kind, message=e.message, attempt=e.attempt)


class MetricOut(BaseModel):
    attempt: int
    step: int
    ts: float
    step_time_s: float | None
    values: dict[str, float]

    @classmethod
    def of(cls, m: MetricRecord) -> MetricOut:
        return cls(
            attempt=m.attempt,
            step=m.step,
            ts=m.ts,
            step_time_s=m.step_time_s,
            values=dict(m.values),
        )


class CheckpointOut(BaseModel):
    attempt: int
    step: int
    path: str
    ts: float
    size_bytes: int | None

    @classmethod
    def of(cls, c: CheckpointRecord) -> CheckpointOut:
        return cls(attempt=c.attempt, step=c.step, path=c.path, ts=c.ts, size_bytes=c.size_bytes)


class TeamIn(BaseModel):
    name: str = Field(..., pattern=r"^[a-z][a-z0-9-]{0,62}$")
    gpu_quota: int | None = Field(None, ge=0)
    cpu_quota: float | None = Field(None, ge=0)
    description: str = ""


class TeamOut(BaseModel):
    name: str
    gpu_quota: int | None
    cpu_quota: float | None
    description: str
    created_at: datetime

    @classmethod
    def of(cls, t: TeamRecord) -> TeamOut:
        return cls(
            name=t.name,
            gpu_quota=t.gpu_quota,
            cpu_quota=t.cpu_quota,
            description=t.description,
            created_at=t.created_at,
        )


class MetricIn(BaseModel):
    step: int = Field(..., ge=0)
    ts: float
    step_time_s: float | None = None
    values: dict[str, float] = Field(default_factory=dict)


class CheckpointIn(BaseModel):
    step: int = Field(..., ge=0)
    path: str
    ts: float
    size_bytes: int | None = None


class EventIn(BaseModel):
    kind: str = "runtime"
    message: str


class ReportIn(BaseModel):
    """What the in-job runtime sends (docs/contracts.md section 2)."""

    attempt: int = Field(..., ge=1)
    heartbeat_at: float | None = None
    resumed_from_step: int | None = None
    metrics: list[MetricIn] = Field(default_factory=list)
    checkpoints: list[CheckpointIn] = Field(default_factory=list)
    events: list[EventIn] = Field(default_factory=list)


class ReportOut(BaseModel):
    ok: bool = True
    cancel: bool = False


class SummaryOut(BaseModel):
    """The numbers a researcher wants when a job ends."""

    job_id: int
    name: str
    state: str
    restarts: int
    attempts: int
    steps: int
    initial_loss: float | None
    final_loss: float | None
    wall_s: float | None
    goodput: float | None
    steps_lost: int
    last_checkpoint_step: int | None
