"""Node objects -> the nodes tensoryard's scheduler places on; jobs no node could hold are
refused at submission; the executor's bad-input checks that need no cluster."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tensoryard.cli.k8s import kubernetes_config
from tensoryard.cli.main import app
from tensoryard.errors import ExecutorError, SpecError
from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.kubernetes.client import connect
from tensoryard.executors.kubernetes.cluster import check_fits, node_capacities
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.kubernetes.executor import KubernetesHandle, workload_for
from tensoryard.executors.kubernetes.manifests import LABEL_JOB_ID
from tensoryard.spec.job import parse_job_spec

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def node(name: str, gpus: int = 8, *, ready: bool = True, **spec: Any) -> dict[str, Any]:
    alloc = {"cpu": "224", "memory": "2000Gi", "nvidia.com/gpu": str(gpus)}
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "tensoryard.io/switch": "leaf-1"}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [GPU_TAINT], **spec},
        "status": {
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod_on(
    node_name: str, gpus: int, *, ours: bool = False, phase: str = "Running"
) -> dict[str, Any]:
    labels = {LABEL_JOB_ID: "7"} if ours else {}
    return {
        "metadata": {"name": "p", "labels": labels},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


def capacities(nodes: list[dict[str, Any]], pods: list[dict[str, Any]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    out = node_capacities(
        nodes,
        list(pods),
        gpu_resource="nvidia.com/gpu",
        gpu_product_label="nvidia.com/gpu.product",
        switch_label="tensoryard.io/switch",
        block_label="tensoryard.io/block",
        tolerations=TOLERATIONS,
    )
    return {n.name: n for n in out}


def test_a_gpu_node_becomes_eight_gpus_of_its_model_under_its_switch() -> None:
    (n,) = capacities([node("a")]).values()
    assert (n.gpu_indices, n.gpu_model, n.switch, n.cordoned) == (
        tuple(range(8)),
        "NVIDIA-H100-80GB-HBM3",
        "leaf-1",
        False,
    )
    assert (n.cpu_slots, n.memory_bytes) == (224.0, 2000 * 2**30)


@pytest.mark.parametrize(
    ("overrides", "closed"),
    [
        ({}, False),
        ({"unschedulable": True}, True),
        ({"taints": [GPU_TAINT, {"key": "maintenance", "effect": "NoSchedule"}]}, True),
        ({"taints": [GPU_TAINT, {"key": "soft", "effect": "PreferNoSchedule"}]}, False),
    ],
    ids=[
        "the GPU taint the pods tolerate leaves a node open",
        "a cordoned node takes no new jobs",
        "a taint the pods do not tolerate closes a node",
        "a PreferNoSchedule taint does not",
    ],
)
def test_cordons_and_taints(overrides: dict[str, Any], closed: bool) -> None:
    assert capacities([node("a", **overrides)])["a"].cordoned is closed


def test_a_node_that_is_not_ready_takes_no_new_jobs() -> None:
    assert capacities([node("a", ready=False)])["a"].cordoned


def test_a_closed_node_says_why_in_the_clusters_words() -> None:
    lost = node("a")
    lost["status"]["conditions"] = [
        {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
            "lastTransitionTime": "2026-12-06T07:30:30Z",
        }
    ]
    seen = capacities(
        [
            lost,
            node("b", unschedulable=True),
            node("c", taints=[GPU_TAINT, {"key": "maint", "value": "fw", "effect": "NoSchedule"}]),
            node("d"),
        ]
    )
    assert seen["a"].condition == (
        "Unknown since 2026-12-06T07:30:30Z (NodeStatusUnknown: Kubelet stopped posting node "
        "status.)"
    )
    assert seen["b"].condition == "unschedulable (cordoned in Kubernetes)"
    assert seen["c"].condition == "tainted maint=fw:NoSchedule"
    assert seen["d"].condition == "" and not seen["d"].cordoned


def test_gpus_held_by_pods_tensoryard_did_not_create_are_unavailable() -> None:
    pods = [
        pod_on("a", 2),
        pod_on("a", 1),
        pod_on("a", 4, ours=True),  # the scheduler accounts for its own jobs
        pod_on("a", 8, phase="Succeeded"),  # holds nothing any more
        pod_on("b", 8),
    ]
    got = capacities([node("a"), node("b")], pods)
    assert got["a"].unavailable_gpus == (5, 6, 7)
    assert got["b"].unavailable_gpus == tuple(range(8))


def spec(**fields: Any) -> Any:
    return parse_job_spec({"name": "t", "command": ["python", "train.py"], **fields})


NODES = list(capacities([node("a"), node("b"), node("c", gpus=4)]).values())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"resources": {"gpus_per_node": 16}},
            "resources.gpus_per_node: 16 GPUs per node, but the largest node has 8 (fix: ask "
            "for at most 8 per node and more nodes)",
        ),
        (
            {"resources": {"nodes": 3, "gpus_per_node": 8}},
            "resources.nodes: 3 nodes with 8 GPUs each, but the cluster has 2 such node(s) "
            "(short by 1) (fix: ask for at most 2 nodes)",
        ),
        (
            {"resources": {"nodes": 4, "gpus_per_node": 0}, "launcher": "torchrun"},
            "resources.nodes: 4 nodes needed, but the cluster has 3 (short by 1) (fix: ask for "
            "at most 3 nodes, or add nodes to the cluster)",
        ),
        (
            {"scheduling": {"gpu_model": "B200"}},
            "scheduling.gpu_model: no node has GPUs of model 'B200' (fix: use one of: "
            "NVIDIA-H100-80GB-HBM3)",
        ),
    ],
    ids=[
        "more GPUs per node than any node has",
        "more such nodes than exist",
        "a CPU gang larger than the cluster",
        "unknown GPU model",
    ],
)
def test_jobs_no_node_set_could_hold_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        check_fits(spec(**fields), NODES)
    assert err.value.issues[0].render() == message


@pytest.mark.parametrize(
    "fields",
    [
        {"resources": {"nodes": 3, "gpus_per_node": 8}},
        {"resources": {"gpus_per_node": 16}},
        {"scheduling": {"gpu_model": "B200"}},
    ],
    ids=["more such nodes than exist", "more GPUs per node than any node has", "a new model"],
)
def test_with_an_autoscaler_a_job_the_cluster_as_it_is_cannot_hold_is_accepted(
    fields: dict[str, Any],
) -> None:
    check_fits(spec(**fields), NODES, autoscaler=True)  # it waits for nodes to be added


def test_a_job_that_only_has_to_wait_is_not_refused() -> None:
    busy = list(capacities([node("a"), node("b")], [pod_on("a", 8), pod_on("b", 8)]).values())
    check_fits(spec(resources={"nodes": 2, "gpus_per_node": 8}), busy)


def request(**fields: Any) -> LaunchRequest:
    fields.setdefault("resources", {"nodes": 2, "gpus_per_node": 8})
    return LaunchRequest(
        job_id="7",
        attempt=2,
        spec=spec(**fields),
        run_dir=Path("/runs/job-7"),
        env={"TYARD_JOB_ID": "7", "TYARD_JOB_TOKEN": "secret", "TYARD_RUN_DIR": "/runs/job-7"},
        placement={"b": [], "a": []},
        attempt_key="j7-a2-abc",
    )


def test_a_launch_request_becomes_a_workload_without_the_token_inline() -> None:
    w = workload_for(
        request(image="img:1", resources={"nodes": 2, "gpus_per_node": 8}), KubernetesConfig()
    )
    assert (w.name, w.token_secret, w.node_names, w.nodes) == (
        "ty-7-2",
        "ty-7-2-token",
        ["a", "b"],
        2,
    )
    assert "TYARD_JOB_TOKEN" not in w.env and "TYARD_JOB_ID" not in w.env
    assert w.env["TYARD_RUN_DIR"] == "/runs/job-7"


def test_a_job_without_an_image_is_refused_with_the_fix() -> None:
    with pytest.raises(ExecutorError, match=r"names no container image \(fix: set `image:`"):
        workload_for(request(), KubernetesConfig())
    w = workload_for(request(), KubernetesConfig(default_image="img:default"))
    assert w.image == "img:default"


def test_a_handle_survives_a_round_trip_and_a_foreign_one_is_refused() -> None:
    h = KubernetesHandle("7", 2, "j7-a2-abc", "ns", "ty-7-2", "JobSet", 2, "/runs/job-7/attempt-2")
    assert KubernetesHandle.from_dict(h.to_dict()) == h
    with pytest.raises(ExecutorError, match="belongs to executor 'local'"):
        KubernetesHandle.from_dict({"executor": "local"})


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a hung API server)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(sock.getsockname()[1])
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_an_api_server_that_does_not_answer_fails_within_the_timeout(
    tmp_path: Path, silent_server: int
) -> None:
    config = KubernetesConfig(kubeconfig=kubeconfig(tmp_path, silent_server), request_timeout_s=1)
    start = time.monotonic()
    with pytest.raises(ExecutorError, match="cannot reach the Kubernetes API server at http://127"):
        connect(config)
    assert time.monotonic() - start < 5


def test_a_closed_port_is_refused_at_once(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ExecutorError, match=r"timeout 10s.*fix: check the kubeconfig's server"):
        connect(KubernetesConfig(kubeconfig=kubeconfig(tmp_path, port)))


def test_a_missing_kubeconfig_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(ExecutorError, match=r"does not exist \(fix: --kubeconfig PATH"):
        connect(KubernetesConfig(kubeconfig=tmp_path / "nope"))


def test_render_prints_the_secret_and_jobset_the_executor_creates(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "pretrain",
                "image": "img:1",
                "command": ["python", "train.py"],
                "resources": {"nodes": 2, "gpus_per_node": 8},
            }
        )
    )
    result = CliRunner().invoke(
        app, ["k8s", "render", str(job), "-o", "json", "--node", "a", "--node", "b"]
    )
    assert result.exit_code == 0, result.output
    import json

    items = json.loads(result.output)["items"]
    assert [(o["kind"], o["metadata"]["name"]) for o in items] == [
        ("Secret", "ty-1-1-token"),
        ("JobSet", "ty-1-1"),
    ]
    pod = items[1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["a", "b"]
    yaml_out = CliRunner().invoke(app, ["k8s", "render", str(job), "--workload", "job"])
    assert yaml_out.exit_code == 0, yaml_out.output
    kinds = [d["kind"] for d in yaml.safe_load_all(yaml_out.output)]
    assert kinds == ["Secret", "Job", "Service"]


def test_the_autoscaler_setting_is_refused_off_kubernetes_and_read_on_it() -> None:
    result = CliRunner().invoke(app, ["server", "--autoscaler"])
    assert result.exit_code == 2
    assert "--autoscaler: only with --executor kubernetes" in result.output
    assert "drop --autoscaler" in result.output
    assert kubernetes_config(autoscaler=True).autoscaler
    assert not kubernetes_config().autoscaler
