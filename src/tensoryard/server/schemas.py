"""Wire models of the REST API (v1). Store records are converted here, never leaked."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from tensoryard.server.projection import FromRecord
from tensoryard.spec.job import NAME_PATTERN
from tensoryard.spec.redact import REDACTED, redact_spec
from tensoryard.store import CheckpointRemovalRecord
from tensoryard.store.records import (
    AttemptRecord,
    CheckpointRecord,
    EventRecord,
    JobRecord,
    MetricRecord,
    PipelineRecord,
    StepRecord,
    TeamRecord,
)

__all__ = [
    "REDACTED",
    "AttemptOut",
    "BatchSubmitIn",
    "BatchSubmitOut",
    "CheckpointOut",
    "CheckpointRemovalOut",
    "ErrorOut",
    "EventOut",
    "FromRecord",
    "JobListOut",
    "JobOut",
    "MetricOut",
    "PipelineIn",
    "PipelineOut",
    "RedactedSpec",
    "ReportIn",
    "ReportOut",
    "StepOut",
    "SubmitIn",
    "SummaryOut",
    "TeamIn",
    "TeamOut",
    "TeamPatch",
    "redact_spec",
]

INT32 = 2**31 - 1  # the database's INTEGER
INT64 = 2**63 - 1
# Unix seconds between 1970 and 5138: anything else is a bug, and would overflow datetimes.
UnixTime = Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=INT32)]
Role = Literal["viewer", "member", "team-admin"]
Scope = Literal["read", "write", "admin"]


REDACTED_MARK = {"x-redacted": True}
"""Marks a free-form response field as passed through :func:`redact_spec` (OpenAPI)."""

RedactedSpec = Annotated[
    dict[str, Any],
    AfterValidator(redact_spec),
    Field(json_schema_extra=REDACTED_MARK),
]
"""A spec in a response: env values shown as ``***``."""


class ErrorOut(BaseModel):
    """Every error answer: a sentence that names the problem and the fix; field issues on 422."""

    message: str
    detail: list[dict[str, str]] | None = None


class SubmitIn(BaseModel):
    """A submission: the JobSpec as a mapping, or as the YAML text of a job file (validated by
    the spec language, not here). Exactly one of the two."""

    spec: dict[str, Any] | None = Field(None, description="A JobSpec, as in a job YAML file.")
    spec_yaml: str | None = Field(
        None,
        description="The text of a job YAML file (as `tyard submit` reads it: safe types only, "
        "at most 256 KiB); `workdir` must then be given.",
    )


MAX_BATCH = 1000


class BatchSubmitIn(BaseModel):
    """Several submissions at once: stored in one transaction, all or none."""

    specs: list[dict[str, Any]] = Field(
        ..., min_length=1, max_length=MAX_BATCH, description="JobSpecs, as in job YAML files."
    )


class BatchSubmitOut(BaseModel):
    """The ids of the stored jobs, in the order of the request."""

    ids: list[int]


class JobOut(FromRecord, record=JobRecord, internal=("run_time_s", "changed_at")):
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
    spec: RedactedSpec = Field(
        ..., description="The JobSpec as stored; env values are always shown as ***."
    )


class JobListOut(BaseModel):
    items: list[JobOut]
    next_cursor: str | None
    total: int


class AttemptOut(
    FromRecord,
    record=AttemptRecord,
    internal=(
        "job_id",
        "handle",
        "attempt_key",
        "running_at",
        "checkpoint_save_s",
        "checkpoint_restore_s",
        "admitted_at",
    ),
):
    number: int
    state: str
    started_at: datetime
    finished_at: datetime | None
    exit_code: int | None
    reason: str
    resumed_from_step: int | None
    last_heartbeat: datetime | None
    launch_attempt: int | None = Field(
        None, description="Restarted in place by torchrun: the attempt that was launched."
    )
    nodes: list[str] = Field(
        default_factory=list, description="The nodes it was launched on ([]: not recorded)."
    )


class EventOut(FromRecord, record=EventRecord, internal=("job_id",)):
    id: int
    ts: datetime
    kind: str
    message: str
    attempt: int | None
    replica: str = Field("", description="The control plane replica that wrote it.")
    epoch: int | None = Field(
        None, description="The leader epoch it was written under (null: not by the loop)."
    )


class MetricOut(FromRecord, record=MetricRecord, internal=("job_id",)):
    attempt: int
    step: int
    ts: float
    step_time_s: float | None
    values: dict[str, float]


class CheckpointOut(FromRecord, record=CheckpointRecord, internal=("job_id",), added=("metrics",)):
    attempt: int
    step: int
    path: str
    ts: float
    size_bytes: int | None
    format: str | None = Field(
        None, description="state-dict, dcp, megatron-dist, safetensors, hf or files; null: unknown"
    )
    metrics: dict[str, float] = Field(
        default_factory=dict, description="The metrics the job reported at this step."
    )


class CheckpointRemovalOut(FromRecord, record=CheckpointRemovalRecord, internal=("id", "job_id")):
    """A checkpoint the job's retention policy removed (docs/artifacts.md)."""

    step: int
    path: str
    size_bytes: int | None
    delete_files: bool = Field(
        description="False: the path was outside the job's checkpoint directory; only its row "
        "was removed, the files were left."
    )
    retired_at: datetime
    removed_at: datetime | None = Field(description="When its files were gone; None: pending.")


