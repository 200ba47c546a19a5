"""The test environment itself: the real scheduler places GPU pods on kwok's fake GPU nodes, the
real Job controller runs Indexed Jobs to completion, and the real JobSet controller (with its
webhooks and CRD schema) runs a JobSet."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e_k8s.conftest import (
    GPU_PRODUCT,
    GPU_TOLERATION,
    POOL_LABEL,
    jobset_served,
    wait_until,
)

pytestmark = pytest.mark.slow


def gpu_pod_spec(pool: str, gpus: int = 8, restart_policy: str = "Never") -> dict[str, Any]:
    return {
        "restartPolicy": restart_policy,
        "nodeSelector": {POOL_LABEL: pool, "nvidia.com/gpu.product": GPU_PRODUCT},
        "tolerations": [GPU_TOLERATION],
        "containers": [
            {
                "name": "trainer",
                "image": "registry.invalid/tensoryard/trainer:test",
                "command": ["torchrun", "train.py"],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }


def test_the_scheduler_binds_whole_node_gpu_pods_to_fake_nodes_and_kwok_runs_them(
    core: Any, namespace: str, gpu_nodes: Any
) -> None:
    nodes = gpu_nodes(2)
    for i in range(3):
        core.create_namespaced_pod(
            namespace, {"metadata": {"name": f"p{i}"}, "spec": gpu_pod_spec(namespace)}
        )

    def placed() -> list[Any] | None:
        pods = [core.read_namespaced_pod(f"p{i}", namespace) for i in range(3)]
        running = [p for p in pods if p.status.phase == "Running"]
        return pods if len(running) == 2 else None

    pods = wait_until(placed, timeout=60, what="two of three 8-GPU pods Running")
    running = [p for p in pods if p.status.phase == "Running"]
    # One 8-GPU pod per 8-GPU node: the scheduler counted nvidia.com/gpu.
    assert sorted(p.spec.node_name for p in running) == sorted(nodes)
    assert all(p.status.pod_ip for p in running)
    (pending,) = [p for p in pods if p.status.phase != "Running"]
    assert pending.status.phase == "Pending" and pending.spec.node_name is None

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod(pending.metadata.name, namespace)
        cond = {c.type: c for c in pod.status.conditions or []}.get("PodScheduled")
        return cond if cond is not None and cond.reason == "Unschedulable" else None

    cond = wait_until(unschedulable, timeout=30, what="the third pod marked Unschedulable")
    assert "Insufficient nvidia.com/gpu" in cond.message


def test_an_indexed_job_with_a_headless_service_runs_to_completion(
    api_client: Any, core: Any, namespace: str, gpu_nodes: Any
) -> None:
    from kubernetes import client

    batch = client.BatchV1Api(api_client)
    nodes = gpu_nodes(2)
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "train"},
            "spec": {
                "clusterIP": "None",
                "selector": {"job-name": "train"},
                "ports": [{"name": "c10d", "port": 29500}],
            },
        },
    )
    pod_spec = {**gpu_pod_spec(namespace), "subdomain": "train"}
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "train"},
            "spec": {
                "completionMode": "Indexed",
                "completions": 2,
                "parallelism": 2,
                "backoffLimit": 0,
                "template": {"spec": pod_spec},
            },
        },
    )

    def complete() -> Any:
        job = batch.read_namespaced_job("train", namespace)
        done = any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])
        return job if done else None

    job = wait_until(complete, timeout=90, what="the Indexed Job to complete")
    assert job.status.succeeded == 2
    assert job.status.completed_indexes == "0,1"
    pods = core.list_namespaced_pod(namespace, label_selector="job-name=train").items
    assert sorted(
        p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods
    ) == [
        "0",
        "1",
    ]
    assert {p.status.phase for p in pods} == {"Succeeded"}
    # Both 8-GPU pods alive at once (kwok lets Job pods run 1-5 s): one per 8-GPU node.
    assert sorted(p.spec.node_name for p in pods) == sorted(nodes)
    assert sorted(p.spec.hostname for p in pods) == ["train-0", "train-1"]
    assert {p.spec.subdomain for p in pods} == {"train"}


def jobset(name: str, pool: str, pods: int) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "completionMode": "Indexed",
                            "completions": pods,
                            "parallelism": pods,
                            "backoffLimit": 0,
                            "template": {"spec": gpu_pod_spec(pool)},
                        }
                    },
                }
            ]
        },
    }


def test_a_jobset_is_validated_by_its_crd_schema_and_webhook_and_runs_to_completion(
    api_client: Any, core: Any, namespace: str, gpu_nodes: Any
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    if not jobset_served(api_client):
        pytest.skip("the JobSet controller is not installed in this environment")
    custom = client.CustomObjectsApi(api_client)
    group, version, plural = "jobset.x-k8s.io", "v1alpha2", "jobsets"
    nodes = gpu_nodes(2)

    bad = jobset("bad", namespace, pods=2)
    bad["spec"]["successPolicy"] = {"operator": "Most"}  # the schema's enum is All, Any
    with pytest.raises(ApiException) as rejected:
        custom.create_namespaced_custom_object(group, version, namespace, plural, bad)
    assert rejected.value.status == 422
    message = json.loads(rejected.value.body)["message"]
    assert 'spec.successPolicy.operator: Unsupported value: "Most"' in message
    # Valid for the schema, refused by JobSet's validating webhook (called over loopback TLS).
    bad["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["ghost"]}
    with pytest.raises(ApiException) as rejected:
        custom.create_namespaced_custom_object(group, version, namespace, plural, bad)
    message = json.loads(rejected.value.body)["message"]
    assert 'admission webhook "vjobset.kb.io" denied the request' in message
    assert "invalid replicatedJob name 'ghost'" in message

    custom.create_namespaced_custom_object(
        group, version, namespace, plural, jobset("train", namespace, pods=2)
    )

    def completed() -> Any:
        obj = custom.get_namespaced_custom_object(group, version, namespace, plural, "train")
        conditions = obj.get("status", {}).get("conditions", [])
        done = any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)
        return obj if done else None

    obj = wait_until(completed, timeout=120, what="the JobSet to complete")
    assert obj["status"]["replicatedJobsStatus"][0]["succeeded"] == 1
    pods = core.list_namespaced_pod(
        namespace, label_selector="jobset.sigs.k8s.io/jobset-name=train"
    ).items
    assert len(pods) == 2
    assert {p.status.phase for p in pods} == {"Succeeded"}
    # Both 8-GPU pods alive at once (kwok lets Job pods run 1-5 s): one per 8-GPU node.
    assert sorted(p.spec.node_name for p in pods) == sorted(nodes)
    # JobSet's defaults: a headless Service named after the JobSet, pod hostnames per index.
    assert core.read_namespaced_service("train", namespace).spec.cluster_ip == "None"
    assert sorted(p.spec.hostname for p in pods) == ["train-workers-0-0", "train-workers-0-1"]
