"""Turning ORM rows into the frozen records the store hands out."""

from __future__ import annotations

from tensoryard.spec.states import JobState
from tensoryard.store.models import (
    ApiToken,
    Attempt,
    AuditEntry,
    Checkpoint,
    Event,
    Job,
    Membership,
    Metric,
    Team,
    User,
)
from tensoryard.store.records import (
    AttemptRecord,
    AuditRecord,
    CheckpointRecord,
    EventRecord,
    JobRecord,
    MemberRecord,
    MetricRecord,
    TeamRecord,
    TokenRecord,
    UserRecord,
)

__all__ = [
    "attempt_record",
    "audit_record",
    "checkpoint_record",
    "event_record",
    "job_record",
    "member_record",
    "metric_record",
    "team_record",
    "token_record",
    "user_record",
]


def team_record(t: Team) -> TeamRecord:
    return TeamRecord(
        name=t.name,
        created_at=t.created_at,
        gpu_quota=t.gpu_quota,
        cpu_quota=t.cpu_quota,
        description=t.description,
    )


def job_record(j: Job) -> JobRecord:
    return JobRecord(
        id=j.id,
        name=j.name,
        team=j.team,
        user=j.user,
        priority=j.priority,
        state=JobState(j.state),
        spec=dict(j.spec),
        created_at=j.created_at,
        updated_at=j.updated_at,
        admitted_at=j.admitted_at,
        started_at=j.started_at,
        finished_at=j.finished_at,
        attempts=j.attempts,
        restarts=j.restarts,
        reason=j.reason,
        pending_reason=j.pending_reason,
        pending_eta=j.pending_eta,
        cancel_requested=j.cancel_requested,
        run_dir=j.run_dir,
        placement=dict(j.placement),
        last_heartbeat=j.last_heartbeat,
        run_time_s=j.run_time_s or 0.0,
        changed_at=j.changed_at,
    )


def attempt_record(a: Attempt) -> AttemptRecord:
    return AttemptRecord(
        job_id=a.job_id,
        number=a.number,
        state=a.state,
        handle=dict(a.handle),
        started_at=a.started_at,
        finished_at=a.finished_at,
        exit_code=a.exit_code,
        reason=a.reason,
        resumed_from_step=a.resumed_from_step,
        last_heartbeat=a.last_heartbeat,
        attempt_key=a.attempt_key or "",
        running_at=a.running_at,
        checkpoint_save_s=a.checkpoint_save_s,
        checkpoint_restore_s=a.checkpoint_restore_s,
        admitted_at=a.admitted_at,
        launch_attempt=a.launch_attempt,
        nodes=tuple(a.nodes or ()),
    )


def event_record(e: Event) -> EventRecord:
    return EventRecord(
        id=e.id,
        job_id=e.job_id,
        ts=e.ts,
        kind=e.kind,
        message=e.message,
        attempt=e.attempt,
        replica=e.replica or "",
        epoch=e.epoch,
    )


def metric_record(m: Metric) -> MetricRecord:
    return MetricRecord(
        job_id=m.job_id,
        attempt=m.attempt,
        step=m.step,
        ts=m.ts,
        step_time_s=m.step_time_s,
        values=dict(m.values),
    )


def checkpoint_record(c: Checkpoint) -> CheckpointRecord:
    return CheckpointRecord(
        job_id=c.job_id,
        attempt=c.attempt,
        step=c.step,
        path=c.path,
        ts=c.ts,
        size_bytes=c.size_bytes,
        format=c.format,
    )


def user_record(u: User, teams: dict[str, str]) -> UserRecord:
    return UserRecord(
        name=u.name,
        created_at=u.created_at,
        platform_admin=u.platform_admin,
        description=u.description,
        teams=dict(teams),
    )


def member_record(m: Membership) -> MemberRecord:
    return MemberRecord(team=m.team, user=m.user_name, role=m.role, created_at=m.created_at)


def token_record(t: ApiToken) -> TokenRecord:
    return TokenRecord(
        id=t.id,
        user=t.user_name,
        name=t.name,
        scopes=tuple(t.scopes),
        created_at=t.created_at,
        expires_at=t.expires_at,
        revoked_at=t.revoked_at,
        last_used_at=t.last_used_at,
    )


def audit_record(a: AuditEntry) -> AuditRecord:
    return AuditRecord(
        id=a.id,
        ts=a.ts,
        actor=a.actor,
        action=a.action,
        object=a.object,
        outcome=a.outcome,
        source_ip=a.source_ip,
        detail=a.detail,
    )
