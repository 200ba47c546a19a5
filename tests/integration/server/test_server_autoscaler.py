"""A job larger than the cluster as it is, through the REST API: refused (422) on a fixed
cluster; with `--autoscaler` accepted, pending with what the cluster lacks, and admitted once a
node is added. The cluster view is the Kubernetes executor's own (`KubernetesCluster` over Node
objects) on a stand-in for the API server's node and pod lists; the store is real (SQLite) and the
control loop is driven by hand (`controller.cycle()`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tensoryard.executors.kubernetes.cluster import KubernetesCluster
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane

GANG = {
    "name": "gang",
    "command": ["train.py"],
    "launcher": "torchrun",
    "resources": {"nodes": 2, "gpus_per_node": 8},
}
MODEL = "NVIDIA-H100-80GB-HBM3"


def gpu_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": MODEL}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@dataclass
class NodeList:
    """The API server's answers to the two LIST calls the cluster view makes."""

    config: KubernetesConfig
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = SimpleNamespace(
            list_node=lambda **_: SimpleNamespace(items=list(self.nodes)),
            list_pod_for_all_namespaces=lambda **_: SimpleNamespace(items=[]),
        )

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def plain(self, obj: Any) -> Any:
        return obj


@dataclass
class World:
    plane: ControlPlane
    api: TestClient
    kube: NodeList


@pytest.fixture(params=[False, True], ids=["a fixed cluster", "an autoscaled cluster"])
def world(
    request: pytest.FixtureRequest, tmp_path: Path, migrated_sqlite_url: str
) -> Iterator[World]:
    kube = NodeList(
        KubernetesConfig(autoscaler=request.param, capacity_ttl_s=0), nodes=[gpu_node("g1")]
    )
    cluster = KubernetesCluster(kube)  # type: ignore[arg-type]  # the two LIST calls only
    plane = build_control_plane(
        ServerConfig(home=tmp_path / "home", db_url=migrated_sqlite_url, cpu_slots=2)
    )
    plane.fits = cluster.check_fits  # what the Kubernetes backend checks at submit
    plane.controller.capacity = cluster.capacity
    assert plane.controller.lead()
    with TestClient(plane.app()) as api:
        api.headers["Authorization"] = f"Bearer {plane.admin_token}"
        yield World(plane, api, kube)
    plane.store.close()


def test_a_gang_larger_than_the_cluster_is_refused_or_waits_for_nodes_to_be_added(
    world: World,
) -> None:
    response = world.api.post("/api/v1/jobs", json={"spec": GANG})
    if not world.kube.config.autoscaler:
        assert response.status_code == 422, response.text
        assert "resources.nodes" in response.text and "(short by 1)" in response.text
        assert world.api.get("/api/v1/jobs").json()["items"] == []  # nothing stored
        return
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    world.plane.controller.cycle()
    job = world.api.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] == "PENDING"
    assert job["pending_reason"] == (
        f"cannot fit the cluster as it is: needs 2 nodes of 8 {MODEL} GPUs; the cluster has 1 "
        f"node(s) with 8 or more {MODEL} GPUs (short by 1); it starts when nodes are added "
        "(fix: ask for at most 1 nodes)"
    )
    assert job["pending_eta"] is None
    world.kube.nodes.append(gpu_node("g2"))  # the autoscaler adds a node
    world.plane.controller.cycle()
    job = world.api.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] != "PENDING", job
    assert sorted(job["placement"]) == ["g1", "g2"]
    assert world.api.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    world.plane.controller.cycle()
