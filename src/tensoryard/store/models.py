"""SQLAlchemy 2 models: the database schema of tensoryard.

The Alembic migrations in ``migrations/versions`` must produce exactly this schema; a test
compares them (autogenerate gives no diff) on SQLite and PostgreSQL. Change both together.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from tensoryard.spec.states import JobState
from tensoryard.store.records import TEAM_ROLES

__all__ = [
    "ApiToken",
    "Attempt",
    "AuditEntry",
    "Base",
    "Checkpoint",
    "CheckpointRemoval",
    "Deployment",
    "DeploymentReplica",
    "Event",
    "Job",
    "JobToken",
    "Membership",
    "Metric",
    "Model",
    "ModelAlias",
    "ModelTag",
    "ModelVersion",
    "Node",
    "NodeEvent",
    "Pipeline",
    "PipelineStep",
    "ServingUsage",
    "Team",
    "UTCDateTime",
    "User",
    "WebhookDelivery",
]

# Explicit constraint names, so migrations and autogenerate agree on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

NAME_LEN = 63
STATE_LEN = 16
SUBMIT_KEY_LEN = 128
STATE_VALUES = ", ".join(f"'{s.value}'" for s in JobState)
USER_LEN = 128  # as jobs.user_name
ROLE_VALUES = ", ".join(f"'{r}'" for r in TEAM_ROLES)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite keeps no timezone, so values are normalised to UTC on the way in and tagged UTC on
    the way out; PostgreSQL stores ``timestamptz``. Naive input is taken to be UTC already.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base holding the shared metadata (with the naming convention)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
    }


class Team(Base):
    """A team: owns jobs and (later) a quota in the scheduler."""

    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    created_at: Mapped[datetime]
    gpu_quota: Mapped[int | None] = mapped_column(Integer)
    cpu_quota: Mapped[float | None] = mapped_column(Float)
    description: Mapped[str] = mapped_column(Text)


class Job(Base):
    """One submitted job and its current state (the state machine lives in the store)."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(f"state IN ({STATE_VALUES})", name="state"),
        Index(None, "state"),
        Index(None, "team"),
        Index(None, "user_name"),
        Index(None, "name"),
        Index(None, "changed_at"),
        Index("ux_jobs_user_submit_key", "user_name", "submit_key", unique=True),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    team: Mapped[str] = mapped_column(String(NAME_LEN), ForeignKey("teams.name"))
    user: Mapped[str] = mapped_column("user_name", String(128))
    priority: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(STATE_LEN))
    spec: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    admitted_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer)
    restarts: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    pending_reason: Mapped[str] = mapped_column(Text)
    pending_eta: Mapped[datetime | None]
    cancel_requested: Mapped[bool] = mapped_column(Boolean)
    run_dir: Mapped[str] = mapped_column(Text)
    placement: Mapped[dict[str, Any]]
    last_heartbeat: Mapped[datetime | None]
    run_time_s: Mapped[float] = mapped_column(Float, server_default="0")
    """Run time of the finished attempts (max_runtime and fair share count this)."""
    changed_at: Mapped[datetime | None]
    """Bumped by every write to the row: the control loop reads what changed since a time."""
    submit_key: Mapped[str | None] = mapped_column(String(SUBMIT_KEY_LEN))
    """The client's Idempotency-Key: a retried submission returns the job stored the first time."""


