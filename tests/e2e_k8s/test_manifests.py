"""The objects `executors.kubernetes.manifests` renders, created in the real API server: admitted
(JobSet CRD schema and webhooks, core validation), placed by the real scheduler on the nodes
tensoryard chose, run to completion, and cleaned up by the garbage collector."""

from __future__ import annotations

from typing import Any

import pytest

from tensoryard.executors.kubernetes.manifests import (
    LABEL_ATTEMPT_KEY,
    AttemptWorkload,
    render_headless_service,
    render_indexed_job,
    render_jobset,
)
from tests.e2e_k8s.conftest import jobset_served, wait_until

pytestmark = pytest.mark.slow


def attempt(namespace: str, nodes: list[str], key: str) -> AttemptWorkload:
    return AttemptWorkload(
        job_id="7",
        attempt=1,
        attempt_key=key,
        image="registry.invalid/tensoryard/trainer:test",
        command=["python", "-m", "tensoryard.examples.tiny"],
        env={"TYARD_CHECKPOINT_DIR": "/mnt/shared/ckpt"},
        token_secret="job-7-token",
        namespace=namespace,
        nodes=len(nodes),
        gpus_per_node=8,
        node_names=nodes,
        pvc_name=None,
    )


def create_token_secret(core: Any, namespace: str) -> None:
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "job-7-token"}, "stringData": {"token": "t0k3n"}}
    )


def pods_of(core: Any, namespace: str, key: str) -> list[Any]:
    return list(
        core.list_namespaced_pod(namespace, label_selector=f"{LABEL_ATTEMPT_KEY}={key}").items
    )


def test_a_rendered_jobset_runs_one_pod_per_chosen_node_to_completion(
    api_client: Any, core: Any, namespace: str, gpu_nodes: Any
) -> None:
    from kubernetes import client

    if not jobset_served(api_client):
        pytest.skip("the JobSet controller is not installed in this environment")
    nodes = gpu_nodes(3)[1:]  # the third node is a decoy the placement excludes
    w = attempt(namespace, nodes, key="7-1-jobset")
    create_token_secret(core, namespace)
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", render_jobset(w)
    )

    def completed() -> Any:
        obj = custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", w.name
        )
        conditions = obj.get("status", {}).get("conditions", [])
        return any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)

    wait_until(completed, timeout=120, what="the rendered JobSet to complete")
    pods = pods_of(core, namespace, w.attempt_key)
    assert sorted(p.spec.node_name for p in pods) == sorted(nodes)
    assert {p.status.phase for p in pods} == {"Succeeded"}
    # MASTER_ADDR names rank 0's pod under the JobSet's headless Service.
    hostnames = sorted(f"{p.spec.hostname}.{p.spec.subdomain}" for p in pods)
    (container,) = pods[0].spec.containers
    master = {e.name: e.value for e in container.env}["MASTER_ADDR"]
    assert hostnames[0] == master == f"{w.name}-node-0-0.{w.name}"
    assert core.read_namespaced_service(w.name, namespace).spec.cluster_ip == "None"


def test_a_rendered_indexed_job_and_its_owned_service_run_and_are_collected_together(
    api_client: Any, core: Any, namespace: str, gpu_nodes: Any
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    batch = client.BatchV1Api(api_client)
    nodes = gpu_nodes(2)
    w = attempt(namespace, nodes, key="7-1-job")
    create_token_secret(core, namespace)
    job = batch.create_namespaced_job(namespace, render_indexed_job(w))
    core.create_namespaced_service(
        namespace, render_headless_service(w, owner_uid=job.metadata.uid)
    )

    def complete() -> Any:
        status = batch.read_namespaced_job(w.name, namespace).status
        return any(c.type == "Complete" and c.status == "True" for c in status.conditions or [])

    wait_until(complete, timeout=90, what="the rendered Indexed Job to complete")
    pods = pods_of(core, namespace, w.attempt_key)
    assert sorted(p.spec.node_name for p in pods) == sorted(nodes)
    assert sorted(f"{p.spec.hostname}.{p.spec.subdomain}" for p in pods) == [
        f"{w.name}-0.{w.name}",
        f"{w.name}-1.{w.name}",
    ]

    batch.delete_namespaced_job(w.name, namespace, propagation_policy="Background")

    def service_gone() -> bool:
        try:
            core.read_namespaced_service(w.name, namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(service_gone, timeout=60, what="the garbage collector to delete the owned Service")
