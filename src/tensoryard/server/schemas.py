"""Wire models of the REST API (v1). Store records are converted here, never leaked."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tensoryard.spec.job import NAME_PATTERN

__all__ = [
    "AttemptOut",
    "BatchSubmitIn",
    "BatchSubmitOut",
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


MAX_BATCH = 1000


class BatchSubmitIn(BaseModel):
    """Several submissions at once: stored in one transaction, all or none."""

    specs: list[dict[str, Any]] = Field(
        ..., min_length=1, max_length=MAX_BATCH, description="JobSpecs, as in job YAML files."
    )


class BatchSubmitOut(BaseModel):
    """The ids of the stored jobs, in the order of the request."""

    ids: list[int]


class _FromRecord(BaseModel):
    """Built from a store record with `model_validate(record)` (attributes, not a dict)."""

    model_config = ConfigDict(from_attributes=True)


class JobOut(_FromRecord):
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


class JobListOut(BaseModel):
    items: list[JobOut]
    next_cursor: str | None
    total: int


class AttemptOut(_FromRecord):
    number: int
    state: str
    started_at: datetime
    finished_at: datetime | None
    exit_code: int | None
    reason: str
    resumed_from_step: int | None
    last_heartbeat: datetime | None


class EventOut(_FromRecord):
    id: int
    ts: datetime
    kind: str
    message: str
    attempt: int | None


class MetricOut(_FromRecord):
    attempt: int
    step: int
    ts: float
    step_time_s: float | None
    values: dict[str, float]


class CheckpointOut(_FromRecord):
    attempt: int
    step: int
    path: str
    ts: float
    size_bytes: int | None


class TeamIn(BaseModel):
    name: str = Field(..., pattern=NAME_PATTERN)
    gpu_quota: int | None = Field(None, ge=0)
    cpu_quota: float | None = Field(None, ge=0)
    description: str = ""


class TeamOut(_FromRecord):
    name: str
    gpu_quota: int | None
    cpu_quota: float | None
    description: str
    created_at: datetime


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
