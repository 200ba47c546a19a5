"""The tensoryard database: SQLAlchemy models, Alembic migrations and the Store repository.

``Store.open(url)`` migrates to the newest schema and returns a store whose methods are each one
transaction returning frozen records. SQLite (``default_sqlite_url(home)``) is the embedded
default; any ``postgresql+psycopg://`` URL works in production.
"""

from tensoryard.store._gpu_hours import GPU_HOUR_KINDS, GpuHoursRow
from tensoryard.store._registry import ModelRecord, ModelVersionRecord, VersionLineage
from tensoryard.store._retention import CheckpointRemovalRecord, Retirement
from tensoryard.store._serving import USAGE_GROUPS, UsageDelta, UsageRow
from tensoryard.store._webhooks import WebhookDeliveryRecord
from tensoryard.store.records import (
    CHECKPOINT_FORMATS,
    TEAM_ROLES,
    TOKEN_SCOPES,
    AttemptRecord,
    AuditContext,
    AuditRecord,
    CheckpointRecord,
    EventRecord,
    Fence,
    IssuedToken,
    JobPage,
    JobRecord,
    JobTokenGrant,
    MemberRecord,
    MetricRecord,
    NodeEventRecord,
    NodeRecord,
    PipelineRecord,
    StepProgress,
    StepRecord,
    TeamRecord,
    TokenRecord,
    UserRecord,
)
from tensoryard.store.store import JOB_FIELDS, Store, default_sqlite_url, reason_gist, utcnow

__all__ = [
    "CHECKPOINT_FORMATS",
    "GPU_HOUR_KINDS",
    "JOB_FIELDS",
    "TEAM_ROLES",
    "TOKEN_SCOPES",
    "USAGE_GROUPS",
    "AttemptRecord",
    "AuditContext",
    "AuditRecord",
    "CheckpointRecord",
    "CheckpointRemovalRecord",
    "EventRecord",
    "Fence",
    "GpuHoursRow",
    "IssuedToken",
    "JobPage",
    "JobRecord",
    "JobTokenGrant",
    "MemberRecord",
    "MetricRecord",
    "ModelRecord",
    "ModelVersionRecord",
    "NodeEventRecord",
    "NodeRecord",
    "PipelineRecord",
    "Retirement",
    "StepProgress",
    "StepRecord",
    "Store",
    "TeamRecord",
    "TokenRecord",
    "UsageDelta",
    "UsageRow",
    "UserRecord",
    "VersionLineage",
    "WebhookDeliveryRecord",
    "default_sqlite_url",
    "reason_gist",
    "utcnow",
]
