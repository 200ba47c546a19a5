"""Observability: metric definitions, node collectors (InfiniBand, storage, GPUs through NVML,
NCCL logs) and the node agent's metric registry. Alert rules live in deploy/prometheus, dashboards
in deploy/grafana; both use only names from ``tensoryard.observability.metrics``."""

from tensoryard.observability.base import Collector, CollectorErrors
from tensoryard.observability.gpu import GpuCollector, GpuOwner
from tensoryard.observability.health import HealthAction, decide
from tensoryard.observability.infiniband import InfinibandCollector
from tensoryard.observability.nccl import (
    NcclEvent,
    NcclLogCollector,
    NcclLogSource,
    NcclLogStats,
    nccl_debug_env,
    parse_line,
)
from tensoryard.observability.registry import agent_registry, node_collectors
from tensoryard.observability.storage import (
    DiskstatsCollector,
    JobProcess,
    MountsCollector,
    ProcessIoCollector,
)

__all__ = [
    "Collector",
    "CollectorErrors",
    "DiskstatsCollector",
    "GpuCollector",
    "GpuOwner",
    "HealthAction",
    "InfinibandCollector",
    "JobProcess",
    "MountsCollector",
    "NcclEvent",
    "NcclLogCollector",
    "NcclLogSource",
    "NcclLogStats",
    "ProcessIoCollector",
    "agent_registry",
    "decide",
    "nccl_debug_env",
    "node_collectors",
    "parse_line",
]
