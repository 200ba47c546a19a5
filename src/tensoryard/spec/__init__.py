"""The user-facing language: JobSpec (and QueueSpec, ClusterSpec from the scheduler work)."""

from tensoryard.spec.cluster import (
    ClusterSpec,
    NodeGroupSpec,
    NodeInfo,
    parse_cluster_shape,
    parse_cluster_spec,
)
from tensoryard.spec.job import (
    CheckpointSpec,
    JobSpec,
    KeepBestSpec,
    ResourcesSpec,
    RestartPolicy,
    SchedulingSpec,
    VolumeSpec,
    load_job_spec,
    parse_job_spec,
)
from tensoryard.spec.queue import (
    CohortSpec,
    QueueSpec,
    QuotaConfig,
    load_quota_config,
    parse_quota_config,
)

__all__ = [
    "CheckpointSpec",
    "ClusterSpec",
    "CohortSpec",
    "JobSpec",
    "KeepBestSpec",
    "NodeGroupSpec",
    "NodeInfo",
    "QueueSpec",
    "QuotaConfig",
    "ResourcesSpec",
    "RestartPolicy",
    "SchedulingSpec",
    "VolumeSpec",
    "load_job_spec",
    "load_quota_config",
    "parse_cluster_shape",
    "parse_cluster_spec",
    "parse_job_spec",
    "parse_quota_config",
]
