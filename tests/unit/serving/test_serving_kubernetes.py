"""GPU serving objects (serving/kubernetes.py), checked offline: the Deployment and the pod
templates against the Kubernetes 1.36 OpenAPI schemas (strict), the LeaderWorkerSet against
its CRD's openAPIV3Schema (../shared/k8s/crds/lws, LWS v0.10.0); pods read back into replicas.
The same objects go to a real API server in tests/e2e_k8s/test_serving_k8s.py."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.shared_data import missing_shared
from tests.unit.executors.test_kubernetes_manifests import unknown_fields

from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.serving.kubernetes import (
    LABEL_SPEC_HASH,
    object_name,
    pod_view,
    readiness_command,
    render,
)
from tensoryard.store._serving import DeploymentRecord

LWS_CRD = (
    Path(__file__).resolve().parents[4]
    / "shared/k8s/crds/lws/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
)
CONFIG = KubernetesConfig(
    namespace="serving",
    priority_class="inference",
    image_pull_secrets=("registry",),
    node_selector={"pool": "h100"},
    pvc_name="models",
)
NOW = datetime(2026, 12, 4, tzinfo=UTC)


def record(engine: str = "vllm", **options: Any) -> DeploymentRecord:
    return DeploymentRecord(
        name="llama",
        team="nlp",
        model_ref="llama@prod (version 3)",
        model_path="artifact:" + "ab" * 32,
        engine=engine,
        replicas=2,
        options={"router": "prefix", **options},
        idle_timeout_s=None,
        created_by="alice",
        created_at=NOW,
        updated_at=NOW,
    )


def rendered(rec: DeploymentRecord, replicas: int = 2) -> dict[str, Any]:
    return render(
        rec,
        replicas,
        CONFIG,
        loader_image="tensoryard/tensoryard:0.1.0",
        artifact_store_url="s3://m",
    )


def validate(obj: dict[str, Any]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]'")
    kv.validate(obj, "1.36.0", strict=True)


@functools.cache
def lws_schema() -> dict[str, Any]:
    if not LWS_CRD.is_file():
        missing_shared(f"{LWS_CRD} is absent (the shared CRDs live next to the repository)")
    crd = yaml.safe_load(LWS_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def test_a_one_node_replica_is_a_valid_deployment_with_gpus_probes_and_the_weights_loader() -> None:
    obj = rendered(record(tensor_parallel_size=4, kv_cache_dtype="fp8"))
    validate(obj)
    assert obj["kind"] == "Deployment" and obj["spec"]["replicas"] == 2
    assert obj["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = obj["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert engine["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert engine["command"][:3] == ["vllm", "serve", "/models/" + "ab" * 32]
    assert engine["readinessProbe"]["exec"]["command"] == readiness_command("llama")
    assert (
        engine["startupProbe"]["failureThreshold"] * engine["startupProbe"]["periodSeconds"] == 1800
    )
    loader = pod["initContainers"][0]
    assert loader["image"] == "tensoryard/tensoryard:0.1.0"
    assert loader["command"][-2:] == ["ab" * 32, "/models/" + "ab" * 32]
    assert {"name": "TYARD_ARTIFACT_STORE", "value": "s3://m"} in loader["env"]
    assert pod["nodeSelector"] == {"pool": "h100"} and pod["priorityClassName"] == "inference"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    labels = obj["spec"]["template"]["metadata"]["labels"]
    assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels["tensoryard.io/deployment"] == "llama" and labels["tensoryard.io/team"] == "nlp"


def test_a_model_that_is_a_path_or_hub_id_gets_no_loader() -> None:
    rec = record()
    obj = rendered(
        DeploymentRecord(**{**rec.__dict__, "model_path": "/mnt/models/llama"})  # type: ignore[arg-type]
    )
    pod = obj["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert pod["containers"][0]["command"][2] == "/mnt/models/llama"


def test_a_multi_node_replica_is_a_leaderworkerset_valid_against_its_crd() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    obj = rendered(record("sglang", tensor_parallel_size=16, nodes=2))
    schema = lws_schema()
    jsonschema.validate(obj, schema)
    assert unknown_fields(obj, schema) == []
    tpl = obj["spec"]["leaderWorkerTemplate"]
    assert tpl["size"] == 2 and tpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = tpl["leaderTemplate"]["spec"]["containers"][0]
    worker = tpl["workerTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "readinessProbe" in leader and "readinessProbe" not in worker
    assert leader["command"] != worker["command"]
    for part in ("leaderTemplate", "workerTemplate"):  # each pod template is a valid Pod
        validate({"apiVersion": "v1", "kind": "Pod", **tpl[part], "metadata": {"name": "x"}})


def test_the_spec_hash_ignores_the_replica_count_but_not_the_model_or_options() -> None:
    def h(rec: DeploymentRecord, n: int = 2) -> str:
        return str(rendered(rec, n)["metadata"]["labels"][LABEL_SPEC_HASH])

    base = record(tensor_parallel_size=2)
    assert h(base, 1) == h(base, 5)
    assert h(base) != h(record(tensor_parallel_size=4))
    moved = DeploymentRecord(**{**base.__dict__, "model_path": "artifact:" + "cd" * 32})  # type: ignore[arg-type]
    assert h(base) != h(moved)


def test_object_names_stay_dns_labels_with_room_for_lws_pod_suffixes() -> None:
    assert object_name("llama") == "tyard-llama"
    long_a, long_b = "a" * 60 + "-x", "a" * 60 + "-y"
    assert len(object_name(long_a)) <= 52 and object_name(long_a) != object_name(long_b)


def _pod(ready: bool, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "tyard-llama-7c9-abcde", "labels": {}},
        "spec": {"nodeName": "gpu-3"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastTransitionTime": "2026-12-04T10:02:30Z",
                }
            ],
            **status,
        },
    }


def test_a_ready_pod_reports_its_address_node_and_load_times() -> None:
    pull = {"digest": "ab", "bytes": 10, "files": 2, "pull_s": 41.5, "cached": False}
    view = pod_view(
        _pod(
            True,
            initContainerStatuses=[
                {"name": "weights", "state": {"terminated": {"message": json.dumps(pull)}}}
            ],
            containerStatuses=[
                {
                    "name": "engine",
                    "restartCount": 1,
                    "state": {"running": {"startedAt": "2026-12-04T10:00:00Z"}},
                }
            ],
        )
    )
    assert (view.ready, view.ip, view.node, view.restarts) == (True, "10.0.0.7", "gpu-3", 1)
    assert view.pull_s == 41.5 and view.load_s == 150.0 and view.message == ""


def test_a_pod_that_is_not_ready_says_why() -> None:
    failed = {"error": "cannot pull ab from s3://m: NoSuchKey"}
    view = pod_view(
        _pod(
            False,
            initContainerStatuses=[
                {"name": "weights", "state": {"terminated": {"message": json.dumps(failed)}}}
            ],
        )
    )
    assert not view.ready and "NoSuchKey" in view.message
    pulling = pod_view(
        _pod(
            False,
            containerStatuses=[
                {"name": "engine", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
            ],
        )
    )
    assert pulling.message == "engine: ImagePullBackOff" and pulling.load_s is None
