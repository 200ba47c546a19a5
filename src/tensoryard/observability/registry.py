"""The node agent's metric registry: its own CollectorRegistry (never the global one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from tensoryard.observability import metrics as m
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

__all__ = ["agent_registry", "node_collectors", "render"]


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


# Counters named without a lowercase _total (DCGM's): prometheus_client writes their HELP and
# TYPE lines as NAME_total while the samples are NAME; render() puts the lines back on NAME.
_EXACT = tuple(
    (
        f"# HELP {d.name}_total ".encode(),
        f"# HELP {d.name} ".encode(),
        f"# TYPE {d.name}_total ".encode(),
        f"# TYPE {d.name} ".encode(),
    )
    for d in m.ALL
    if d.type == "counter" and not d.name.endswith("_total")
)


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of `registry`, with DCGM counter names kept exact."""
    text = generate_latest(registry)
    for help_bad, help_ok, type_bad, type_ok in _EXACT:
        if help_bad in text:
            text = text.replace(help_bad, help_ok).replace(type_bad, type_ok)
    return text
