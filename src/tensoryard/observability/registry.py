"""The node agent's metric registry: its own CollectorRegistry (never the global one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tensoryard.observability.base import Collector, CollectorErrors
from tensoryard.observability.gpu import GpuCollector, GpuOwner
from tensoryard.observability.infiniband import InfinibandCollector
from tensoryard.observability.nccl import NcclLogCollector, NcclLogSource
from tensoryard.observability.storage import (
    DiskstatsCollector,
    JobProcess,
    MountsCollector,
    ProcessIoCollector,
)

__all__ = ["agent_registry", "node_collectors"]


def node_collectors(
    *,
    proc: str | Path = "/proc",
    sys: str | Path = "/sys",
    nvml: Any | None = None,
    gpu_owners: Callable[[], Mapping[int, GpuOwner]] = dict,
    job_processes: Callable[[], Sequence[JobProcess]] = list,
    nccl_sources: Callable[[], Iterable[NcclLogSource]] = list,
    errors: CollectorErrors | None = None,
) -> list[Collector]:
    """Every node collector, sharing one error counter (itself last, so each scrape's errors
    show in that scrape). `nvml` None loads the real bindings when installed."""
    errors = errors if errors is not None else CollectorErrors()
    return [
        InfinibandCollector(sys, errors=errors),
        DiskstatsCollector(proc, errors=errors),
        MountsCollector(proc, errors=errors),
        ProcessIoCollector(job_processes, proc, errors=errors),
        GpuCollector(nvml, owners=gpu_owners, errors=errors),
        NcclLogCollector(nccl_sources, errors=errors),
        errors,
    ]


def agent_registry(collectors: Iterable[Collector]) -> CollectorRegistry:
    """A fresh registry holding `collectors` (nothing is collected at registration)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)  # type: ignore[arg-type]
    return registry
