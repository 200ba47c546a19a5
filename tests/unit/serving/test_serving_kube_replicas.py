"""The replica supervisor with a Kubernetes deployment: the count it asks of the cluster, the
Ready pods it hands the gateway (by pod IP), pods that go away, scale to zero and back, and
deletion. The cluster side here is a recording stand-in for KubeServing's four calls; the real
API server is in tests/e2e_k8s/test_serving_k8s.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tensoryard.errors import ExecutorError
from tensoryard.serving.kubernetes import ServingPod
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.replicas import ReplicaManager
from tensoryard.store import Store
from tensoryard.store._serving import DeploymentRecord


def pod(name: str, ready: bool = True, ip: str = "10.0.0.1") -> ServingPod:
    return ServingPod(name, ip, ready, "gpu-1", "Running", 0, None, None, "")


@dataclass
class Cluster:
    """What KubeServing would do to a cluster: remembers counts, serves a pod list."""

    counts: dict[str, int] = field(default_factory=dict)
    listed: dict[str, list[ServingPod]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    fail: str = ""

    def ensure(self, dep: DeploymentRecord, replicas: int) -> bool:
        if self.fail:
            raise ExecutorError(self.fail)
        changed = self.counts.get(dep.name) != replicas
        self.counts[dep.name] = replicas
        return changed

    def pods(self, dep: DeploymentRecord) -> list[ServingPod]:
        return self.listed.get(dep.name, [])

    def delete(self, name: str) -> None:
        self.deleted.append(name)
        self.counts.pop(name, None)

    def collect(self, keep: Any) -> list[str]:
        return []


class Clock:
    """A clock the test moves: :func:`tick` moves it 2 s before a reconcile, so each one lists
    the pods again (they are listed at most once a second unless something changed)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tick(m: ReplicaManager, seconds: float = 2.0) -> None:
    m.clock.now += seconds  # type: ignore[attr-defined]
    m.reconcile()


def manager(store: Store, tmp_path: Path, cluster: Cluster) -> ReplicaManager:
    return ReplicaManager(
        store,
        log_dir=tmp_path,
        metrics=ServingMetrics(CollectorRegistry()),
        kube=cluster,  # type: ignore[arg-type]  # the four calls KubeServing has
        clock=Clock(),
    )


def create(store: Store, replicas: int = 2, idle: float | None = None) -> None:
    store.ensure_team("default")
    store.create_deployment(
        "llama",
        team="default",
        model_ref="llama@prod (version 1)",
        model_path="artifact:" + "ab" * 32,
        engine="vllm",
        replicas=replicas,
        options={"tensor_parallel_size": 4, "router": "prefix"},
        idle_timeout_s=idle,
        created_by="admin",
    )


def test_ready_pods_become_replicas_routed_by_pod_ip(sqlite_store: Store, tmp_path: Path) -> None:
    cluster = Cluster()
    create(sqlite_store)
    m = manager(sqlite_store, tmp_path, cluster)
    tick(m)
    assert cluster.counts == {"llama": 2}
    assert m.replicas("llama") == []
    cluster.listed["llama"] = [pod("a", ip="10.0.0.5"), pod("b", ready=False, ip="10.0.0.6")]
    tick(m)
    reps = {r.pod.name: r for r in m.replicas("llama")}
    assert reps["a"].ready and not reps["b"].ready
    replica, route = asyncio.run(m.acquire("llama", "Hello", timeout_s=1))
    assert replica.url == "http://10.0.0.5:8000" and replica.id == "llama/a"
    m.release(replica, route=route)
    # pod a goes (a node failed), pod c replaces it: its slot is reused, a is forgotten
    cluster.listed["llama"] = [pod("b", ip="10.0.0.6"), pod("c", ip="10.0.0.7")]
    tick(m)
    assert sorted((r.slot, r.pod.name, r.ready) for r in m.replicas("llama")) == [
        (0, "c", True),
        (1, "b", True),
    ]


def test_scaling_and_deleting_reach_the_cluster_and_processes_are_never_spawned(
    sqlite_store: Store, tmp_path: Path
) -> None:
    cluster = Cluster()
    create(sqlite_store)
    m = manager(sqlite_store, tmp_path, cluster)
    tick(m)
    sqlite_store.scale_deployment("llama", 5)
    tick(m)
    assert cluster.counts == {"llama": 5}
    assert sqlite_store.list_replicas("llama") == []  # no replica process rows
    sqlite_store.delete_deployment("llama")
    tick(m)
    assert cluster.deleted == ["llama"]


def test_an_idle_deployment_scales_to_zero_and_a_request_brings_it_back(
    sqlite_store: Store, tmp_path: Path
) -> None:
    cluster = Cluster()
    create(sqlite_store, replicas=1, idle=60)
    m = manager(sqlite_store, tmp_path, cluster)
    cluster.listed["llama"] = [pod("a")]
    tick(m)
    assert cluster.counts == {"llama": 1}
    tick(m, 120)
    assert cluster.counts == {"llama": 0}
    cluster.listed["llama"] = []
    tick(m)

    async def call() -> str:
        task = asyncio.create_task(m.acquire("llama", "Hi", timeout_s=5))
        await asyncio.sleep(0.05)  # the request is held while the replica starts
        tick(m)
        assert cluster.counts == {"llama": 1}
        cluster.listed["llama"] = [pod("b", ip="10.0.0.9")]
        tick(m)
        replica, _ = await task
        return replica.url

    assert asyncio.run(call()) == "http://10.0.0.9:8000"


def test_a_cluster_error_is_kept_for_describe_and_cleared_when_it_passes(
    sqlite_store: Store, tmp_path: Path
) -> None:
    cluster = Cluster(fail="Kubernetes refused to create deployments.apps: quota")
    create(sqlite_store)
    m = manager(sqlite_store, tmp_path, cluster)
    tick(m)
    assert "quota" in m.error("llama")
    cluster.fail = ""
    tick(m)
    assert m.error("llama") == "" and cluster.counts == {"llama": 2}


def test_without_kubernetes_a_gpu_deployment_says_what_to_start(
    sqlite_store: Store, tmp_path: Path
) -> None:
    create(sqlite_store)
    m = ReplicaManager(sqlite_store, log_dir=tmp_path, metrics=ServingMetrics(CollectorRegistry()))
    m.reconcile()
    assert "--executor kubernetes" in m.error("llama")
    assert m.replicas("llama") == []
