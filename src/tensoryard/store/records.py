"""Frozen records the store hands out (never ORM objects). Datetimes are timezone-aware UTC."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tensoryard.spec.states import JobState

__all__ = [
    "CHECKPOINT_FORMATS",
    "PIPELINE_TERMINAL",
    "STEP_TERMINAL",
    "TEAM_ROLES",
    "TOKEN_SCOPES",
    "AttemptRecord",
    "AuditContext",
    "AuditRecord",
    "CheckpointRecord",
    "EventRecord",
    "IssuedToken",
    "JobPage",
    "JobRecord",
    "JobTokenGrant",
    "MemberRecord",
    "MetricRecord",
    "NodeEventRecord",
    "NodeRecord",
    "PipelineRecord",
    "StepProgress",
    "StepRecord",
    "TeamRecord",
    "TokenRecord",
    "UserRecord",
]

TEAM_ROLES = ("viewer", "member", "team-admin")
"""Roles within a team, weakest first; each includes the rights of those before it."""

TOKEN_SCOPES = ("read", "write", "admin")
"""What a token may be used for: read (GET), write (submit, cancel, own tokens), admin
(users, teams, quotas, members, audit). A token never grants more than its user's roles."""


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
    checkpoint_save_s: float | None = None
    checkpoint_restore_s: float | None = None
    admitted_at: datetime | None = None  # Kueue's admission; None: admitted at launch
    launch_attempt: int | None = None  # restarted in place from this launch; None: launched
    nodes: tuple[str, ...] = ()  # the placement's nodes at launch (() : unknown)


@dataclass(frozen=True)
class EventRecord:
    """A line of a job's history; ids grow monotonically per database."""

    id: int
    job_id: int
    ts: datetime
    kind: str
    message: str
    attempt: int | None
    replica: str = ""  # the control plane replica that wrote it ("" before migration 0018)
    epoch: int | None = None  # the leader epoch it was written under (None: not the loop)


@dataclass(frozen=True)
class Fence:
    """A fencing token: the lease a control loop acts under (Store.fenced)."""

    lease: str
    holder: str
    epoch: int
    ttl_s: float


@dataclass(frozen=True)
class MetricRecord:
    """One reported training step."""

    job_id: int
    attempt: int
    step: int
    ts: float  # unix seconds
    step_time_s: float | None
    values: dict[str, float]


CHECKPOINT_FORMATS = ("state-dict", "dcp", "megatron-dist", "safetensors", "hf", "files")
"""A checkpoint's format: a full state dict (tensoryard's DDP layout), a
``torch.distributed.checkpoint`` directory, a Megatron distributed checkpoint, safetensors
shards, a Hugging Face directory, anything else (docs/artifacts.md)."""


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint written by a job."""

    job_id: int
    attempt: int
    step: int
    path: str
    ts: float  # unix seconds
    size_bytes: int | None
    format: str | None = None  # one of CHECKPOINT_FORMATS; None: unknown


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


@dataclass(frozen=True)
class UserRecord:
    """A user, whether a platform admin, and their role in each team (team -> role)."""

    name: str
    created_at: datetime
    platform_admin: bool
    description: str
    teams: dict[str, str]


@dataclass(frozen=True)
class MemberRecord:
    """A user's role in a team."""

    team: str
    user: str
    role: str
    created_at: datetime


@dataclass(frozen=True)
class TokenRecord:
    """An API token without its secret: who holds it, what it may do, and until when."""

    id: str
    user: str
    name: str
    scopes: tuple[str, ...]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


@dataclass(frozen=True)
class IssuedToken:
    """A new token: the record and the secret, which is shown this once and never stored."""

    record: TokenRecord
    token: str


@dataclass(frozen=True)
class JobTokenGrant:
    """What a valid job token allows: reporting for this job and attempt (None: any, from a
    token issued before attempts were recorded)."""

    job_id: int
    attempt: int | None


@dataclass(frozen=True)
class AuditContext:
    """Who asks for a change and from where; the store writes the audit row in the change's
    own transaction."""

    actor: str
    source_ip: str = ""


@dataclass(frozen=True)
class AuditRecord:
    """One line of the audit log."""

    id: int
    ts: datetime
    actor: str
    action: str
    object: str
    outcome: str  # ok | denied | error
    source_ip: str
    detail: str


PIPELINE_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
STEP_TERMINAL = frozenset({"SUCCEEDED", "CACHED", "SKIPPED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class StepRecord:
    """One step of a pipeline run: WAITING, RUNNING, SUCCEEDED, CACHED (outputs reused from
    ``cached_from``), SKIPPED (its condition was false or a need was skipped), FAILED or
    CANCELLED; the job it runs now and every job it submitted."""

    pipeline_id: int
    name: str
    position: int
    state: str
    tries: int
    job_id: int | None
    job_ids: tuple[int, ...]
    input_hash: str
    cached_from: str
    outputs: dict[str, Any]
    reason: str
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class PipelineRecord:
    """A pipeline run: spec, parameters, state (RUNNING or terminal) and its steps in run
    order."""

    id: int
    name: str
    team: str
    user: str
    state: str
    spec: dict[str, Any]
    params: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    cancel_requested: bool
    reason: str
    steps: tuple[StepRecord, ...]

    def step(self, name: str) -> StepRecord:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)


@dataclass(frozen=True)
class NodeRecord:
    """A node and its health-loop state: ready, cordoned (no new placements) or draining
    (cordoned, and its running jobs are requeued from their last checkpoint)."""

    name: str
    state: str
    reason: str
    created_at: datetime
    changed_at: datetime
    heartbeat_at: datetime | None = None  # when its agent last reported (None: no agent)


@dataclass(frozen=True)
class NodeEventRecord:
    """One line of a node's history."""

    id: int
    node: str
    ts: datetime
    kind: str  # registered | cordon | drain | uncordon
    actor: str
    message: str