class Attempt(Base):
    """One launch of a job; a restart is a new attempt resuming from a checkpoint."""

    __tablename__ = "attempts"

    job_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(String(32))
    handle: Mapped[dict[str, Any]]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    resumed_from_step: Mapped[int | None] = mapped_column(Integer)
    last_heartbeat: Mapped[datetime | None]
    attempt_key: Mapped[str] = mapped_column(String(64), server_default="")
    """Names every process/object of the attempt; recorded before anything is launched."""
    running_at: Mapped[datetime | None]
    """When the attempt's workers were confirmed running (its run time starts here)."""
    admitted_at: Mapped[datetime | None]
    """When an external admission engine (Kueue) granted its resources (0013); None: at
    launch. Before it, the attempt waited in a queue and held nothing."""
    checkpoint_save_s: Mapped[float | None] = mapped_column(Float)
    """Seconds checkpoint saves blocked training in this attempt (reported by the runtime)."""
    checkpoint_restore_s: Mapped[float | None] = mapped_column(Float)
    """Seconds the attempt spent loading its checkpoint before the first step."""
    launch_attempt: Mapped[int | None] = mapped_column(Integer)
    """Restarted in place (0014): the attempt whose launch (torchrun) restarted its workers
    into this one; same handle and key. None: launched by the control plane."""
    nodes: Mapped[list[str] | None] = mapped_column(JSON)
    """The nodes of the placement it was launched with (0015); None: recorded before."""


