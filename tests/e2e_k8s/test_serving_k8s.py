"""GPU serving on Kubernetes: `tyard serve MODEL --engine vllm|sglang` against a control plane
running as the least-privilege ServiceAccount of deploy/kubernetes/rbac.yaml. The real
Deployment controller, ReplicaSet controller and kube-scheduler place the pods on kwok's fake GPU
nodes; kwok marks them Running and Ready (no engine runs: there are no containers, so the
readiness probe's one-token generation is not exercised here, and no request reaches a pod).
What is checked is what tensoryard does with the cluster: the objects, their GPUs and probes,
the registry version's weights pulled by an init container, replicas found by pod IP, scaling,
a rolling update when the alias moves, deletion, and objects left behind by a dead control
plane collected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tensoryard.serving.kubernetes import LABEL_DEPLOYMENT, MANAGED, object_name
from tests.e2e.conftest import ServerProcess
from tests.e2e_k8s.conftest import REPO, wait_until
from tests.e2e_k8s.platform import (
    start_server,
    tyard,
)

pytestmark = pytest.mark.slow

LWS_CRD = REPO.parent / "shared/k8s/crds/lws/leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def _start(
    servers: list[ServerProcess], tmp_path: Path, identity: Path, namespace: str
) -> ServerProcess:
    server, _ = start_server(tmp_path / "home", identity, namespace)
    servers.append(server)
    return server


def _register(server: ServerProcess, tmp_path: Path, name: str, marker: str) -> None:
    model = tmp_path / f"{name}-{marker}"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (model / "model.safetensors").write_bytes(marker.encode() * 4096)
    out = tyard(server, "models", "register", f"default/{name}", str(model), "--alias", "prod")
    assert out.returncode == 0, out.stdout + out.stderr


def _describe(server: ServerProcess, name: str) -> dict[str, Any]:
    out = tyard(server, "deployments", "describe", name, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return dict(json.loads(out.stdout))


def _deployment(api_client: Any, namespace: str, name: str) -> Any:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return client.AppsV1Api(api_client).read_namespaced_deployment(object_name(name), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_vllm_deployment_runs_as_pods_on_gpu_nodes_scales_rolls_and_is_deleted(
    servers: list[ServerProcess],
    tmp_path: Path,
    identity: Path,
    namespace: str,
    gpu_nodes: Any,
    api_client: Any,
    core: Any,
) -> None:
    nodes = gpu_nodes(2)
    server = _start(servers, tmp_path, identity, namespace)
    _register(server, tmp_path, "tiny", "v1")
    out = tyard(
        server,
        "serve",
        "tiny@prod",
        "--engine",
        "vllm",
        "--replicas",
        "3",
        "-o",
        "tensor_parallel_size=4",
        "-o",
        "kv_cache_dtype=fp8",
        "--timeout",
        "90",
        "--json",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    dep = json.loads(out.stdout)
    assert dep["ready_replicas"] == 3 and dep["model"] == "tiny@prod (version 1)"
    assert dep["model_path"].startswith("artifact:")
    digest_v1 = dep["model_path"].removeprefix("artifact:")

    # the Deployment: 4 GPUs per pod, a one-token readiness probe, the weights' init container
    obj = _deployment(api_client, namespace, "tiny")
    assert obj is not None and obj.spec.replicas == 3
    pod_spec = obj.spec.template.spec
    engine = pod_spec.containers[0]
    assert engine.resources.limits["nvidia.com/gpu"] == "4"
    assert engine.command[:3] == ["vllm", "serve", f"/models/{digest_v1}"]
    assert "--tensor-parallel-size" in engine.command
    assert "'max_tokens':1" in engine.readiness_probe._exec.command[2]
    assert pod_spec.init_containers[0].command[-2:] == [digest_v1, f"/models/{digest_v1}"]

    # the replicas the gateway routes to are the Ready pods, by pod IP, on the GPU nodes;
    # 3 pods of 4 GPUs on 2 nodes of 8: the real scheduler packed them
    reps = dep["replica_states"]
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    assert sorted(r["pod"] for r in reps) == sorted(pods)
    for r in reps:
        assert r["state"] == "ready" and r["node"] in nodes
        assert r["address"] == pods[r["pod"]].status.pod_ip and r["port"] == 8000
    assert len({r["node"] for r in reps}) == 2

    # scale: the Deployment follows, the replicas with it
    assert tyard(server, "deployments", "scale", "tiny", "1").returncode == 0
    wait_until(
        lambda: (_deployment(api_client, namespace, "tiny").spec.replicas == 1) or None,
        timeout=30,
        what="the Deployment scaled to 1",
    )
    wait_until(
        lambda: len(_describe(server, "tiny")["replica_states"]) == 1 or None,
        timeout=60,
        what="one replica left",
    )

    # the alias moves: the deployment is updated to version 2 and Kubernetes rolls the pod
    _register(server, tmp_path, "tiny", "v2")

    def rolled() -> dict[str, Any] | None:
        d = _describe(server, "tiny")
        pod = d["replica_states"][0] if d["replica_states"] else None
        moved = d["model"] == "tiny@prod (version 2)"
        new_pod = pod is not None and pod["pod"] not in pods and pod["state"] == "ready"
        return d if moved and new_pod and len(d["replica_states"]) == 1 else None

    after = wait_until(rolled, timeout=90, what="the rolling update to version 2")
    digest_v2 = after["model_path"].removeprefix("artifact:")
    assert digest_v2 != digest_v1
    init = _deployment(api_client, namespace, "tiny").spec.template.spec.init_containers[0]
    assert init.command[-1] == f"/models/{digest_v2}"

    # delete: the Deployment goes, then its pods
    assert tyard(server, "deployments", "delete", "tiny").returncode == 0
    wait_until(
        lambda: _deployment(api_client, namespace, "tiny") is None or None,
        timeout=30,
        what="the Deployment deleted",
    )


def test_bad_gpu_requests_are_refused_naming_the_field_and_nothing_is_created(
    servers: list[ServerProcess],
    tmp_path: Path,
    identity: Path,
    namespace: str,
    gpu_nodes: Any,
    api_client: Any,
) -> None:
    gpu_nodes(1)
    server = _start(servers, tmp_path, identity, namespace)
    out = tyard(
        server,
        "serve",
        "org/model",
        "--engine",
        "vllm",
        "-o",
        "tensor_parallel_size=3",
        "-o",
        "nodes=2",
        "--no-wait",
    )
    assert out.returncode != 0 and "options.nodes" in out.stdout + out.stderr
    out = tyard(server, "serve", "missing@prod", "--engine", "sglang", "--no-wait")
    assert out.returncode != 0 and "model" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    from kubernetes import client

    assert client.AppsV1Api(api_client).list_namespaced_deployment(namespace).items == []


def _bare_deployment(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai"}]},
            },
        },
    }


def test_serving_objects_of_a_deployment_deleted_while_no_control_plane_ran_are_collected(
    servers: list[ServerProcess],
    tmp_path: Path,
    identity: Path,
    namespace: str,
    gpu_nodes: Any,
    api_client: Any,
) -> None:
    from kubernetes import client

    gpu_nodes(1)
    apps = client.AppsV1Api(api_client)
    leftover = _bare_deployment(object_name("gone"), {**MANAGED, LABEL_DEPLOYMENT: "gone"})
    apps.create_namespaced_deployment(namespace, leftover)
    apps.create_namespaced_deployment(namespace, _bare_deployment("not-ours", {"app": "x"}))
    _start(servers, tmp_path, identity, namespace)
    wait_until(
        lambda: (
            [d.metadata.name for d in apps.list_namespaced_deployment(namespace).items]
            == ["not-ours"]
            or None
        ),
        timeout=60,
        what="the leftover serving Deployment collected (and only it)",
    )


def test_a_multi_node_replica_is_a_leaderworkerset_group_whose_leader_serves(
    servers: list[ServerProcess],
    tmp_path: Path,
    identity: Path,
    namespace: str,
    gpu_nodes: Any,
    api_client: Any,
    core: Any,
) -> None:
    """With the LWS controller in the environment (scripts/k8s-testenv builds it when the Go
    module proxy serves it) the group's pods run and the leader becomes the replica; without
    it, the CRD is installed from ../shared and the object is checked as the API server kept it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    crd_name = "leaderworkersets.leaderworkerset.x-k8s.io"
    try:
        ext.read_custom_resource_definition(crd_name)
        controller = True
    except ApiException:
        controller = False
        if not LWS_CRD.is_file():
            pytest.skip(f"no LWS controller in this environment and {LWS_CRD} is absent")
        ext.create_custom_resource_definition(yaml.safe_load(LWS_CRD.read_text()))

        def established() -> bool | None:
            conds = ext.read_custom_resource_definition(crd_name).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conds) or None

        wait_until(established, timeout=30, what="the LWS CRD established")
    nodes = gpu_nodes(2)
    server = _start(servers, tmp_path, identity, namespace)
    out = tyard(
        server,
        "serve",
        "/mnt/shared/models/llama-70b",
        "--name",
        "big",
        "--engine",
        "sglang",
        "-o",
        "tensor_parallel_size=16",
        "-o",
        "nodes=2",
        "--no-wait",
        "--json",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    custom = client.CustomObjectsApi(api_client)

    def created() -> Any:
        try:
            return custom.get_namespaced_custom_object(
                "leaderworkerset.x-k8s.io", "v1", namespace, "leaderworkersets", object_name("big")
            )
        except ApiException:
            return None

    lws = wait_until(created, timeout=30, what="the LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and lws["spec"]["replicas"] == 1
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "readinessProbe" in leader and "readinessProbe" not in worker
    assert "/mnt/shared/models/llama-70b" in " ".join(leader["command"])
    # the API server kept every field (a structural schema prunes unknown ones silently)
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxUnavailable"] == 0
    if controller:
        # the group runs on both nodes; only the leader is a replica, reached at its pod IP
        def serving() -> dict[str, Any] | None:
            d = _describe(server, "big")
            return d if d["ready_replicas"] == 1 else None

        dep = wait_until(serving, timeout=90, what="the LWS leader ready as the replica")
        pods = core.list_namespaced_pod(namespace).items
        assert len(pods) == 2 and {p.spec.node_name for p in pods} == set(nodes)
        (rep,) = dep["replica_states"]
        (leader_pod,) = [p for p in pods if p.metadata.name == rep["pod"]]
        assert rep["address"] == leader_pod.status.pod_ip
        worker_pod = next(p for p in pods if p.metadata.name != rep["pod"])
        env = {e.name: e.value for e in worker_pod.spec.containers[0].env or []}
        assert env["LWS_WORKER_INDEX"] == "1" and env["LWS_GROUP_SIZE"] == "2"
        assert "$(LWS_LEADER_ADDRESS)" in " ".join(worker_pod.spec.containers[0].command)
    assert tyard(server, "deployments", "delete", "big").returncode == 0
    wait_until(lambda: created() is None or None, timeout=30, what="the LWS deleted")
