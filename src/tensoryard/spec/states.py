"""Job states and the transitions the reconciler may make between them."""

from __future__ import annotations

import enum

__all__ = ["ACTIVE_STATES", "ALLOWED_TRANSITIONS", "TERMINAL_STATES", "JobState"]


class JobState(enum.StrEnum):
    PENDING = "PENDING"  # waiting for the scheduler to admit it
    ADMITTED = "ADMITTED"  # capacity reserved, not yet launched
    STARTING = "STARTING"  # launched, workers not yet confirmed running
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"  # an attempt failed; the next resumes from the last checkpoint
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset(
    {JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING}
)

ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.ADMITTED, JobState.CANCELLED, JobState.FAILED}),
    JobState.ADMITTED: frozenset(
        {JobState.STARTING, JobState.PENDING, JobState.CANCELLED, JobState.FAILED}
    ),
    JobState.STARTING: frozenset(
        {
            JobState.PENDING,  # preempted before it was confirmed running
            JobState.RUNNING,
            JobState.RESTARTING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
        }
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.RESTARTING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.PENDING,
        }  # PENDING: preempted and requeued
    ),
    JobState.RESTARTING: frozenset(
        {JobState.STARTING, JobState.PENDING, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
