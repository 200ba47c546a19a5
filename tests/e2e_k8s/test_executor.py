"""tensoryard runs jobs on Kubernetes: `tyard server --executor kubernetes` as the least-privilege
ServiceAccount of deploy/kubernetes/rbac.yaml, jobs submitted with `tyard submit`, placed by
tensoryard's scheduler on kwok's fake GPU nodes, bound there by the real kube-scheduler, run by
the real Job and JobSet controllers. No training runs in kwok pods (there are no containers);
training itself is covered by the local executor's end-to-end tests."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tensoryard.executors.kubernetes.manifests import LABEL_JOB_ID
from tests.e2e.conftest import ServerProcess, wait_for
from tests.e2e_k8s.conftest import K8sEnv, fake_gpu_node, jobset_served, wait_until
from tests.e2e_k8s.platform import (
    COMPLETE_DELAY,
    COMPLETE_JITTER,
    SERVICE_ACCOUNT,
    UNPULLABLE_IMAGE,
    apply_rbac,
    delete_cluster_rbac,
    job_spec,
    start_server,
    token_kubeconfig,
    tyard,
)

pytestmark = pytest.mark.slow

SWITCH = "tensoryard.io/switch"
LONG_RUNNING = [
    "--pod-annotation",
    f"{COMPLETE_DELAY}=600s",
    "--pod-annotation",
    f"{COMPLETE_JITTER}=600s",
]


@pytest.fixture
def identity(k8s_env: K8sEnv, api_client: Any, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """The kubeconfig of the control plane's ServiceAccount (deploy/kubernetes/rbac.yaml)."""
    if not jobset_served(api_client):
        pytest.skip("the JobSet controller is not installed in this environment")
    apply_rbac(api_client, namespace)
    yield token_kubeconfig(
        k8s_env.kubeconfig, api_client, namespace, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig"
    )
    delete_cluster_rbac(api_client, namespace)


@pytest.fixture
def switch_nodes(core: Any, namespace: str) -> Iterator[Callable[[list[str]], list[str]]]:
    """Fake 8-GPU nodes of this test's pool, one per switch name given, Ready."""
    created: list[str] = []

    def make(switches: list[str]) -> list[str]:
        names = []
        for i, switch in enumerate(switches):
            node = fake_gpu_node(f"{namespace}-gpu-{i}", pool=namespace)
            node["metadata"]["labels"][SWITCH] = switch
            core.create_node(node)
            created.append(node["metadata"]["name"])
            names.append(node["metadata"]["name"])
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


def _start(
    servers: list[ServerProcess], tmp_path: Path, identity: Path, namespace: str, *extra: str
) -> tuple[ServerProcess, Any]:
    server, client = start_server(tmp_path / "home", identity, namespace, *extra)
    servers.append(server)
    return server, client


def _submit(server: ServerProcess, spec: Path) -> int:
    out = tyard(server, "submit", str(spec), "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    return int(json.loads(out.stdout)["id"])


def _objects(api_client: Any, namespace: str, job_id: int) -> dict[str, list[str]]:
    from kubernetes import client

    selector = f"{LABEL_JOB_ID}={job_id}"
    core = client.CoreV1Api(api_client)
    jobsets = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", label_selector=selector
    )
    return {
        "jobsets": [o["metadata"]["name"] for o in jobsets["items"]],
        "jobs": [
            o.metadata.name
            for o in client.BatchV1Api(api_client)
            .list_namespaced_job(namespace, label_selector=selector)
            .items
        ],
        "pods": [
            p.metadata.name
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
        ],
        "secrets": [
            s.metadata.name
            for s in core.list_namespaced_secret(namespace, label_selector=selector).items
        ],
    }


def _pods(core: Any, namespace: str, job_id: int, attempt: int) -> list[Any]:
    selector = f"{LABEL_JOB_ID}={job_id},tensoryard.io/attempt={attempt}"
    return list(core.list_namespaced_pod(namespace, label_selector=selector).items)


def _running_pods(core: Any, namespace: str, job_id: int, attempt: int, count: int) -> list[Any]:
    def probe() -> list[Any] | None:
        pods = _pods(core, namespace, job_id, attempt)
        running = [p for p in pods if p.status.phase == "Running"]
        return running if len(running) == count else None

    return wait_until(probe, timeout=60, what=f"{count} running pods of job {job_id}")


