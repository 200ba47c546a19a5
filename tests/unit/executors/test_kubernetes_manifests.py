"""Rendered JobSet / Indexed Job / headless Service of one attempt (no cluster needed).

The JobSet is checked against the JobSet CRD's own openAPIV3Schema (../shared/k8s/crds/jobset,
JobSet v0.12.0): types and required fields with `jsonschema`, and field names by walking the
schema, since the API server silently prunes fields its schema does not know.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.shared_data import missing_shared

from tensoryard.errors import ExecutorError
from tensoryard.executors.kubernetes.manifests import (
    GPU_RESOURCE,
    LABEL_ATTEMPT,
    LABEL_ATTEMPT_KEY,
    LABEL_JOB_ID,
    AttemptWorkload,
    render_headless_service,
    render_indexed_job,
    render_jobset,
)

CRD = Path(__file__).resolve().parents[4] / "shared/k8s/crds/jobset/jobset.x-k8s.io_jobsets.yaml"


def workload(**overrides: Any) -> AttemptWorkload:
    fields: dict[str, Any] = {
        "job_id": "42",
        "attempt": 3,
        "attempt_key": "42-3-0123456789ab",
        "image": "ghcr.io/example/trainer:1.0",
        "command": ["python", "train.py", "--lr", "3e-4"],
        "env": {"WANDB_MODE": "offline"},
        "token_secret": "ty-42-3-token",
        "namespace": "research",
        "nodes": 4,
        "gpus_per_node": 8,
    }
    fields.update(overrides)
    return AttemptWorkload(**fields)


CASES = {
    "one node, the cluster's scheduler places it": {"nodes": 1},
    "four placed nodes with a PVC, priority and pull secrets": {
        "node_names": ["gpu-a", "gpu-b", "gpu-c", "gpu-d"],
        "pvc_name": "checkpoints",
        "priority_class": "training-high",
        "image_pull_secrets": ["registry"],
        "shm_size": "128Gi",
    },
    "a CPU-only debug attempt": {"nodes": 2, "gpus_per_node": 0, "tolerations": ()},
    "a CPU gang with requests, its run dir on the runs claim, a workdir and a user": {
        "nodes": 2,
        "gpus_per_node": 0,
        "processes_per_node": 2,
        "cpu": 1.5,
        "memory_bytes": 4 * 1024**3,
        "run_dir": "/var/lib/tensoryard/runs/job-42",
        "runs_claim": "tensoryard-runs",
        "run_as_user": 1000,
        "workdir": "/opt/tensoryard/examples/tiny_gpt",
        "volumes": [("team-data", "/data", True), ("scratch", "/scratch", False)],
    },
    "deleted an hour after it finished, with its team": {
        "ttl_after_finished_s": 3600,
        "team": "vision",
    },
}


@functools.cache
def jobset_schema() -> dict[str, Any]:
    if not CRD.is_file():
        missing_shared(
            f"{CRD} is absent (the shared CRDs live next to the repository in ../shared)"
        )
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of fields that a structural schema would prune (not declared anywhere)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        found = []
        for key, value in obj.items():
            if props is not None and key in props:
                found += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None and key not in ("apiVersion", "kind", "metadata"):
                found.append(f"{path}.{key}")
        return found
    if isinstance(obj, list) and "items" in schema:
        return [
            p for i, v in enumerate(obj) for p in unknown_fields(v, schema["items"], f"{path}[{i}]")
        ]
    return []


@pytest.mark.shared
@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_the_rendered_jobset_is_valid_under_the_jobset_crd_schema(
    overrides: dict[str, Any],
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = jobset_schema()
    rendered = render_jobset(workload(**overrides))
    jsonschema.Draft7Validator(schema).validate(rendered)
    assert unknown_fields(rendered, schema) == []


@pytest.mark.shared
def test_the_schema_check_catches_a_misspelled_or_mistyped_field() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = jobset_schema()
    rendered = render_jobset(workload())
    rendered["spec"]["replicatedJobs"][0]["replica"] = 1
    assert unknown_fields(rendered, schema) == [".spec.replicatedJobs[0].replica"]
    rendered["spec"]["replicatedJobs"][0]["replicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(rendered)


def pod_spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "JobSet":
        return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def env_of(obj: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec_of(obj)["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize(
    "render", [render_jobset, render_indexed_job], ids=["JobSet", "Indexed Job"]
)
def test_one_pod_per_node_with_all_its_gpus_and_torchrun_ranked_by_completion_index(
    render: Any,
) -> None:
    w = workload(node_names=["gpu-a", "gpu-b", "gpu-c", "gpu-d"])
    obj = render(w)
    job_spec = (
        obj["spec"]["replicatedJobs"][0]["template"]["spec"]
        if obj["kind"] == "JobSet"
        else obj["spec"]
    )
    assert (job_spec["completionMode"], job_spec["completions"], job_spec["parallelism"]) == (
        "Indexed",
        4,
        4,
    )
    assert job_spec["backoffLimit"] == 0
    pod = pod_spec_of(obj)
    (container,) = pod["containers"]
    assert container["resources"] == {"limits": {GPU_RESOURCE: "8"}}
    assert container["command"][:1] == ["torchrun"]
    assert container["command"][-5:] == ["--no-python", "python", "train.py", "--lr", "3e-4"]
    assert "--node-rank=$(NODE_RANK)" in container["command"]
    env = env_of(obj)
    assert env["NODE_RANK"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    assert env["TYARD_JOB_TOKEN"] == {"secretKeyRef": {"name": "ty-42-3-token", "key": "token"}}
    assert (env["NNODES"], env["NPROC_PER_NODE"], env["WANDB_MODE"]) == ("4", "8", "offline")
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == [
        {
            "labelSelector": {"matchLabels": {LABEL_ATTEMPT_KEY: w.attempt_key}},
            "topologyKey": "kubernetes.io/hostname",
        }
    ]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["values"] == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]


def test_rank_zero_is_reached_through_the_headless_service_dns_name() -> None:
    w = workload()
    assert w.name == "ty-42-3"
    assert env_of(render_jobset(w))["MASTER_ADDR"] == "ty-42-3-node-0-0.ty-42-3"
    job = render_indexed_job(w)
    assert env_of(job)["MASTER_ADDR"] == "ty-42-3-0.ty-42-3"
    assert pod_spec_of(job)["subdomain"] == "ty-42-3"
    service = render_headless_service(w)
    assert service["metadata"]["name"] == "ty-42-3"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {LABEL_ATTEMPT_KEY: w.attempt_key}


def test_every_object_and_pod_carries_the_job_attempt_labels_and_annotations() -> None:
    w = workload()
    expected = {LABEL_JOB_ID: "42", LABEL_ATTEMPT: "3", LABEL_ATTEMPT_KEY: "42-3-0123456789ab"}
    for obj in (render_jobset(w), render_indexed_job(w), render_headless_service(w)):
        assert obj["metadata"]["labels"] == expected
        assert obj["metadata"]["annotations"] == expected
        assert obj["metadata"]["namespace"] == "research"
    for obj in (render_jobset(w), render_indexed_job(w)):
        template = (
            obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            if obj["kind"] == "JobSet"
            else obj["spec"]["template"]
        )
        assert template["metadata"]["labels"] == expected


def test_the_headless_service_is_owned_by_the_created_job() -> None:
    service = render_headless_service(workload(), owner_uid="6f1c-uid")
    assert service["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "ty-42-3",
            "uid": "6f1c-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert "ownerReferences" not in render_headless_service(workload())["metadata"]


def test_optional_pod_settings_are_rendered_only_when_given() -> None:
    pod = pod_spec_of(
        render_jobset(workload(**CASES["four placed nodes with a PVC, priority and pull secrets"]))
    )
    assert pod["priorityClassName"] == "training-high"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "checkpoints"}} in pod[
        "volumes"
    ]
    plain = pod_spec_of(render_jobset(workload(nodes=1)))
    assert "priorityClassName" not in plain and "imagePullSecrets" not in plain
    assert "nodeAffinity" not in plain["affinity"]
    assert plain["tolerations"] == [
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    ]


BAD = {
    "an env var tensoryard sets": ({"env": {"MASTER_ADDR": "x"}}, "env: may not set MASTER_ADDR"),
    "fewer node names than nodes": (
        {"node_names": ["gpu-a"]},
        "node_names: must list one node per pod (4)",
    ),
    "a node named twice": ({"nodes": 2, "node_names": ["a", "a"]}, "must not repeat a node"),
    "a name that is not a DNS label": (
        {"name": "Train_Job"},
        "name: 'Train_Job' must be a DNS label",
    ),
    "an attempt key unfit for a label": (
        {"attempt_key": "a/b"},
        "attempt_key: 'a/b' is not a valid label value",
    ),
    "no command": ({"command": []}, "command: must name a program"),
}


@pytest.mark.parametrize(("overrides", "message"), BAD.values(), ids=BAD.keys())
def test_an_invalid_workload_is_refused_naming_the_field(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExecutorError, match=message.replace("(", r"\(").replace(")", r"\)")):
        workload(**overrides)


def test_a_long_job_id_still_gives_short_dns_safe_names() -> None:
    w = workload(job_id="Team_Research.LLaMA-70B-pretraining-run-number-12345", attempt=12)
    assert len(w.name) <= 40 and w.name.startswith("ty-team-research-llama-70b")
    assert len(f"{w.name}-node-0-{w.nodes - 1}") <= 63
    with pytest.raises(ExecutorError, match="job_id: 'a b' is not a valid label value"):
        workload(job_id="a b")


def test_a_finished_attempt_is_deleted_after_its_ttl_by_its_owner_only() -> None:
    w = workload(ttl_after_finished_s=600)
    jobset, job = render_jobset(w), render_indexed_job(w)
    assert jobset["spec"]["ttlSecondsAfterFinished"] == 600
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    # the JobSet's child Jobs carry none: the JobSet owns them and deletes them with it
    child = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert "ttlSecondsAfterFinished" not in child
    kept = workload(ttl_after_finished_s=None)
    assert "ttlSecondsAfterFinished" not in render_jobset(kept)["spec"]
    assert "ttlSecondsAfterFinished" not in render_indexed_job(kept)["spec"]
    with pytest.raises(ExecutorError, match="ttl_after_finished_s"):
        workload(ttl_after_finished_s=-5)


def test_pods_carry_the_team_label_when_the_job_has_a_team() -> None:
    rendered = render_jobset(workload(team="vision"))
    template = rendered["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["metadata"]["labels"]["tensoryard.io/team"] == "vision"
    with pytest.raises(ExecutorError, match="team"):
        workload(team="not a label!")


def test_a_cpu_pod_requests_its_cores_and_memory_and_is_limited_to_that_memory() -> None:
    w = workload(gpus_per_node=0, processes_per_node=2, cpu=0.5, memory_bytes=2 * 1024**3)
    pod = pod_spec_of(render_jobset(w))
    (container,) = pod["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "2Gi"},
        "limits": {"memory": "2Gi"},
    }
    assert env_of(render_jobset(w))["NPROC_PER_NODE"] == "2"


def test_a_script_runs_under_the_images_python_and_a_program_as_it_is() -> None:
    script = pod_spec_of(render_jobset(workload(command=["train.py", "--steps", "3"])))
    assert script["containers"][0]["command"][-3:] == ["train.py", "--steps", "3"]
    assert "--no-python" not in script["containers"][0]["command"]
    program = pod_spec_of(render_jobset(workload(command=["python", "-m", "train"])))
    assert program["containers"][0]["command"][-4:] == ["--no-python", "python", "-m", "train"]
    # Under the gang's round wrapper (in-place restarts of a multi-node job) a script gets an
    # explicit interpreter: the wrapper starts a program.
    wrapped = pod_spec_of(render_jobset(workload(command=["train.py"], in_place_restarts=1)))
    assert wrapped["containers"][0]["command"][-8:] == [
        "--no-python", "python", "-m", "tensoryard.runtime.gang", "round", "--",
        "python", "train.py",
    ]  # fmt: skip


def test_the_run_dir_is_the_jobs_directory_of_the_runs_claim_at_the_same_path() -> None:
    w = workload(
        run_dir="/var/lib/tensoryard/runs/job-42",
        runs_claim="tensoryard-runs",
        run_as_user=1000,
        workdir="/opt/tensoryard/examples/tiny_gpt",
    )
    pod = pod_spec_of(render_jobset(w))
    (container,) = pod["containers"]
    assert {
        "name": "run-dir",
        "mountPath": "/var/lib/tensoryard/runs/job-42",
        "subPath": "job-42",
    } in container["volumeMounts"]
    assert {
        "name": "run-dir",
        "persistentVolumeClaim": {"claimName": "tensoryard-runs"},
    } in pod["volumes"]
    assert container["workingDir"] == "/opt/tensoryard/examples/tiny_gpt"
    assert pod["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}
    bare = pod_spec_of(render_jobset(workload()))
    assert "securityContext" not in bare and "workingDir" not in bare["containers"][0]
    with pytest.raises(ExecutorError, match="run_dir"):
        workload(runs_claim="tensoryard-runs", run_dir="runs/job-42")


def test_each_volume_of_the_job_is_mounted_in_every_pod_read_only_where_asked() -> None:
    w = workload(volumes=[("team-data", "/data", True), ("scratch", "/scratch", False)])
    pod = pod_spec_of(render_jobset(w))
    (container,) = pod["containers"]
    assert {"name": "volume-0", "mountPath": "/data", "readOnly": True} in container["volumeMounts"]
    assert {"name": "volume-1", "mountPath": "/scratch", "readOnly": False} in container[
        "volumeMounts"
    ]
    assert {
        "name": "volume-0",
        "persistentVolumeClaim": {"claimName": "team-data", "readOnly": True},
    } in pod["volumes"]
    assert {
        "name": "volume-1",
        "persistentVolumeClaim": {"claimName": "scratch", "readOnly": False},
    } in pod["volumes"]
    # The platform's own mounts are not a job's to take.
    for taken in ("/dev/shm", "/var/lib/tensoryard/runs/job-42"):
        with pytest.raises(ExecutorError, match="volumes"):
            workload(
                volumes=[("team-data", taken, False)],
                run_dir="/var/lib/tensoryard/runs/job-42",
                runs_claim="tensoryard-runs",
            )
