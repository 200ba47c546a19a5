"""Frozen records the store hands out (never ORM objects). Datetimes are timezone-aware UTC."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tensoryard.spec.states import JobState

__all__ = [
    "AttemptRecord",
    "CheckpointRecord",
    "EventRecord",
    "JobPage",
    "JobRecord",
    "MetricRecord",
    "StepProgress",
    "TeamRecord",
]


@dataclass(frozen=True)
class TeamRecord:
    """A team and its quotas (None: no limit)."""

    name: str
    created_at: datetime
    gpu_quota: int | None
    cpu_quota: float | None
    description: str


@dataclass(frozen=True)
class JobRecord:
    """A job as stored: its spec, state, timestamps and scheduling status."""

    id: int
    name: str
    team: str
    user: str
    priority: int
    state: JobState
    spec: dict[str, Any]  # JobSpec.model_dump(mode="json")
    created_at: datetime
    updated_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int  # number of attempts started
    restarts: int
    reason: str  # latest human-readable state reason
    pending_reason: str
    pending_eta: datetime | None
    cancel_requested: bool
    run_dir: str
    placement: dict[str, Any]  # node -> GPU indices (may be {})
    last_heartbeat: datetime | None
    run_time_s: float = 0.0  # run time of the finished attempts
    changed_at: datetime | None = None


@dataclass(frozen=True)
class AttemptRecord:
    """One launch of a job (1-based number) and how it ended."""

    job_id: int
    number: int
    state: str
    handle: dict[str, Any]
    started_at: datetime
    finished_at: datetime | None
    exit_code: int | None
    reason: str
    resumed_from_step: int | None
    last_heartbeat: datetime | None
    attempt_key: str = ""
    running_at: datetime | None = None


@dataclass(frozen=True)
class EventRecord:
    """A line of a job's history; ids grow monotonically per database."""

    id: int
    job_id: int
    ts: datetime
    kind: str
    message: str
    attempt: int | None


@dataclass(frozen=True)
class MetricRecord:
    """One reported training step."""

    job_id: int
    attempt: int
    step: int
    ts: float  # unix seconds
    step_time_s: float | None
    values: dict[str, float]


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint written by a job."""

    job_id: int
    attempt: int
    step: int
    path: str
    ts: float  # unix seconds
    size_bytes: int | None


@dataclass(frozen=True)
class JobPage:
    """One page of a job listing; pass ``next_cursor`` back to get the next (None: last page)."""

    items: list[JobRecord]
    next_cursor: str | None
    total: int


@dataclass(frozen=True)
class StepProgress:
    """How an attempt's steps advance: for hang detection."""

    steps: int  # step rows looked at (the newest ones)
    last_step: int | None
    last_ts: float | None  # unix seconds of the newest step row
    median_step_s: float | None  # median time between consecutive steps among them
