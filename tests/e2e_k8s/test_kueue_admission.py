"""Kueue as the admission engine (`tyard server --admission kueue`), end to end on a control plane
running the real Kueue 0.17 controller (built by scripts/k8s-testenv, its webhooks on loopback),
with the ClusterQueues, Cohort, ResourceFlavor and LocalQueues that `tyard cluster plan` wrote
for a two-node inventory, and tensoryard running as its least-privilege ServiceAccount.

Team A and team B have 8 GPUs each in one cohort. B's 16-GPU job is admitted by borrowing A's
idle 8; A's job then reclaims them: Kueue evicts B's workload, tensoryard ends B's attempt as
preempted and requeues it, its next attempt waits in Kueue's queue with Kueue's reason, and runs
again once A's job is cancelled. Each step shows in `tyard describe`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tensoryard.cluster import build_plan, parse_inventory, write_plan
from tensoryard.cluster.labels import LABEL_SWITCH
from tests.e2e.conftest import ServerProcess, free_port, wait_for
from tests.e2e_k8s.conftest import K8sEnv, _node_ready, fake_gpu_node, wait_until
from tests.e2e_k8s.platform import (
    COMPLETE_DELAY,
    COMPLETE_JITTER,
    IMAGE,
    SERVICE_ACCOUNT,
    apply_rbac,
    delete_cluster_rbac,
    kubectl,
    start_server,
    token_kubeconfig,
    tyard,
)

pytestmark = pytest.mark.slow

LONG_RUNNING = [
    "--pod-annotation",
    f"{COMPLETE_DELAY}=600s",
    "--pod-annotation",
    f"{COMPLETE_JITTER}=600s",
]


@pytest.fixture(scope="module")
def api_client(k8s_kueue_env: K8sEnv) -> Iterator[Any]:
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(k8s_kueue_env.kubeconfig))
    yield client
    client.close()


def _inventory(namespace: str) -> dict[str, Any]:
    node = {
        "gpu": {"model": "H100", "count": 8, "interconnect": "nvswitch"},
        "rack": "r01",
        "leaf": "leaf-01",
        "spine": "block-a",
        "cpu": 224,
        "memory": "2Ti",
        "nvme": "30Ti",
    }
    return {
        "cluster": {
            "name": "kueue-e2e",
            "namespace": namespace,
            "software": {
                "driver": "570.133.20",
                "cuda": "12.8",
                "pytorch": "2.7",
                "nccl": "2.26.2",
            },
        },
        "nodes": [{**node, "name": f"{namespace}-n{i}"} for i in range(2)],
        "quotas": {
            "queues": [
                {"name": "team-a", "cohort": "research", "nominal": {"H100": 8}},
                {"name": "team-b", "cohort": "research", "nominal": {"H100": 8}},
            ],
            "cohorts": [{"name": "research"}],
        },
    }


@pytest.fixture
def planned_cluster(
    k8s_kueue_env: K8sEnv, core: Any, namespace: str, tmp_path: Path
) -> Iterator[list[str]]:
    """Two kwok nodes registered as a kubelet would, then labelled, tainted and given Kueue
    objects by the output of `tyard cluster plan` (applied server-side, as the README says)."""
    plan = write_plan(build_plan(parse_inventory(_inventory(namespace))), tmp_path / "plan")
    names = [d["metadata"]["name"] for d in yaml.safe_load_all((plan / "nodes.yaml").read_text())]
    for name in names:
        node = fake_gpu_node(name, pool=namespace)
        node["spec"] = {}  # registered as a kubelet would: the plan adds the GPU taint
        core.create_node(node)
    for name in names:  # Ready first: no not-ready taint of the node controller in the way
        wait_until(lambda n=name: _node_ready(core, n), timeout=60, what=f"node {name} Ready")
    kubectl(
        k8s_kueue_env, "apply", "--server-side", "--field-manager=tyard-cluster-plan", "-f",
        str(plan / "nodes.yaml"),
    )  # fmt: skip
    kubectl(
        k8s_kueue_env, "apply", "--server-side", "--field-manager=tyard-cluster-plan", "-f",
        str(plan / "kueue" / "kueue.yaml"),
    )  # fmt: skip
    yield names
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    for name in names:
        core.delete_node(name)
    kubectl(
        k8s_kueue_env, "delete", "--ignore-not-found", "--wait=false", "-f",
        str(plan / "kueue" / "kueue.yaml"),
    )  # fmt: skip


@pytest.fixture
def identity(
    k8s_kueue_env: K8sEnv, api_client: Any, namespace: str, tmp_path: Path
) -> Iterator[Path]:
    apply_rbac(api_client, namespace)
    yield token_kubeconfig(
        k8s_kueue_env.kubeconfig, api_client, namespace, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig"
    )
    delete_cluster_rbac(api_client, namespace)


def _spec(path: Path, team: str, nodes: int) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": f"{team}-run",
                "team": team,
                "image": IMAGE,
                "command": ["python", "-m", "train"],
                "resources": {"nodes": nodes, "gpus_per_node": 8},
                "restart": {"max_restarts": 0, "backoff": "0s"},
            }
        )
    )
    return path


def _submit(server: ServerProcess, spec: Path) -> int:
    out = tyard(server, "submit", str(spec), "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    return int(json.loads(out.stdout)["id"])


def _describe(server: ServerProcess, job_id: int) -> str:
    out = tyard(server, "describe", str(job_id))
    assert out.returncode == 0, out.stderr
    return out.stdout


def _event(client: Any, job_id: int, text: str, timeout: float = 60) -> str:
    def probe() -> str | None:
        return next((e["message"] for e in client.events(job_id) if text in e["message"]), None)

    return wait_until(probe, timeout=timeout, what=f"job {job_id} event containing {text!r}")


def test_kueue_admits_within_quota_lends_idle_gpus_and_reclaims_them_each_step_in_describe(
    api_client: Any, core: Any, namespace: str, identity: Path, planned_cluster: list[str],
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    server, client = start_server(
        tmp_path / "home",
        identity,
        namespace,
        "--admission",
        "kueue",
        "--switch-label",
        LABEL_SWITCH,  # the plan's leaf-switch label, a level of its Kueue Topology
        *LONG_RUNNING,
    )
    servers.append(server)
    for team in ("team-a", "team-b"):
        assert tyard(server, "teams", "create", team).returncode == 0

    # B asks for both nodes: 8 GPUs of its own plus A's idle 8, borrowed through the cohort.
    b = _submit(server, _spec(tmp_path / "b.yaml", "team-b", nodes=2))
    wait_for(client, b, {"RUNNING"}, timeout=90)
    running = client.job(b)["reason"]
    assert "admitted by Kueue: ClusterQueue team-b, flavor gpu-h100" in running, running
    assert "borrows 8 nvidia.com/gpu" in running, running
    pods = core.list_namespaced_pod(namespace, label_selector=f"tensoryard.io/job-id={b}").items
    # Kueue put the ResourceFlavor's node label on the pods; kube-scheduler bound them there.
    assert {p.spec.node_selector.get("tensoryard.io/gpu-model") for p in pods} == {"H100"}
    assert sorted(p.spec.node_name for p in pods) == sorted(planned_cluster)
    # the job's priority (0) maps to the plan's lowest WorkloadPriorityClass, and its
    # `topology: preferred` to a Topology-Aware Scheduling request at the leaf-switch level
    from kubernetes import client as k8s

    workloads = k8s.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", namespace, "workloads"
    )["items"]
    (wl,) = [w for w in workloads if w["metadata"]["name"].startswith(f"jobset-ty-{b}-1")]
    ref = wl["spec"].get("priorityClassRef") or {}  # v1beta2 (v1beta1: priorityClassName)
    assert (ref.get("name"), wl["spec"].get("priority")) == ("low", 100), wl["spec"]
    requests = [ps.get("topologyRequest") or {} for ps in wl["spec"]["podSets"]]
    assert requests and all(r.get("preferred") == LABEL_SWITCH for r in requests), requests

    # A wants its nominal 8 back: Kueue evicts B's workload, tensoryard requeues B.
    a = _submit(server, _spec(tmp_path / "a.yaml", "team-a", nodes=1))
    wait_for(client, a, {"RUNNING"}, timeout=120)
    assert "admitted by Kueue: ClusterQueue team-a" in client.job(a)["reason"]
    first = wait_until(
        lambda: next(
            (x for x in client.attempts(b) if x["number"] == 1 and x["state"] == "cancelled"),
            None,
        ),
        timeout=60,
        what="B's attempt 1 ended by the eviction",
    )
    assert first["reason"].startswith("preempted by Kueue ("), first
    waiting = _event(client, b, "insufficient unused quota for nvidia.com/gpu in flavor gpu-h100")
    assert waiting.startswith(
        "attempt 2 not running yet: waiting for Kueue admission in LocalQueue team-b: "
    ), waiting
    job_b = client.job(b)
    assert job_b["state"] == "STARTING" and job_b["restarts"] == 0  # not a failure: no budget
    described = _describe(server, b)
    for step in ("handed to Kueue", "admitted by Kueue", "preempted by Kueue", "waiting for Kueue"):
        assert step in described, f"{step!r} missing from tyard describe:\n{described}"
    # B's first JobSet is gone (Kueue would otherwise run it again); the second waits suspended.
    jobsets = k8s.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "jobset.x-k8s.io",
        "v1alpha2",
        namespace,
        "jobsets",
        label_selector=f"tensoryard.io/job-id={b}",
    )["items"]
    assert [(j["metadata"]["name"], j["spec"]["suspend"]) for j in jobsets] == [(f"ty-{b}-2", True)]

    # A is cancelled: Kueue admits B's waiting attempt, which runs on both nodes again.
    assert tyard(server, "cancel", str(a)).returncode == 0
    wait_for(client, a, {"CANCELLED"}, timeout=60)
    wait_for(client, b, {"RUNNING"}, timeout=120)
    assert [x["number"] for x in client.attempts(b)] == [1, 2]


def test_a_team_without_a_local_queue_is_refused_at_submit_naming_the_team(
    namespace: str, identity: Path, planned_cluster: list[str], servers: list[ServerProcess],
    tmp_path: Path,
) -> None:  # fmt: skip
    server, _ = start_server(tmp_path / "home", identity, namespace, "--admission", "kueue")
    servers.append(server)
    assert tyard(server, "teams", "create", "vision").returncode == 0
    out = tyard(server, "submit", str(_spec(tmp_path / "v.yaml", "vision", nodes=1)))
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "team: no Kueue LocalQueue 'vision'" in text, text
    assert "team-a, team-b" in text and "Traceback" not in text, text


def test_a_namespace_without_local_queues_refuses_to_start_in_kueue_mode(
    namespace: str, identity: Path, gpu_nodes: Any, tmp_path: Path
) -> None:
    gpu_nodes(1)
    done = subprocess.run(
        [
            sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(tmp_path / "h"),
            "--port", str(free_port()), "--executor", "kubernetes", "--kubeconfig", str(identity),
            "--namespace", namespace, "--node-selector", f"tensoryard.io/test-pool={namespace}",
            "--admission", "kueue",
        ],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert f"namespace {namespace} has no Kueue LocalQueue" in text, text
    assert "Traceback" not in text, text