def test_a_two_node_job_is_placed_under_one_switch_bound_there_and_succeeds(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    lone, *pair = switch_nodes(["leaf-a", "leaf-b", "leaf-b"])
    server, client = _start(servers, tmp_path, identity, namespace)
    job_id = _submit(server, job_spec(tmp_path / "job.yaml", nodes=2, gpus=8))

    job = wait_for(client, job_id, {"SUCCEEDED", "FAILED"}, timeout=90)
    assert job["state"] == "SUCCEEDED", job
    events = [e["message"] for e in client.events(job_id)]
    admitted = next(m for m in events if "admitted on" in m)
    assert admitted.endswith(f"admitted on {pair[0]}, {pair[1]}"), admitted  # one switch

    pods = sorted(_pods(core, namespace, job_id, 1), key=lambda p: p.metadata.name)
    assert len(pods) == 2
    # kube-scheduler bound each pod where tensoryard placed it, one per node, never the lone one.
    assert sorted(p.spec.node_name for p in pods) == sorted(pair)
    assert lone not in {p.spec.node_name for p in pods}
    assert {p.status.phase for p in pods} == {"Succeeded"}
    for pod in pods:
        (container,) = pod.spec.containers
        assert container.resources.limits["nvidia.com/gpu"] == "8"
        env = {e.name: e for e in container.env}
        assert env["NNODES"].value == "2" and env["NPROC_PER_NODE"].value == "8"
        assert env["TYARD_JOB_ID"].value == str(job_id)
        assert env["TYARD_JOB_TOKEN"].value is None  # from the Secret, never inline
        assert env["TYARD_JOB_TOKEN"].value_from.secret_key_ref.key == "token"
        assert env["WANDB_MODE"].value == "offline"
        name = f"ty-{job_id}-1"
        assert env["MASTER_ADDR"].value == f"{name}-node-0-0.{name}"
        assert f"{pod.spec.hostname}.{pod.spec.subdomain}" in {
            f"{name}-node-0-0.{name}",
            f"{name}-node-0-1.{name}",
        }
        terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        (expr,) = terms.node_selector_terms[0].match_expressions
        assert sorted(expr.values) == sorted(pair)
    # The token Secret goes with the JobSet (owner reference).
    (secret,) = core.list_namespaced_secret(
        namespace, label_selector=f"{LABEL_JOB_ID}={job_id}"
    ).items
    assert [(o.kind, o.name) for o in secret.metadata.owner_references] == [("JobSet", name)]
    # The pods are gone from view only when deleted; their log tail was kept at the end.
    logs = tyard(server, "logs", str(job_id))
    assert logs.returncode == 0, logs.stderr
    assert "the log of pod" in logs.stdout  # kwok serves no container logs: the reason is kept


def test_a_job_asking_for_more_gpus_than_any_node_has_is_refused_before_anything_exists(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a", "leaf-a"])
    server, client = _start(servers, tmp_path, identity, namespace)
    too_wide = tyard(server, "submit", str(job_spec(tmp_path / "a.yaml", nodes=1, gpus=16)))
    assert too_wide.returncode != 0
    assert "resources.gpus_per_node: 16 GPUs per node, but the largest node has 8" in (
        too_wide.stdout + too_wide.stderr
    )
    too_many = tyard(server, "submit", str(job_spec(tmp_path / "b.yaml", nodes=3, gpus=8)))
    assert too_many.returncode != 0
    assert "resources.nodes: 3 nodes with 8 GPUs each, but the cluster has 2" in (
        too_many.stdout + too_many.stderr
    )
    no_image = job_spec(tmp_path / "c.yaml")
    no_image.write_text(no_image.read_text().replace("image: registry.invalid", "#"))
    refused = tyard(server, "submit", str(no_image))
    assert refused.returncode != 0
    assert "image: jobs on Kubernetes need an image (fix: set `image:`" in (
        refused.stdout + refused.stderr
    )
    assert client.jobs()["items"] == []
    assert core.list_namespaced_secret(namespace, label_selector=LABEL_JOB_ID).items == []
    assert core.list_namespaced_pod(namespace).items == []


def test_with_the_autoscaler_a_gang_wider_than_the_pool_waits_for_a_node_and_then_runs(
    core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a"])
    server, client = _start(servers, tmp_path, identity, namespace, "--autoscaler", *LONG_RUNNING)
    job_id = _submit(server, job_spec(tmp_path / "job.yaml", nodes=2, gpus=8))
    reason = wait_until(
        lambda: client.job(job_id)["pending_reason"], timeout=30, what="a why-pending"
    )
    assert reason.startswith(
        "cannot fit the cluster as it is: needs 2 nodes of 8 NVIDIA-H100-80GB-HBM3 GPUs; the "
        "cluster has 1 node(s) with 8 or more NVIDIA-H100-80GB-HBM3 GPUs (short by 1)"
    ), reason
    assert core.list_namespaced_pod(namespace).items == []  # it holds nothing meanwhile
    added = fake_gpu_node(f"{namespace}-added", pool=namespace)  # what an autoscaler does
    added["metadata"]["labels"][SWITCH] = "leaf-a"
    core.create_node(added)
    try:
        job = wait_for(client, job_id, {"RUNNING"}, timeout=60)
        assert f"{namespace}-added" in job["placement"] and len(job["placement"]) == 2
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_node(f"{namespace}-added")


def test_cancel_deletes_every_object_of_the_attempt(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a", "leaf-a"])
    server, client = _start(servers, tmp_path, identity, namespace, *LONG_RUNNING)
    job_id = _submit(server, job_spec(tmp_path / "job.yaml"))
    wait_for(client, job_id, {"RUNNING"}, timeout=60)
    assert all(_objects(api_client, namespace, job_id)[k] for k in ("jobsets", "pods", "secrets"))

    out = tyard(server, "cancel", str(job_id))
    assert out.returncode == 0, out.stderr
    job = wait_for(client, job_id, {"CANCELLED"}, timeout=60)
    assert job["reason"] == "cancelled by the user"
    # CANCELLED is only reported once the JobSet is gone (foreground: its pods first).
    assert _objects(api_client, namespace, job_id) == {
        "jobsets": [],
        "jobs": [],
        "pods": [],
        "secrets": [],
    }


def test_a_failed_pod_makes_attempt_two_resume_from_the_last_checkpoint(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a", "leaf-a"])
    server, client = _start(servers, tmp_path, identity, namespace, *LONG_RUNNING)
    # Its checkpoints go to the pods' shared volume (a job reports paths inside its own run or
    # checkpoint directory only: docs/access.md, "Trust model").
    job_id = _submit(server, job_spec(tmp_path / "job.yaml", checkpoint_dir="/mnt/shared/ckpt"))
    wait_for(client, job_id, {"RUNNING"}, timeout=60)
    pods = _running_pods(core, namespace, job_id, 1, 2)

    # What the in-job runtime does: report a checkpoint with the token from the pod's Secret.
    secret = core.read_namespaced_secret(f"ty-{job_id}-1-token", namespace)
    token = base64.b64decode(secret.data["token"]).decode()
    report = {
        "attempt": 1,
        "checkpoints": [{"step": 40, "path": "/mnt/shared/ckpt/step-40", "ts": time.time()}],
    }
    answer = httpx.post(
        f"{server.url}/api/v1/jobs/{job_id}/report",
        json=report,
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.text

    # Rank 1's process exits with code 1 (what a kubelet reports; kwok runs no container).
    rank1 = next(
        p for p in pods if p.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "1"
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_namespaced_pod_status(
        rank1.metadata.name,
        namespace,
        {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "image": rank1.spec.containers[0].image,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    }
                ],
            }
        },
    )

    def second_attempt() -> list[dict[str, Any]] | None:
        attempts = client.attempts(job_id)
        return attempts if len(attempts) == 2 and attempts[1]["state"] == "running" else None

    attempts = wait_until(second_attempt, timeout=90, what="attempt 2 running")
    first, second = attempts
    assert first["state"] == "failed"
    assert first["reason"] == (
        f"rank 1 (pod {rank1.metadata.name} on node {rank1.spec.node_name}) exited with code 1 "
        "(Error)"
    )
    assert second["resumed_from_step"] == 40
    assert _objects(api_client, namespace, job_id)["jobsets"] == [
        f"ty-{job_id}-1",
        f"ty-{job_id}-2",
    ]
    assert len(_running_pods(core, namespace, job_id, 2, 2)) == 2
    # Attempt 1's surviving rank was stopped (it held GPUs); the failed pod stays for kubectl.
    wait_until(
        lambda: (
            [p.metadata.name for p in _pods(core, namespace, job_id, 1)] == [rank1.metadata.name]
        ),
        timeout=30,
        what="attempt 1's other pod deleted",
    )


def test_an_image_that_cannot_be_pulled_is_a_reason_naming_the_image(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a", "leaf-a"])
    server, client = _start(servers, tmp_path, identity, namespace)
    job_id = _submit(server, job_spec(tmp_path / "job.yaml", image=UNPULLABLE_IMAGE))

    def pull_warning() -> str | None:
        for event in client.events(job_id):
            if "cannot be pulled" in event["message"]:
                return str(event["message"])
        return None

    message = wait_until(pull_warning, timeout=60, what="the image pull reason")
    assert message.startswith(f"attempt 1 not running yet: image {UNPULLABLE_IMAGE} cannot be")
    assert "ErrImagePull" in message
    assert client.job(job_id)["state"] == "STARTING"
    described = tyard(server, "describe", str(job_id))
    assert "cannot be pulled" in described.stdout


def test_a_control_plane_restart_mid_run_reattaches_to_the_running_jobset(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a", "leaf-a"])
    delay = [
        "--pod-annotation",
        f"{COMPLETE_DELAY}=12s",
        "--pod-annotation",
        f"{COMPLETE_JITTER}=12s",
    ]
    server, client = _start(servers, tmp_path, identity, namespace, *delay)
    job_id = _submit(server, job_spec(tmp_path / "job.yaml"))
    wait_for(client, job_id, {"RUNNING"}, timeout=60)
    pods_before = {p.metadata.uid for p in _pods(core, namespace, job_id, 1)}

    server.kill()  # SIGKILL: no shutdown code runs
    client = server.start()
    job = wait_for(client, job_id, {"SUCCEEDED", "FAILED"}, timeout=90)
    assert job["state"] == "SUCCEEDED", job
    assert [a["number"] for a in client.attempts(job_id)] == [1]
    messages = [e["message"] for e in client.events(job_id)]
    assert any("re-attaching" in m for m in messages), messages
    # The same pods ran to the end: nothing was relaunched.
    assert {p.metadata.uid for p in _pods(core, namespace, job_id, 1)} == pods_before


def _server_fails(tmp_path: Path, kubeconfig: Path, namespace: str) -> str:
    """Start `tyard server --executor kubernetes`; it must exit with an error: its output."""
    import subprocess
    import sys

    from tests.e2e.conftest import free_port

    home = tmp_path / "refused"
    args = ["server", "--home", str(home), "--port", str(free_port()), "--executor", "kubernetes"]
    args += ["--kubeconfig", str(kubeconfig), "--namespace", namespace]
    out = subprocess.run(
        [sys.executable, "-m", "tensoryard.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert out.returncode == 1, out.stdout + out.stderr
    return (out.stdout + out.stderr).replace("\n", " ")


def test_a_control_plane_without_rbac_or_namespace_refuses_to_start_naming_what_is_missing(
    k8s_env: K8sEnv, api_client: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "bare"}})
    bare = token_kubeconfig(k8s_env.kubeconfig, api_client, namespace, "bare", tmp_path / "k")
    message = _server_fails(tmp_path, bare, namespace)
    assert "the control plane's Kubernetes identity may not get nodes (cluster-wide)" in message
    assert f"create jobsets.jobset.x-k8s.io in namespace {namespace}" in message
    assert "fix: apply deploy/kubernetes/rbac.yaml" in message

    message = _server_fails(tmp_path, k8s_env.kubeconfig, "no-such-namespace")
    assert "namespace 'no-such-namespace' does not exist" in message
    assert core.list_namespaced_secret(namespace).items == []


def test_a_launch_the_cluster_refuses_leaves_no_secret_behind_and_names_the_cause(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a", "leaf-a"])
    core.create_namespaced_resource_quota(
        namespace,
        {
            "metadata": {"name": "no-jobsets"},
            "spec": {"hard": {"count/jobsets.jobset.x-k8s.io": "0"}},
        },
    )
    server, client = _start(servers, tmp_path, identity, namespace)
    job_id = _submit(server, job_spec(tmp_path / "job.yaml"))
    job = wait_for(client, job_id, {"FAILED"}, timeout=60)
    assert "Kubernetes refused to create jobsets.jobset.x-k8s.io in namespace" in job["reason"]
    assert "exceeded quota: no-jobsets" in job["reason"]  # the API server's own words
    assert "fix: raise the namespace's ResourceQuota" in job["reason"]
    assert len(client.attempts(job_id)) == 3  # max_restarts=2, every launch refused
    assert _objects(api_client, namespace, job_id) == {
        "jobsets": [],
        "jobs": [],
        "pods": [],
        "secrets": [],
    }


def _scrape(server: ServerProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    token = (server.home / "admin.token").read_text().strip()
    resp = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"})
    resp.raise_for_status()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def test_the_control_plane_exports_its_pods_mapped_to_jobs_and_why_pods_wait(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a", "leaf-a", "leaf-b"])
    server, client = _start(servers, tmp_path, identity, namespace, *LONG_RUNNING)
    running = _submit(server, job_spec(tmp_path / "job.yaml", nodes=2, gpus=8))
    stuck = _submit(server, job_spec(tmp_path / "bad.yaml", nodes=1, image=UNPULLABLE_IMAGE))
    pods = {p.metadata.name: p for p in _running_pods(core, namespace, running, 1, 2)}

    def converged() -> dict[str, list[tuple[dict[str, str], float]]] | None:
        out = _scrape(server)
        info = [lbl for lbl, _ in out.get("tyard_k8s_pod_info", []) if lbl["job"] == str(running)]
        waiting = dict((lbl["reason"], v) for lbl, v in out.get("tyard_k8s_pods_waiting", []))
        if len(info) == 2 and waiting.get("ErrImagePull") == 1:
            return out
        return None

    out = wait_until(converged, timeout=60, what="pod metrics of both jobs")
    assert out["tyard_k8s_pods_observed"] == [({}, 1.0)]
    info = {lbl["pod"]: lbl for lbl, _ in out["tyard_k8s_pod_info"]}
    for name, pod in pods.items():
        # the pod -> job map that joins the DCGM exporter's series (rules/k8s.yml) to the job
        assert info[name]["job"] == str(running)
        assert info[name]["team"] == "default"
        assert info[name]["namespace"] == namespace
        assert info[name]["node"] == pod.spec.node_name
        assert pod.metadata.labels["tensoryard.io/team"] == "default"
    assert sorted(info[n]["rank"] for n in pods) == ["0", "1"]
    (bad,) = [lbl for lbl in info.values() if lbl["job"] == str(stuck)]
    phases = {(lbl["pod"], lbl["phase"]) for lbl, _ in out["tyard_k8s_pod_phase"]}
    assert (bad["pod"], "Pending") in phases
    assert {(n, "Running") for n in pods} <= phases
    assert client.job(stuck)["state"] == "STARTING"


def test_a_finished_attempt_is_deleted_after_keep_finished_and_its_outcome_stays(
    api_client: Any, core: Any, namespace: str, identity: Path, switch_nodes: Any,
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    switch_nodes(["leaf-a", "leaf-a"])
    server, client = _start(servers, tmp_path, identity, namespace, "--keep-finished", "3")
    job_id = _submit(server, job_spec(tmp_path / "job.yaml", nodes=2, gpus=8))
    job = wait_for(client, job_id, {"SUCCEEDED", "FAILED"}, timeout=90)
    assert job["state"] == "SUCCEEDED", job

    # The JobSet controller deletes the finished JobSet; the garbage collector its Jobs,
    # pods, Service and the token Secret it owns.
    def gone() -> bool:
        return _objects(api_client, namespace, job_id) == {
            "jobsets": [],
            "jobs": [],
            "pods": [],
            "secrets": [],
        }

    wait_until(gone, timeout=90, what=f"job {job_id}'s objects deleted after 3 s")
    # The outcome and the log tails were kept in the run dir first: a restarted control plane
    # still answers from them.
    server.stop()
    client = server.start()
    assert client.job(job_id)["state"] == "SUCCEEDED"
    logs = tyard(server, "logs", str(job_id))
    assert logs.returncode == 0 and "the log of pod" in logs.stdout, logs.stderr
