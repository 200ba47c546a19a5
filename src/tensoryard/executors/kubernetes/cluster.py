"""The cluster as tensoryard's scheduler sees it, built from Node objects.

Each node's allocatable `nvidia.com/gpu`, its GPU model (GPU Feature Discovery's
`nvidia.com/gpu.product` label), its switch and block (configurable labels), whether it takes
new jobs (cordon, readiness, taints beyond the pods' tolerations), and the GPUs that pods
tensoryard did not create hold there, so nothing is double-booked. The pure core then places
jobs on these nodes exactly as it does on the local machine.

`node_capacities` and `check_fits` are pure; `KubernetesCluster` lists nodes and pods (by the
configured node selector, cached for `capacity_ttl_s`) and feeds them to them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from tensoryard.errors import ExecutorError, FieldIssue, SpecError
from tensoryard.executors.capacity import NodeCapacity
from tensoryard.executors.kubernetes.client import Kube
from tensoryard.executors.kubernetes.manifests import LABEL_JOB_ID
from tensoryard.executors.kubernetes.status import (
    Obj,
    alive,
    get,
    node_loss,
    node_ready,
    parse_quantity,
)
from tensoryard.executors.kubernetes.watch import WatchCache
from tensoryard.spec.job import JobSpec

__all__ = ["KubernetesCluster", "check_fits", "node_capacities", "unfit_issue"]


def _tolerated(taint: Obj, tolerations: Sequence[Obj]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value") == taint.get("value"):
            return True
    return False


def _pod_gpus(pod: Obj, resource: str) -> int:
    total = 0
    for c in get(pod, "spec", "containers") or []:
        res = c.get("resources") or {}
        amount = (res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(
            resource
        )
        total += int(parse_quantity(amount))
    return total


def node_capacities(
    nodes: Sequence[Obj],
    pods: Sequence[Obj],
    *,
    gpu_resource: str,
    gpu_product_label: str,
    switch_label: str,
    block_label: str,
    tolerations: Sequence[Obj] = (),
) -> tuple[NodeCapacity, ...]:
    """What the platform's scheduler sees of `nodes`.

    A node that is cordoned, not Ready, or tainted NoSchedule/NoExecute beyond `tolerations`
    takes no new jobs (running ones stay). GPUs that pods tensoryard did not create hold are
    unavailable (the highest indices: Kubernetes, not tensoryard, picks the devices)."""
    foreign: dict[str, int] = {}
    for pod in pods:
        node = get(pod, "spec", "nodeName")
        labels = get(pod, "metadata", "labels") or {}
        if not node or LABEL_JOB_ID in labels or not alive(pod):
            continue
        foreign[node] = foreign.get(node, 0) + _pod_gpus(pod, gpu_resource)
    out = []
    for node in nodes:
        name = str(get(node, "metadata", "name"))
        labels = get(node, "metadata", "labels") or {}
        alloc = get(node, "status", "allocatable") or {}
        gpus = int(parse_quantity(alloc.get(gpu_resource)))
        taints = [
            t
            for t in get(node, "spec", "taints") or []
            if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, tolerations)
        ]
        closed = bool(get(node, "spec", "unschedulable")) or not node_ready(node) or bool(taints)
        condition = ""
        if not node_ready(node):
            condition = (node_loss(name, node) or f"node {name} not Ready").removeprefix(
                f"node {name} "
            )
        elif get(node, "spec", "unschedulable"):
            condition = "unschedulable (cordoned in Kubernetes)"
        elif taints:
            condition = "tainted " + ", ".join(
                f"{t.get('key')}" + (f"={t['value']}" if t.get("value") else "") + f":{t['effect']}"
                for t in taints
            )
        used = min(foreign.get(name, 0), gpus)
        out.append(
            NodeCapacity(
                name=name,
                cpu_slots=float(parse_quantity(alloc.get("cpu"))),
                memory_bytes=int(parse_quantity(alloc.get("memory"))),
                gpu_indices=tuple(range(gpus)),
                gpu_model=labels.get(gpu_product_label) if gpus else None,
                switch=str(labels.get(switch_label, "")),
                block=str(labels.get(block_label, "")),
                cordoned=closed,
                unavailable_gpus=tuple(range(gpus - used, gpus)),
                condition=condition,
            )
        )
    return tuple(sorted(out, key=lambda n: n.name))


def check_fits(spec: JobSpec, nodes: Sequence[NodeCapacity], *, autoscaler: bool = False) -> None:
    """Refuse a job that no set of these nodes could ever hold, naming the field and the fix.

    Counts every GPU of every node (busy, cordoned or not): a job that merely has to wait is
    not refused here. With `autoscaler` (nodes can be added to the cluster) such a job is
    accepted: it stays pending, saying what the cluster as it is lacks, until nodes come."""
    issue = unfit_issue(spec, nodes)
    if issue is not None and not autoscaler:
        raise SpecError([issue], source="request")


def unfit_issue(spec: JobSpec, nodes: Sequence[NodeCapacity]) -> FieldIssue | None:
    """What no set of `nodes` could ever give the job (what is short, by how much), or None."""
    res = spec.resources
    model = spec.scheduling.gpu_model
    models = sorted({n.gpu_model for n in nodes if n.gpu_model})
    if model and model not in models:
        known = ", ".join(models) or "none (no node has GPUs)"
        return FieldIssue(
            "scheduling.gpu_model", f"no node has GPUs of model {model!r}", f"use one of: {known}"
        )
    if not res.gpus_per_node:
        if res.nodes > len(nodes):  # a gang needs one node per worker group
            return FieldIssue(
                "resources.nodes",
                f"{res.nodes} nodes needed, but the cluster has {len(nodes)} "
                f"(short by {res.nodes - len(nodes)})",
                f"ask for at most {len(nodes)} nodes, or add nodes to the cluster",
            )
        return None
    usable = [n for n in nodes if n.gpu_model and (not model or n.gpu_model == model)]
    largest = max((len(n.gpu_indices) for n in usable), default=0)
    if res.gpus_per_node > largest:
        return FieldIssue(
            "resources.gpus_per_node",
            f"{res.gpus_per_node} GPUs per node, but the largest node has {largest}",
            f"ask for at most {largest} per node and more nodes"
            if largest
            else "this cluster has no GPU nodes",
        )
    enough = sum(1 for n in usable if len(n.gpu_indices) >= res.gpus_per_node)
    if res.nodes > enough:
        return FieldIssue(
            "resources.nodes",
            f"{res.nodes} nodes with {res.gpus_per_node} GPUs each, but the cluster has "
            f"{enough} such node(s) (short by {res.nodes - enough})",
            f"ask for at most {enough} nodes",
        )
    return None


_LIVE = "status.phase!=Succeeded,status.phase!=Failed"


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class KubernetesCluster:
    """Node objects -> NodeCapacity for the scheduler, refreshed at most every
    `capacity_ttl_s`. An API error keeps the last good view (and logs nothing new to the
    scheduler) until the listing works again."""

    def __init__(self, kube: Kube, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[NodeCapacity, ...] | None = None
        self._at = 0.0
        self._nodes: WatchCache | None = None
        self._pods: WatchCache | None = None

    def start_watches(self) -> None:
        """Keep the selected nodes and every unfinished pod in list-then-watch caches."""
        k = self.kube
        self._nodes = WatchCache(
            k,
            "nodes",
            k.core.list_node,
            label_selector=_selector(dict(k.config.node_selector)) or None,
        ).start()
        self._pods = WatchCache(
            k, "pods (cluster-wide)", k.core.list_pod_for_all_namespaces, field_selector=_LIVE
        ).start()

    def close(self) -> None:
        for cache in (self._nodes, self._pods):
            if cache is not None:
                cache.stop()

    def check_labels(self) -> None:
        """ConfigError-like check at start: the node selector matches some node."""
        nodes = self._list_nodes()
        if not nodes:
            selector = _selector(dict(self.kube.config.node_selector)) or "(none)"
            raise ExecutorError(
                f"no node matches the node selector {selector} (fix: label the GPU nodes, e.g. "
                "`kubectl label node NAME KEY=VALUE`, or change --node-selector)"
            )
        self.capacity()

    def capacity(self) -> tuple[NodeCapacity, ...]:
        with self._lock:
            now = self.clock()
            if self._cached is not None and now - self._at < self.kube.config.capacity_ttl_s:
                return self._cached
            try:
                self._cached = self._read()
                self._at = now
            except ExecutorError:
                if self._cached is None:
                    raise
            return self._cached

    def check_fits(self, spec: JobSpec) -> None:
        check_fits(spec, self.capacity(), autoscaler=self.kube.config.autoscaler)

    def node_objects(self) -> list[Obj]:
        """The selected Node objects: from the watch cache when it is healthy, else a LIST."""
        cache = self._nodes
        if cache is not None and cache.ready():
            return cache.items()
        return self._list_nodes()

    def nodes_cached(self) -> bool:
        """Whether `node_objects` is answered from the watch cache (costs no API call)."""
        return self._nodes is not None and self._nodes.ready()

    def _list_nodes(self) -> list[Obj]:
        cfg = self.kube.config
        result = self.kube.call(
            "list nodes (cluster-wide)",
            self.kube.core.list_node,
            label_selector=_selector(dict(cfg.node_selector)) or None,
        )
        return [self.kube.plain(n) for n in result.items]

    def _read(self) -> tuple[NodeCapacity, ...]:
        cfg = self.kube.config
        nodes_cache, pods_cache = self._nodes, self._pods
        if (
            nodes_cache is not None
            and pods_cache is not None
            and nodes_cache.ready()
            and pods_cache.ready()
        ):
            nodes, pods = nodes_cache.items(), pods_cache.items()
        else:
            nodes = self._list_nodes()
            listed = self.kube.call(
                "list pods (cluster-wide)",
                self.kube.core.list_pod_for_all_namespaces,
                field_selector=_LIVE,
            )
            pods = [self.kube.plain(p) for p in listed.items]
        return node_capacities(
            nodes,
            pods,
            gpu_resource=cfg.gpu_resource,
            gpu_product_label=cfg.gpu_product_label,
            switch_label=cfg.switch_label,
            block_label=cfg.block_label,
            tolerations=[dict(t) for t in cfg.tolerations],
        )
