"""A stand-in for NVIDIA's DCGM exporter in Kubernetes mode, for machines without GPUs.

On a GPU Operator node the DCGM exporter (``DCGM_EXPORTER_KUBERNETES=true``) serves one series
per GPU and counter, labelled ``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname`` and the
``container``, ``namespace`` and ``pod`` that hold the GPU according to the kubelet's
pod-resources API (empty strings for an idle GPU). tensoryard does not export those counters a
second time on Kubernetes: recording rules join them to jobs (deploy/prometheus/rules/k8s.yml).

This module renders that exposition from NVML readings, through the agent's own
:class:`~tensoryard.observability.gpu.GpuCollector` (the same DCGM names, units and types) fed
by a fake NVML with recorded values (``tensoryard.agent.fake_nvml``), so the join can be tested
against a real Prometheus here. It invents nothing about a GPU: every value is NVML's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from tensoryard.observability.gpu import GpuCollector

__all__ = ["DcgmExporterCollector", "PodGpu", "render_dcgm_exporter"]

# the labels the DCGM exporter puts on every GPU series, in its order
EXPORTER_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")
K8S_LABELS = ("container", "namespace", "pod")


@dataclass(frozen=True)
class PodGpu:
    """The pod holding a GPU, as the kubelet's pod-resources API reports it."""

    namespace: str
    pod: str
    container: str


class DcgmExporterCollector:
    """The DCGM exporter's series (``DCGM_FI_*`` only) for the GPUs ``nvml`` lists, with
    ``pods`` (GPU index -> pod) as its Kubernetes mapping."""

    def __init__(
        self, nvml: Any, *, hostname: str, pods: Mapping[int, PodGpu] | None = None
    ) -> None:
        self._gpus = GpuCollector(nvml, hostname=lambda: hostname)
        self.pods: dict[int, PodGpu] = dict(pods or {})

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        for family in self._gpus.collect():
            if not family.name.startswith("DCGM_FI_"):
                continue  # tensoryard's own additions: the exporter has none of them
            out = Metric(family.name, family.documentation, family.type)
            for sample in family.samples:
                labels = {k: sample.labels.get(k, "") for k in EXPORTER_LABELS}
                held = self.pods.get(int(labels["gpu"]))
                labels["container"] = held.container if held else ""
                labels["namespace"] = held.namespace if held else ""
                labels["pod"] = held.pod if held else ""
                out.add_sample(sample.name, labels, sample.value)
            yield out


def render_dcgm_exporter(
    nvml: Any, *, hostname: str, pods: Mapping[int, PodGpu] | None = None
) -> bytes:
    """One scrape of the exporter's ``/metrics`` (text exposition format)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmExporterCollector(nvml, hostname=hostname, pods=pods))
    return generate_latest(registry)
