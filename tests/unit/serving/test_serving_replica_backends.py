"""The replica supervisor hands each deployment to one backend, chosen by its engine: the GPU
engines' to the Kubernetes backend (pods), every other engine's to the local one (processes).
A GPU deployment never spawns a process here, and a CPU one never reaches the cluster, with the
same supervisor running both at once."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry
from tests.unit.serving.test_serving_kube_replicas import Clock, Cluster, pod, tick

from tensoryard.serving.gpu_engines import GPU_ENGINES
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.replicas import ReplicaManager
from tensoryard.serving.replicas_kube import KubeReplicas
from tensoryard.serving.replicas_local import LocalReplicas
from tensoryard.store import Store


def _deploy(store: Store, name: str, engine: str) -> None:
    store.create_deployment(
        name,
        team="default",
        model_ref=f"{name}@prod (version 1)",
        model_path="artifact:" + "ab" * 32,
        engine=engine,
        replicas=1,
        options={},
        idle_timeout_s=None,
        created_by="admin",
    )


def test_each_engine_has_one_backend_and_the_two_run_side_by_side(
    sqlite_store: Store, tmp_path: Path
) -> None:
    sqlite_store.ensure_team("default")
    _deploy(sqlite_store, "big", sorted(GPU_ENGINES)[0])
    _deploy(sqlite_store, "small", "mock")
    cluster = Cluster()
    spawned: list[str] = []

    def command(dep: object, port: int) -> list[str]:
        spawned.append(dep.name)  # type: ignore[attr-defined]
        return ["sleep", "30"]

    m = ReplicaManager(
        sqlite_store,
        log_dir=tmp_path,
        metrics=ServingMetrics(CollectorRegistry()),
        command_for=command,
        kube=cluster,  # type: ignore[arg-type]
        clock=Clock(),
        probe_timeout_s=0.2,
    )
    try:
        records = {d.name: d for d in sqlite_store.list_deployments()}
        assert isinstance(m.backend(records["big"]), KubeReplicas)
        assert isinstance(m.backend(records["small"]), LocalReplicas)
        cluster.listed["big"] = [pod("p0", ip="10.0.0.9")]
        tick(m)
        assert cluster.counts == {"big": 1}  # only the GPU deployment reached the cluster
        assert spawned == ["small"]  # only the CPU deployment was spawned here
        assert [r.url for r in m.replicas("big")] == ["http://10.0.0.9:8000"]
        (local,) = m.replicas("small")
        assert local.pod is None and local.pid is not None and not local.exited()
        sqlite_store.delete_deployment("big")
        sqlite_store.delete_deployment("small")
        tick(m)
        assert cluster.deleted == ["big"]
        assert local.exited()  # the local backend stopped its process
    finally:
        m.stop()
