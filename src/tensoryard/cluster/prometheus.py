"""Prometheus configuration for a Kubernetes cluster (Kubernetes service discovery).

Scrape job names are the ones deploy/prometheus/rules expect (``tensoryard-control-plane``,
``tensoryard-agent``); DCGM exporter series keep their own ``pod``/``namespace`` labels (the
pod that used the GPU, from the exporter's Kubernetes mapping), hence ``honor_labels``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["prometheus_config"]


def _pods(
    job: str,
    namespace: str,
    app: str,
    port: str,
    label: str = "__meta_kubernetes_pod_label_app_kubernetes_io_name",
    *,
    instance_is_node: bool = False,
) -> dict[str, Any]:
    node = "__meta_kubernetes_pod_node_name"
    # The agents' `instance` is their node's name: a drain_node alert on an agent series then
    # names the node to drain (tensoryard.observability.health.node_of), as the PodMonitor does.
    instance = [{"source_labels": [node], "target_label": "instance"}] if instance_is_node else []
    return {
        "job_name": job,
        "honor_labels": True,
        "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [namespace]}}],
        "relabel_configs": [
            {
                "source_labels": [label],
                "regex": app,
                "action": "keep",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": port,
                "action": "keep",
            },
            {"source_labels": [node], "target_label": "node"},
            *instance,
        ],
    }


def prometheus_config(
    *, platform_namespace: str = "tensoryard", gpu_operator_namespace: str = "gpu-operator"
) -> dict[str, Any]:
    """A complete prometheus.yml: the platform, its agents, the DCGM exporters, the nodes."""
    dcgm = _pods(
        "dcgm-exporter",
        gpu_operator_namespace,
        "nvidia-dcgm-exporter",
        "gpu-metrics",
        label="__meta_kubernetes_pod_label_app",
    )
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "rule_files": ["rules/*.yml"],
        "scrape_configs": [
            _pods("tensoryard-control-plane", platform_namespace, "tensoryard-server", "http"),
            _pods(
                "tensoryard-agent",
                platform_namespace,
                "tensoryard-agent",
                "metrics",
                instance_is_node=True,
            ),
            dcgm,
            {
                "job_name": "node",
                "kubernetes_sd_configs": [{"role": "node"}],
                "relabel_configs": [
                    {
                        "source_labels": ["__address__"],
                        "regex": "(.+):\\d+",
                        "target_label": "__address__",
                        "replacement": "${1}:9100",
                    }
                ],
            },
        ],
    }