class TeamIn(BaseModel):
    name: str = Field(..., pattern=NAME_PATTERN)
    gpu_quota: int | None = Field(None, ge=0, le=INT32)
    cpu_quota: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    description: str = Field("", max_length=10_000)


class TeamPatch(BaseModel):
    """Fields to change; a field left out stays, null clears a quota."""

    gpu_quota: int | None = Field(None, ge=0, le=INT32)
    cpu_quota: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    description: str | None = Field(None, max_length=10_000)


class TeamOut(FromRecord, record=TeamRecord):
    name: str
    gpu_quota: int | None
    cpu_quota: float | None
    description: str
    created_at: datetime


class MetricIn(BaseModel):
    step: Count
    ts: UnixTime
    step_time_s: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    values: dict[str, Annotated[float, Field(allow_inf_nan=False)]] = Field(
        default_factory=dict,
        description="Finite numbers only: the runtime reports a NaN or infinite value (a "
        "diverged loss) as a warning event instead.",
    )


CheckpointFormat = Literal["state-dict", "dcp", "megatron-dist", "safetensors", "hf", "files"]


class CheckpointIn(BaseModel):
    step: Count
    path: str = Field(..., min_length=1, max_length=4096)
    ts: UnixTime
    size_bytes: int | None = Field(None, ge=0, le=INT64)
    format: CheckpointFormat | None = Field(
        None, description="What the runtime wrote; omitted: detected from the path if visible."
    )


class EventIn(BaseModel):
    kind: str = Field(
        "runtime",
        max_length=32,
        description="One of runtime, log, progress, warning, error, checkpoint.",
    )
    message: str = Field(..., max_length=10_000)


class TimingsIn(BaseModel):
    """Cumulative seconds of the attempt so far (a re-sent report sets the same values)."""

    checkpoint_save_s: float = Field(0.0, ge=0, le=1e9)
    checkpoint_restore_s: float = Field(0.0, ge=0, le=1e9)


class ReportIn(BaseModel):
    """What the in-job runtime sends (docs/contracts.md section 2)."""

    attempt: int = Field(..., ge=1, le=INT32)
    launch_attempt: int | None = Field(
        None,
        ge=1,
        le=INT32,
        description="Set by workers that torchrun restarted in place: the attempt the control "
        "plane launched. Their first report records `attempt` as an in-place restart.",
    )
    heartbeat_at: UnixTime | None = None
    resumed_from_step: Count | None = None
    metrics: list[MetricIn] = Field(default_factory=list)
    checkpoints: list[CheckpointIn] = Field(default_factory=list)
    events: list[EventIn] = Field(default_factory=list)
    timings: TimingsIn | None = None


class ReportOut(BaseModel):
    ok: bool = True
    cancel: bool = False


class GoodputBreakdownOut(BaseModel):
    """Where the time went (docs/goodput.md): allocated = productive + the allocated badput."""

    allocated_s: float
    productive_s: float
    goodput: float = Field(..., description="productive_s / allocated_s")
    startup_s: float
    checkpoint_save_s: float
    checkpoint_restore_s: float
    lost_s: float
    hang_s: float
    other_s: float
    queueing_s: float = Field(..., description="not allocated: submitted -> first attempt")
    restart_wait_s: float = Field(..., description="not allocated: between attempts")


class CheckpointAdviceOut(BaseModel):
    """The Young/Daly checkpoint interval for the observed failure rate and save cost."""

    current_interval_steps: int
    auto: bool = Field(..., description="applied to the next attempt (checkpoint.auto_interval)")
    interval_s: float
    interval_steps: int | None
    save_s: float
    mtbf_s: float
    source: str


class TeamGoodputOut(BaseModel):
    """A team's goodput: the sum of its jobs' breakdowns."""

    team: str
    jobs: int
    breakdown: GoodputBreakdownOut


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
    breakdown: GoodputBreakdownOut | None = None
    checkpoint_advice: CheckpointAdviceOut | None = None


class PipelineIn(BaseModel):
    """A pipeline run: the PipelineSpec as a mapping and parameter values (over defaults)."""

    spec: dict[str, Any] = Field(..., description="A PipelineSpec, as in a pipeline YAML file.")
    params: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="Parameter values; unknown names are refused."
    )


class StepOut(FromRecord, record=StepRecord, internal=("pipeline_id", "position")):
    """One step of a pipeline run."""

    name: str
    state: str
    tries: int
    job_id: int | None
    job_ids: list[int]
    input_hash: str
    cached_from: str
    outputs: dict[str, Any] = Field(
        json_schema_extra={
            "x-not-secret": "what the step's job published for later steps "
            "(its outputs file); no spec and no env"
        }
    )
    reason: str
    started_at: datetime | None
    finished_at: datetime | None


class PipelineOut(FromRecord, record=PipelineRecord):
    """A pipeline run, its steps in run order; step job `env` values are shown as `***`."""

    id: int
    name: str
    team: str
    user: str
    state: str
    spec: RedactedSpec
    params: dict[str, Any] = Field(
        json_schema_extra={
            "x-not-secret": "pipeline parameters are plain values; secrets go "
            "in team secrets, referenced from a step's env"
        }
    )
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    cancel_requested: bool
    reason: str
    steps: list[StepOut]
