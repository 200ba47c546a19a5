"""Node labels and taints: the one place topology label names are defined.

The scheduler models a node's position as ``switch`` (leaf switch) and ``block`` (spine block
above it), see tensoryard.scheduler.model.Node. The same two levels plus the host are Kueue's
Topology levels, so both admission engines read the same labels:

    tensoryard.io/topology-block    spine block     -> Node.block
    tensoryard.io/topology-switch   leaf switch     -> Node.switch
    kubernetes.io/hostname          the node        (set by the kubelet)

`node_from_labels` is the reading side: it turns a Kubernetes Node's labels and capacity into
the scheduler's Node, so what `tyard cluster plan` writes is what placement uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensoryard.cluster.inventory import Inventory, NodeSpec
from tensoryard.scheduler.model import Node

__all__ = [
    "GPU_RESOURCE",
    "GPU_TAINT",
    "LABEL_BLOCK",
    "LABEL_GPU_MODEL",
    "LABEL_HOSTNAME",
    "LABEL_IB_RAILS",
    "LABEL_INTERCONNECT",
    "LABEL_RACK",
    "LABEL_SWITCH",
    "TOPOLOGY_LEVELS",
    "node_from_labels",
    "node_labels",
    "node_manifests",
    "node_taints",
]

LABEL_BLOCK = "tensoryard.io/topology-block"
LABEL_SWITCH = "tensoryard.io/topology-switch"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_RACK = "tensoryard.io/rack"
LABEL_GPU_MODEL = "tensoryard.io/gpu-model"
LABEL_INTERCONNECT = "tensoryard.io/gpu-interconnect"
LABEL_IB_RAILS = "tensoryard.io/ib-rails"
TOPOLOGY_LEVELS = (LABEL_BLOCK, LABEL_SWITCH, LABEL_HOSTNAME)
"""Kueue Topology levels, widest first."""

GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
"""GPU nodes carry this taint; GPU pods tolerate it, everything else stays off."""


def node_labels(node: NodeSpec) -> dict[str, str]:
    """Labels `tyard cluster plan` puts on one node."""
    labels = {
        LABEL_HOSTNAME: node.name,
        LABEL_BLOCK: node.spine,
        LABEL_SWITCH: node.leaf,
        LABEL_RACK: node.rack,
        LABEL_GPU_MODEL: node.gpu.model,
        LABEL_INTERCONNECT: node.gpu.interconnect,
    }
    if node.ib is not None:
        labels[LABEL_IB_RAILS] = str(node.ib.rails)
    return labels


def node_taints(node: NodeSpec) -> list[dict[str, str]]:
    """Taints of one node (every inventory node has GPUs)."""
    return [dict(GPU_TAINT)] if node.gpu.count > 0 else []


def node_manifests(inventory: Inventory) -> list[dict[str, Any]]:
    """Node patches (apply with `kubectl apply --server-side` or `kubectl patch`)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": n.name, "labels": node_labels(n)},
            "spec": {"taints": node_taints(n)},
        }
        for n in inventory.nodes
    ]


def node_from_labels(
    name: str,
    labels: Mapping[str, str],
    capacity: Mapping[str, str],
    *,
    unschedulable: bool = False,
) -> Node:
    """The scheduler's Node for a Kubernetes Node (labels, ``status.allocatable``)."""
    gpus = int(capacity.get(GPU_RESOURCE, "0") or 0)
    return Node(
        name=name,
        gpu_model=labels.get(LABEL_GPU_MODEL) if gpus > 0 else None,
        gpus_total=gpus,
        cpu_total=_cpu(capacity.get("cpu", "0")),
        mem_total=_memory(capacity.get("memory", "0")),
        switch=labels.get(LABEL_SWITCH, ""),
        block=labels.get(LABEL_BLOCK, ""),
        cordoned=unschedulable,
    )


def _cpu(text: str) -> float:
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


_UNITS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "k": 1000, "M": 1000**2}
_UNITS |= {"G": 1000**3, "T": 1000**4}


def _memory(text: str) -> int:
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * _UNITS[suffix])
    return int(float(text or 0))
