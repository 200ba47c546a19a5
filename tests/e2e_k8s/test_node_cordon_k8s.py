"""The closed health loop on Kubernetes, and the node agent's DaemonSet, against the real test
control plane (kube-apiserver, controller-manager with the DaemonSet controller, kube-scheduler;
kwok's fake nodes).

- A health-driven drain cordons the Kubernetes Node (unschedulable, taint, annotations), the
  real kube-scheduler places no new pod there, the job moves to the other node, and an explicit
  uncordon gives the Node back exactly as it was (the waiting pod is then bound there).
- A Node an admin cordoned by hand stays cordoned after tensoryard's own uncordon.
- A cordon recorded in the nodes table whose Node patch never happened (a control plane
  killed in between) is carried out when the control plane starts again, and so is an uncordon.
- Without the `patch nodes` grant the server refuses to start, naming it; with
  --no-cordon-nodes it starts and never writes a Node.
- deploy/kubernetes-overlays/agent applies for real; the DaemonSet controller and
  kube-scheduler put its pods on exactly the GPU-labelled nodes, a cordoned one included.

The control plane runs as the ServiceAccount of deploy/kubernetes/rbac.yaml (so the `patch
nodes` grant is tested too), never as admin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tensoryard.executors.kubernetes.nodes import ANNOTATION_OWNER, ANNOTATION_REASON, TAINT_KEY
from tensoryard.server.config import ServerConfig
from tensoryard.store import Store
from tests.e2e.conftest import ServerProcess, free_port, wait_for
from tests.e2e_k8s.conftest import GPU_TAINT, GPU_TOLERATION, K8sEnv, fake_gpu_node, wait_until
from tests.e2e_k8s.platform import (
    COMPLETE_DELAY,
    COMPLETE_JITTER,
    SERVICE_ACCOUNT,
    job_spec,
    start_server,
    tyard,
)
from tests.unit.cluster.deploy_render import render

pytestmark = pytest.mark.slow

LONG_RUNNING = [
    "--pod-annotation",
    f"{COMPLETE_DELAY}=600s",
    "--pod-annotation",
    f"{COMPLETE_JITTER}=600s",
    "--workload",
    "job",  # the Indexed Job path: no dependency on the JobSet controller here
]
GPU_PRESENT = "nvidia.com/gpu.present"


@pytest.fixture
def nodes(core: Any, namespace: str) -> Iterator[Callable[..., list[str]]]:
    """Fake 8-GPU nodes of this test's pool, with extra labels / spec, Ready."""
    created: list[str] = []

    def make(count: int, *, labels: dict[str, str] | None = None, **spec: Any) -> list[str]:
        names = []
        for _ in range(count):
            name = f"{namespace}-gpu-{len(created)}"
            node = fake_gpu_node(name, pool=namespace)
            node["metadata"]["labels"].update(labels or {})
            node["spec"].update(spec)
            core.create_node(node)
            created.append(name)
            names.append(name)
        for name in names:
            wait_until(lambda n=name: _ready(core, n), timeout=60, what=f"node {name} Ready")
        return names

    yield make
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    for name in created:
        core.delete_node(name)


def _ready(core: Any, name: str) -> bool:
    node = core.read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _node(core: Any, name: str) -> dict[str, Any]:
    return dict(core.api_client.sanitize_for_serialization(core.read_node(name)))


def _cordoned_by_tensoryard(core: Any, name: str) -> dict[str, Any] | None:
    node = _node(core, name)
    ours = [t for t in node["spec"].get("taints", []) if t["key"] == TAINT_KEY]
    if node["spec"].get("unschedulable") and ours:
        return node
    return None


def _given_back(core: Any, name: str) -> dict[str, Any] | None:
    node = _node(core, name)
    annotations = node["metadata"].get("annotations") or {}
    if any(t["key"] == TAINT_KEY for t in node["spec"].get("taints", [])):
        return None
    if ANNOTATION_OWNER in annotations or ANNOTATION_REASON in annotations:
        return None
    return node


def _probe_pod(core: Any, namespace: str, node: str) -> str:
    """A plain pod (not tensoryard's) that may only run on `node`: kube-scheduler decides."""
    name = "probe"
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "containers": [{"name": "c", "image": "registry.invalid/probe:1"}],
                "tolerations": [GPU_TOLERATION],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [node],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                },
            },
        },
    )
    return name


def _unschedulable(core: Any, namespace: str, pod: str) -> str | None:
    p = core.read_namespaced_pod(pod, namespace)
    for c in p.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return None