class Event(Base):
    """A human-readable line in a job's history; ids grow monotonically."""

    __tablename__ = "events"
    __table_args__ = (Index(None, "job_id", "id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("jobs.id", ondelete="CASCADE"))
    ts: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int | None] = mapped_column(Integer)
    # Who wrote it (migration 0018): the replica's holder name, and the leader epoch it wrote
    # under when the control loop wrote it (None for API replicas and older rows).
    replica: Mapped[str] = mapped_column(String(128), default="", server_default="")
    epoch: Mapped[int | None] = mapped_column(Integer)


class Metric(Base):
    """One reported training step; (job, attempt, step) is unique so re-sends are harmless."""

    __tablename__ = "metrics"

    job_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    step: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ts: Mapped[float] = mapped_column(Float)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    values: Mapped[dict[str, Any]] = mapped_column("metric_values", JSON)


class Checkpoint(Base):
    """A checkpoint a job wrote; (job, step, path) is unique so re-sends are harmless."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    ts: Mapped[float] = mapped_column(Float)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    format: Mapped[str | None] = mapped_column(String(32))  # 0012; CHECKPOINT_FORMATS


class CheckpointRemoval(Base):
    """A checkpoint that retention deleted: written in the transaction that deletes its
    `checkpoints` row (the intent); `removed_at` is set once its files are gone, so a restart
    finishes a removal a crash interrupted, and a re-sent report cannot bring the row back."""

    __tablename__ = "checkpoint_removals"
    __table_args__ = (UniqueConstraint("job_id", "step", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    delete_files: Mapped[bool] = mapped_column(Boolean)
    retired_at: Mapped[datetime]
    removed_at: Mapped[datetime | None]


class JobToken(Base):
    """The sha256 of a job's current bearer token (the secret itself is never stored)."""

    __tablename__ = "job_tokens"

    job_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    attempt: Mapped[int | None] = mapped_column(Integer)
    """The attempt the token was issued for; it may report for no other (NULL: before 0002)."""


class User(Base):
    """A person (or robot) that holds API tokens; platform admins may do everything."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(USER_LEN), primary_key=True)
    created_at: Mapped[datetime]
    platform_admin: Mapped[bool] = mapped_column(Boolean)
    description: Mapped[str] = mapped_column(Text)


class Membership(Base):
    """A user's role in one team: viewer < member < team-admin."""

    __tablename__ = "team_members"
    __table_args__ = (
        CheckConstraint(f"role IN ({ROLE_VALUES})", name="role"),
        Index(None, "user_name"),
    )

    team: Mapped[str] = mapped_column(
        String(NAME_LEN), ForeignKey("teams.name", ondelete="CASCADE"), primary_key=True
    )
    user_name: Mapped[str] = mapped_column(
        String(USER_LEN), ForeignKey("users.name", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]


class ApiToken(Base):
    """A user's API token: ``tyd_<id>_<secret>``; only the sha256 of the whole token is kept."""

    __tablename__ = "api_tokens"
    __table_args__ = (Index(None, "user_name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_name: Mapped[str] = mapped_column(
        String(USER_LEN), ForeignKey("users.name", ondelete="CASCADE")
    )
    token_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(NAME_LEN * 2))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class AuditEntry(Base):
    """Who did what, when, from where, and how it ended. Append-only (triggers refuse
    UPDATE and DELETE on both backends)."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index(None, "actor"),
        Index(None, "action"),
        Index(None, "ts"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(USER_LEN + 64))
    action: Mapped[str] = mapped_column(String(64))
    object: Mapped[str] = mapped_column(String(256))
    outcome: Mapped[str] = mapped_column(String(16))
    source_ip: Mapped[str] = mapped_column(String(64))
    detail: Mapped[str] = mapped_column(Text)


class Lease(Base):
    """A named lease (the controller leader): held by `holder` until `expires_at`."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    epoch: Mapped[int] = mapped_column(Integer)
    acquired_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class SchedulerState(Base):
    """A JSON blob the scheduler keeps across restarts (usage history, estimator state)."""

    __tablename__ = "scheduler_state"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime]


PIPELINE_STATE_VALUES = "'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'"
STEP_STATE_VALUES = "'WAITING', 'RUNNING', 'SUCCEEDED', 'CACHED', 'SKIPPED', 'FAILED', 'CANCELLED'"


class Pipeline(Base):
    """One run of a PipelineSpec with its parameters; its steps are rows of pipeline_steps."""

    __tablename__ = "pipelines"
    __table_args__ = (
        CheckConstraint(f"state IN ({PIPELINE_STATE_VALUES})", name="state"),
        Index(None, "state"),
        Index(None, "team"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    team: Mapped[str] = mapped_column(String(NAME_LEN), ForeignKey("teams.name"))
    user: Mapped[str] = mapped_column("user_name", String(USER_LEN))
    state: Mapped[str] = mapped_column(String(STATE_LEN))
    spec: Mapped[dict[str, Any]]
    params: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    cancel_requested: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(Text)


class PipelineStep(Base):
    """A step of a pipeline run: its state, the job it submitted (per try), inputs and outputs."""

    __tablename__ = "pipeline_steps"
    __table_args__ = (
        CheckConstraint(f"state IN ({STEP_STATE_VALUES})", name="state"),
        Index(None, "input_hash"),
        Index(None, "job_id"),
    )

    pipeline_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("pipelines.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(STATE_LEN))
    tries: Mapped[int] = mapped_column(Integer)
    """Jobs submitted for this step so far (a retry submits a new job)."""
    job_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("jobs.id", ondelete="SET NULL"))
    job_ids: Mapped[list[int]] = mapped_column(JSON)
    input_hash: Mapped[str] = mapped_column(String(64))
    cached_from: Mapped[str] = mapped_column(String(64))
    """'PIPELINE/STEP' whose outputs a CACHED step reuses ('' otherwise)."""
    outputs: Mapped[dict[str, Any]]
    reason: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Model(Base):
    """A registered model of a team: a name whose versions are immutable artifacts."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("team", "name"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    team: Mapped[str] = mapped_column(
        String(NAME_LEN), ForeignKey("teams.name", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    description: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(USER_LEN))


class ModelVersion(Base):
    """One immutable version: an artifact manifest plus its lineage (job, data, parent)."""

    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("model_id", "version"),
        Index(None, "job_id"),
        Index(None, "data_manifest"),
        Index(None, "parent_id"),
        Index(None, "artifact"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(Integer, ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    artifact: Mapped[str] = mapped_column(String(64))
    """BLAKE3 digest of the artifact manifest in the artifact store."""
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    format: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("jobs.id", ondelete="SET NULL"))
    checkpoint_step: Mapped[int | None] = mapped_column(Integer)
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    code_revision: Mapped[str] = mapped_column(String(128))
    data_manifest: Mapped[str] = mapped_column(String(128))
    parent_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("model_versions.id", ondelete="SET NULL")
    )
    metrics: Mapped[dict[str, Any]]
    description: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(USER_LEN))


class ModelTag(Base):
    """A key=value tag on a model version (mutable, unlike the version itself)."""

    __tablename__ = "model_tags"
    __table_args__ = (Index(None, "key"),)

    version_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("model_versions.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class ModelAlias(Base):
    """A movable name (`production`, `candidate`...) pointing at one version of a model."""

    __tablename__ = "model_aliases"

    model_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    alias: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    version_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("model_versions.id", ondelete="CASCADE")
    )
    updated_at: Mapped[datetime]


NODE_NAME_LEN = 253  # a DNS subdomain, as Kubernetes node names
NODE_STATES = ("ready", "cordoned", "draining")
NODE_STATE_VALUES = ", ".join(f"'{s}'" for s in NODE_STATES)


class Node(Base):
    """A node the control plane places jobs on, with its cordon state (the health loop)."""

    __tablename__ = "nodes"
    __table_args__ = (CheckConstraint(f"state IN ({NODE_STATE_VALUES})", name="state"),)

    name: Mapped[str] = mapped_column(String(NODE_NAME_LEN), primary_key=True)
    state: Mapped[str] = mapped_column(String(STATE_LEN))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    changed_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime | None]  # the node agent's last report (None: no agent)


class NodeEvent(Base):
    """One line of a node's history: registered, cordoned, drained, uncordoned."""

    __tablename__ = "node_events"
    __table_args__ = (Index(None, "node", "id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(
        String(NODE_NAME_LEN), ForeignKey("nodes.name", ondelete="CASCADE")
    )
    ts: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(USER_LEN + 64))
    message: Mapped[str] = mapped_column(Text)


class Deployment(Base):
    """A served model (migration 0009_serving): the desired state of its replicas."""

    __tablename__ = "deployments"

    name: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    team: Mapped[str] = mapped_column(String(NAME_LEN), ForeignKey("teams.name"))
    model_ref: Mapped[str] = mapped_column(Text)
    model_path: Mapped[str] = mapped_column(Text)
    engine: Mapped[str] = mapped_column(String(32))
    replicas: Mapped[int] = mapped_column(Integer)
    options: Mapped[dict[str, Any]]
    idle_timeout_s: Mapped[float | None] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(USER_LEN))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class DeploymentReplica(Base):
    """One replica process of a deployment; written (port chosen) before it is spawned."""

    __tablename__ = "deployment_replicas"
    __table_args__ = (CheckConstraint("slot >= 0", name="slot"),)

    deployment: Mapped[str] = mapped_column(
        String(NAME_LEN), ForeignKey("deployments.name", ondelete="CASCADE"), primary_key=True
    )
    slot: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    port: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(STATE_LEN))
    restarts: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime | None]


