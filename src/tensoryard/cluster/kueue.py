"""Kueue objects mirroring the platform's queues (kueue.x-k8s.io/v1beta2, Kueue 0.19).

Mapping, one to one with tensoryard.spec.queue:

- a ResourceFlavor per GPU model, selecting nodes by ``tensoryard.io/gpu-model``, adding the GPU
  taint's toleration to admitted pods, and naming the Topology;
- a Topology whose levels are the labels `tensoryard.cluster.labels` puts on nodes;
- a ClusterQueue per platform queue: nominal quota per model, ``borrowingLimit`` and
  ``lendingLimit`` from the queue's limits, ``cohortName``, fair-sharing weight, and
  preemption that reclaims lent quota and lets higher priority preempt lower;
- a Cohort per platform cohort (``parentName`` for nested ones, its own nominal quota);
- a LocalQueue per queue in the jobs' namespace (same name as the queue);
- the WorkloadPriorityClasses of the inventory.

Kueue rejects a workload whose pods request a resource its ClusterQueue does not cover, so
``cpu`` and ``memory`` are covered too, in proportion to GPUs (the inventory's CPU and memory
per GPU of that model, rounded down).
"""

from __future__ import annotations

from typing import Any

from tensoryard.cluster.inventory import Inventory
from tensoryard.cluster.labels import GPU_RESOURCE, GPU_TAINT, LABEL_GPU_MODEL, TOPOLOGY_LEVELS
from tensoryard.spec.queue import CohortSpec, QueueSpec

__all__ = ["API_VERSION", "TOPOLOGY_NAME", "flavor_name", "kueue_objects"]

API_VERSION = "kueue.x-k8s.io/v1beta2"
TOPOLOGY_NAME = "tensoryard-topology"
_COVERED = ["cpu", "memory", GPU_RESOURCE]


def flavor_name(model: str) -> str:
    """ResourceFlavor name of a GPU model ('H100' -> 'gpu-h100')."""
    return "gpu-" + model.lower().replace("_", "-").replace(".", "-")


def kueue_objects(inventory: Inventory) -> list[dict[str, Any]]:
    """Every Kueue object, in an order `kubectl apply` accepts (referenced objects first)."""
    models = list(inventory.gpus_by_model())
    per_gpu = _per_gpu(inventory)
    objects: list[dict[str, Any]] = [_topology()]
    objects += [_flavor(m) for m in models]
    objects += [
        _priority_class(p.name, p.value, p.description) for p in inventory.cluster.priorities
    ]
    objects += [_cohort(c, models, per_gpu) for c in inventory.quotas.cohorts]
    objects += [_cluster_queue(q, models, per_gpu) for q in inventory.quotas.queues]
    objects += [_local_queue(q.name, inventory.cluster.namespace) for q in inventory.quotas.queues]
    return objects


def _per_gpu(inventory: Inventory) -> dict[str, tuple[int, int]]:
    """GPU model -> (CPU cores, memory bytes) per GPU, over the inventory's nodes."""
    cpu: dict[str, int] = {}
    mem: dict[str, int] = {}
    gpus = inventory.gpus_by_model()
    for node in inventory.nodes:
        cpu[node.gpu.model] = cpu.get(node.gpu.model, 0) + node.cpu
        mem[node.gpu.model] = mem.get(node.gpu.model, 0) + node.memory
    return {m: (cpu[m] // gpus[m], mem[m] // gpus[m]) for m in gpus}


def _meta(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {"app.kubernetes.io/managed-by": "tensoryard"}}


def _topology() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Topology",
        "metadata": _meta(TOPOLOGY_NAME),
        "spec": {"levels": [{"nodeLabel": label} for label in TOPOLOGY_LEVELS]},
    }


def _flavor(model: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": _meta(flavor_name(model)),
        "spec": {
            "nodeLabels": {LABEL_GPU_MODEL: model},
            "tolerations": [
                {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}
            ],
            "topologyName": TOPOLOGY_NAME,
        },
    }


def _priority_class(name: str, value: int, description: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": _meta(name),
        "value": value,
        "description": description,
    }


def _amounts(gpus: int, per_gpu: tuple[int, int]) -> list[int | str]:
    cpu, mem = per_gpu
    return [gpus * cpu, f"{gpus * mem // 1024**2}Mi", gpus]


def _resources(
    owner: QueueSpec | CohortSpec, model: str, per_gpu: tuple[int, int]
) -> list[dict[str, Any]]:
    nominal = _amounts(owner.nominal.get(model, 0), per_gpu)
    # Kueue allows limits only on members of a cohort (a queue with a cohort, a child cohort).
    shared = bool(owner.cohort if isinstance(owner, QueueSpec) else owner.parent)
    borrow = owner.borrowing_limit_for(model) if shared else None
    lend = owner.lending_limit_for(model) if shared else None
    if lend is not None:  # Kueue requires lendingLimit <= nominalQuota
        lend = min(lend, owner.nominal.get(model, 0))
    out: list[dict[str, Any]] = []
    for i, resource in enumerate(_COVERED):
        row: dict[str, Any] = {"name": resource, "nominalQuota": nominal[i]}
        if borrow is not None:
            row["borrowingLimit"] = _amounts(borrow, per_gpu)[i]
        if lend is not None:
            row["lendingLimit"] = _amounts(lend, per_gpu)[i]
        out.append(row)
    return out


def _resource_groups(
    owner: QueueSpec | CohortSpec, models: list[str], per_gpu: dict[str, tuple[int, int]]
) -> list[dict[str, Any]]:
    flavors = [
        {"name": flavor_name(m), "resources": _resources(owner, m, per_gpu[m])} for m in models
    ]
    return [{"coveredResources": list(_COVERED), "flavors": flavors}]


def _cohort(
    cohort: CohortSpec, models: list[str], per_gpu: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if cohort.parent:
        spec["parentName"] = cohort.parent
    if cohort.nominal:
        spec["resourceGroups"] = _resource_groups(cohort, models, per_gpu)
    return {
        "apiVersion": API_VERSION,
        "kind": "Cohort",
        "metadata": _meta(cohort.name),
        "spec": spec,
    }


def _cluster_queue(
    queue: QueueSpec, models: list[str], per_gpu: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": _resource_groups(queue, models, per_gpu),
        "preemption": {
            "reclaimWithinCohort": "Any",
            "borrowWithinCohort": {"policy": "LowerPriority"},
            "withinClusterQueue": "LowerPriority",
        },
        "fairSharing": {"weight": _weight(queue.weight)},
    }
    if queue.cohort:
        spec["cohortName"] = queue.cohort
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": _meta(queue.name),
        "spec": spec,
    }


def _weight(weight: float) -> int | str:
    return int(weight) if float(weight).is_integer() else f"{round(weight * 1000)}m"


def _local_queue(name: str, namespace: str) -> dict[str, Any]:
    meta = _meta(name) | {"namespace": namespace}
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": meta,
        "spec": {"clusterQueue": name},
    }