def test_a_health_drain_cordons_the_node_and_an_explicit_uncordon_gives_it_back(
    api_client: Any, core: Any, namespace: str, identity: Path, nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    nodes(2)
    server, client = start_server(tmp_path / "home", identity, namespace, *LONG_RUNNING)
    servers.append(server)
    out = tyard(server, "submit", str(job_spec(tmp_path / "job.yaml", nodes=1)), "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    job_id = int(json.loads(out.stdout)["id"])
    job = wait_for(client, job_id, {"RUNNING"}, timeout=60)
    (sick,) = job["placement"]
    before = _node(core, sick)

    # The node agent (or Alertmanager) reports a fatal XID on that node.
    alert = {"labels": {"alertname": "GpuXidFatal", "health_action": "drain_node",
                        "Hostname": sick, "gpu": "2", "xid": "79"}}  # fmt: skip
    answer = client.report_health([alert])
    assert [n["name"] for n in answer["drained"]] == [sick]

    node = wait_until(lambda: _cordoned_by_tensoryard(core, sick), timeout=30, what="Node cordon")
    taint = next(t for t in node["spec"]["taints"] if t["key"] == TAINT_KEY)
    assert taint == {"key": TAINT_KEY, "value": "GpuXidFatal-gpu-2-xid-79", "effect": "NoSchedule"}
    assert GPU_TAINT in node["spec"]["taints"]  # the admin's taints are kept
    annotations = node["metadata"]["annotations"]
    assert annotations[ANNOTATION_REASON] == "GpuXidFatal(gpu=2, xid=79)"
    assert annotations[ANNOTATION_OWNER] == "tensoryard"

    # The job leaves the sick node and runs on the healthy one (attempt 2).
    def moved() -> dict[str, Any] | None:
        j = client.job(job_id)
        return j if j["attempts"] >= 2 and j["state"] == "RUNNING" else None

    job = wait_until(moved, timeout=90, what="the job running again elsewhere")
    assert sick not in job["placement"]

    # The real kube-scheduler places no new pod on the cordoned Node.
    probe = _probe_pod(core, namespace, sick)
    message = wait_until(
        lambda: _unschedulable(core, namespace, probe), timeout=30, what="probe Unschedulable"
    )
    assert "unschedulable" in message or TAINT_KEY in message, message

    # Uncordon is explicit, and gives back exactly what tensoryard took.
    client.uncordon(sick, "GPU 2 replaced")
    wait_until(lambda: _given_back(core, sick), timeout=30, what="Node uncordoned")
    # The node lifecycle controller drops its node.kubernetes.io/unschedulable taint shortly
    # after spec.unschedulable goes back to false.
    after = wait_until(
        lambda: (n := _node(core, sick))["spec"]["taints"] == before["spec"]["taints"] and n,
        timeout=30,
        what="the Node's taints as before",
    )
    assert not after["spec"].get("unschedulable")
    assert (after["metadata"].get("annotations") or {}) == (
        before["metadata"].get("annotations") or {}
    )
    placed = wait_until(
        lambda: core.read_namespaced_pod(probe, namespace).spec.node_name,
        timeout=60,
        what="the probe pod bound once the Node is back",
    )
    assert placed == sick
    kinds = [e["kind"] for e in client.node_history(sick)]
    assert kinds[:2] == ["uncordon", "drain"]


def test_a_node_an_admin_cordoned_by_hand_stays_cordoned_after_tensoryard_uncordons_it(
    api_client: Any, core: Any, namespace: str, identity: Path, nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    (name,) = nodes(1, unschedulable=True)  # `kubectl cordon` by an admin
    server, client = start_server(tmp_path / "home", identity, namespace)
    servers.append(server)
    wait_until(lambda: any(n["name"] == name for n in client.nodes()), timeout=30, what="node")

    out = tyard(server, "nodes", "cordon", name, "--reason", "maintenance window")
    assert out.returncode == 0, out.stderr + out.stdout
    node = wait_until(lambda: _cordoned_by_tensoryard(core, name), timeout=30, what="Node cordon")
    assert node["metadata"]["annotations"][ANNOTATION_OWNER] == "other"

    out = tyard(server, "nodes", "uncordon", name)
    assert out.returncode == 0, out.stderr + out.stdout
    node = wait_until(lambda: _given_back(core, name), timeout=30, what="tensoryard's marks gone")
    assert node["spec"]["unschedulable"] is True  # the admin's cordon stays
    # ... with the taint the node lifecycle controller keeps on every unschedulable Node
    assert [t["key"] for t in node["spec"]["taints"]] == [
        "nvidia.com/gpu",
        "node.kubernetes.io/unschedulable",
    ]


def test_a_cordon_whose_node_patch_was_lost_is_carried_out_when_the_control_plane_restarts(
    api_client: Any, core: Any, namespace: str, identity: Path, nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    (name,) = nodes(1)
    home = tmp_path / "home"
    server, client = start_server(home, identity, namespace)
    servers.append(server)
    wait_until(lambda: any(n["name"] == name for n in client.nodes()), timeout=30, what="node")
    server.kill()  # SIGKILL: nothing more is done by this process
    store = Store.open(ServerConfig(home=home).database_url)
    # The intent was committed, then the control plane died before patching the Node.
    store.set_node_state(name, "draining", reason="ib port mlx5_0/1 down", actor="agent")
    assert _node(core, name)["spec"].get("unschedulable") is None

    client = server.start()
    node = wait_until(lambda: _cordoned_by_tensoryard(core, name), timeout=30, what="repair")
    assert node["metadata"]["annotations"][ANNOTATION_REASON] == "ib port mlx5_0/1 down"

    # The other way round: an uncordon committed, the Node still cordoned.
    server.kill()
    store.set_node_state(name, "ready", reason="cable replaced", actor="admin")
    assert _cordoned_by_tensoryard(core, name) is not None
    server.start()
    node = wait_until(lambda: _given_back(core, name), timeout=30, what="repaired uncordon")
    assert not node["spec"].get("unschedulable")
    store.close()


@pytest.fixture
def nvidia_runtime_class(api_client: Any) -> Iterator[None]:
    """The RuntimeClass the GPU Operator installs (the agent's pods name it)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.NodeV1Api(api_client)
    created = False
    try:
        api.create_runtime_class({"metadata": {"name": "nvidia"}, "handler": "nvidia"})
        created = True
    except ApiException as exc:
        if exc.status != 409:
            raise
    yield
    if created:
        api.delete_runtime_class("nvidia")


def test_the_agent_daemonset_applies_and_runs_on_exactly_the_gpu_labelled_nodes(
    k8s_env: K8sEnv, api_client: Any, core: Any, namespace: str, nodes: Any,
    nvidia_runtime_class: None, tmp_path: Path,
) -> None:  # fmt: skip
    gpu = nodes(1, labels={GPU_PRESENT: "true"})
    cordoned = nodes(
        1,
        labels={GPU_PRESENT: "true"},
        unschedulable=True,
        taints=[GPU_TAINT, {"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}],
    )
    plain = nodes(1)  # no GPU Operator label: no agent
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "tensoryard-agent"}, "stringData": {"token": "t"}}
    )
    objects = render("agent", tmp_path)
    assert sorted(o["kind"] for o in objects) == ["DaemonSet", "ServiceAccount"]
    for o in objects:
        o["metadata"]["namespace"] = namespace
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(k8s_env.kubeconfig), "apply", "--server-side", "-f",
         str(manifest)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    selector = "app.kubernetes.io/name=tensoryard-agent"

    def running_everywhere() -> list[Any] | None:
        labelled = {
            n.metadata.name for n in core.list_node(label_selector=f"{GPU_PRESENT}=true").items
        }
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        running = {p.spec.node_name for p in pods if p.status.phase == "Running"}
        return pods if running == labelled and len(pods) == len(labelled) else None

    pods = wait_until(running_everywhere, timeout=90, what="an agent Running on each GPU node")
    where = {p.spec.node_name for p in pods}
    assert set(gpu + cordoned) <= where  # tensoryard's cordon taint is tolerated
    assert not set(plain) & where
    (container,) = pods[0].spec.containers
    assert container.ports[0].name == "metrics" and container.ports[0].container_port == 9410
    assert container.readiness_probe.http_get.port == "metrics"
    assert container.liveness_probe.http_get.port == "metrics"
    assert container.resources.limits["memory"] == "512Mi"
    assert container.security_context.read_only_root_filesystem is True
    assert not pods[0].spec.host_network and not pods[0].spec.host_pid
    assert "--node=$(NODE_NAME)" in container.args
    from kubernetes import client

    client.AppsV1Api(api_client).delete_namespaced_daemon_set("tensoryard-agent", namespace)


def test_without_the_patch_nodes_grant_the_server_refuses_to_start_unless_told_not_to_cordon(
    api_client: Any, core: Any, namespace: str, identity: Path, nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    from kubernetes import client

    (name,) = nodes(1)
    rbac = client.RbacAuthorizationV1Api(api_client)
    role = rbac.read_cluster_role(f"{SERVICE_ACCOUNT}-{namespace}")
    for rule in role.rules:
        if "nodes" in rule.resources:
            rule.verbs = [v for v in rule.verbs if v != "patch"]
    rbac.replace_cluster_role(role.metadata.name, role)

    refused = subprocess.run(
        [sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(tmp_path / "r"),
         "--port", str(free_port()), "--executor", "kubernetes", "--kubeconfig", str(identity),
         "--namespace", namespace, "--node-selector", f"tensoryard.io/test-pool={namespace}"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert refused.returncode == 1
    message = " ".join((refused.stdout + refused.stderr).split())
    assert "may not patch nodes (cluster-wide)" in message, message
    assert "fix: apply deploy/kubernetes/rbac.yaml" in message

    server, client_ = start_server(tmp_path / "home", identity, namespace, "--no-cordon-nodes")
    servers.append(server)
    wait_until(lambda: any(n["name"] == name for n in client_.nodes()), timeout=30, what="node")
    client_.cordon(name, "maintenance", drain=True)
    history = wait_until(lambda: client_.node_history(name), timeout=10, what="history")
    assert history[0]["kind"] == "drain"
    time.sleep(3)  # several control-loop cycles: none may write the Node
    node = _node(core, name)
    assert not node["spec"].get("unschedulable")
    assert TAINT_KEY not in {t["key"] for t in node["spec"]["taints"]}
