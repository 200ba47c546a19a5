"""The user-facing language: JobSpec (and QueueSpec, ClusterSpec from the scheduler work)."""

from tensoryard.spec.job import (
    CheckpointSpec,
    JobSpec,
    ResourcesSpec,
    RestartPolicy,
    SchedulingSpec,
    load_job_spec,
    parse_job_spec,
)

__all__ = [
    "CheckpointSpec",
    "JobSpec",
    "ResourcesSpec",
    "RestartPolicy",
    "SchedulingSpec",
    "load_job_spec",
    "parse_job_spec",
]