class ServingUsage(Base):
    """Gateway usage in tokens per hour, team, user and deployment (migration 0016_serving_usage).

    Rows are added to, never rewritten: each control-plane replica upserts its own increments
    (``requests = requests + n``), so several replicas count into the same row. No foreign keys:
    usage outlives the deployment (and the user or team) it was counted for."""

    __tablename__ = "serving_usage"
    __table_args__ = (Index("ix_serving_usage_team_hour", "team", "hour"),)

    hour: Mapped[datetime] = mapped_column(primary_key=True)  # the hour's start, UTC
    team: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(USER_LEN), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)


WEBHOOK_STATES = ("pending", "delivered", "failed")
WEBHOOK_STATE_VALUES = ", ".join(f"'{s}'" for s in WEBHOOK_STATES)


class WebhookDelivery(Base):
    """One registry event for one webhook receiver (migration 0011_webhook_outbox).

    Written in the transaction of the registry change that caused it (an outbox): the event
    exists iff the change committed. The delivery loop claims a due row by compare-and-set on
    ``claimed_until`` and counts the attempt before it sends."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint(f"status IN ({WEBHOOK_STATE_VALUES})", name="status"),
        UniqueConstraint("delivery_id"),
        Index(None, "status", "next_attempt_at"),
        Index(None, "event_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(32))
    """The X-Tyard-Delivery header, the same on every attempt (receivers de-duplicate by it)."""
    event_id: Mapped[str] = mapped_column(String(32))
    """Shared by the deliveries of one event to several receivers."""
    event: Mapped[str] = mapped_column(String(64))
    hook_url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(STATE_LEN))
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime]
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    claimed_until: Mapped[datetime | None]
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
