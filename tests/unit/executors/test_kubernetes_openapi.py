"""Every object the Kubernetes executor creates, validated offline against the Kubernetes 1.36
OpenAPI schemas (`kubernetes-validate`, strict: an unknown field is an error, since the API
server would silently drop it). The JobSet itself is checked against its CRD schema in
test_kubernetes_manifests.py; its Job and pod templates are checked here as a Job and a Pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.kubernetes.executor import render_attempt, workload_for
from tensoryard.executors.kubernetes.manifests import owner_reference
from tensoryard.spec.job import parse_job_spec

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install -e '.[dev]' (kubernetes-validate)"
)
VERSION = "1.36.0"  # the test control plane's release (scripts/k8s-testenv)


def request(**spec: Any) -> LaunchRequest:
    fields = {
        "name": "pretrain",
        "image": "ghcr.io/example/trainer:1.0",
        "command": ["python", "train.py"],
        "env": {"WANDB_MODE": "offline"},
        "resources": {"nodes": 2, "gpus_per_node": 8},
        **spec,
    }
    return LaunchRequest(
        job_id="42",
        attempt=3,
        spec=parse_job_spec(fields),
        run_dir=Path("/runs/job-42"),
        env={"TYARD_JOB_ID": "42", "TYARD_JOB_TOKEN": "secret", "TYARD_RUN_DIR": "/runs/job-42"},
        placement={"gpu-a": [], "gpu-b": []},
        attempt_key="j42-a3-0123456789ab",
    )


CONFIG = KubernetesConfig(
    namespace="ml",
    priority_class="training",
    image_pull_secrets=("registry",),
    pvc_name="shared",
    pod_annotations={"example.com/team": "llm"},
)


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, VERSION, strict=True)


def test_the_indexed_job_service_and_secret_are_valid_kubernetes_objects() -> None:
    secret, job, service = render_attempt(workload_for(request(), CONFIG), "Job")
    service["metadata"]["ownerReferences"] = [
        owner_reference("batch/v1", "Job", job["metadata"]["name"], "0000-uid")
    ]
    for obj in (secret, job, service):
        validate(obj)


def test_the_jobset_templates_are_a_valid_job_and_pod() -> None:
    _, jobset = render_attempt(workload_for(request(), CONFIG), "JobSet")
    job_template = jobset["spec"]["replicatedJobs"][0]["template"]
    validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, **job_template})
    pod_template = job_template["spec"]["template"]
    validate({"apiVersion": "v1", "kind": "Pod", **pod_template, "metadata": {"name": "x"}})


def test_the_validator_does_catch_a_misspelt_field() -> None:
    _, job, _ = render_attempt(workload_for(request(), CONFIG), "Job")
    job["spec"]["template"]["spec"]["tolerationz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)


def test_granted_in_place_restarts_reach_the_pods_torchrun() -> None:
    def command(nodes: int, in_place: int = 2) -> list[str]:
        base = request(resources={"nodes": nodes, "gpus_per_node": 8})
        placement = {f"gpu-{i}": [] for i in range(nodes)}
        req = LaunchRequest(
            **{**base.__dict__, "in_place_restarts": in_place, "placement": placement}
        )
        _, job, _ = render_attempt(workload_for(req, CONFIG), "Job")
        validate(job)
        (container,) = job["spec"]["template"]["spec"]["containers"]
        return list(container["command"])

    single = command(1)
    assert "--max-restarts=2" in single and "--master-addr=$(MASTER_ADDR)" in single
    assert "tensoryard.runtime.gang" not in single
    # A gang: the c10d rendezvous (a static one has no second round), hosted by node 0 (the
    # gang launcher sets is_host from NODE_RANK), each worker numbered by its round.
    gang = command(2)
    torchrun = gang.index("torchrun")
    assert gang[:torchrun] == ["python", "-m", "tensoryard.runtime.gang", "launch", "--"]
    assert "--rdzv-backend=c10d" in gang and "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)" in gang
    assert "--max-restarts=2" in gang and not any(a.startswith("--node-rank") for a in gang)
    worker = gang.index("--no-python") + 1
    assert gang[worker : worker + 5] == ["python", "-m", "tensoryard.runtime.gang", "round", "--"]
    # without a grant a gang keeps the static rendezvous and needs nothing from the image
    static = command(2, in_place=0)
    assert "--max-restarts=0" in static and "--node-rank=$(NODE_RANK)" in static
    assert "tensoryard.runtime.gang" not in static


def test_a_megatron_jobs_pod_runs_torchrun_under_the_runtimes_follower() -> None:
    base = request(command=["python", "pretrain_gpt.py", "--micro-batch-size", "4"])
    env = {**base.env, "TYARD_MEGATRON_SAVE": "/shared/ckpt"}
    req = LaunchRequest(**{**base.__dict__, "env": env})
    _, job, _ = render_attempt(workload_for(req, CONFIG), "Job")
    validate(job)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = list(container["command"])
    assert command[:5] == ["python", "-m", "tensoryard.runtime.megatron", "follow", "--"]
    assert command[5] == "torchrun" and command[-3:] == [
        "pretrain_gpt.py",
        "--micro-batch-size",
        "4",
    ]
    names = {e["name"]: e.get("value") for e in container["env"]}
    assert names["TYARD_MEGATRON_SAVE"] == "/shared/ckpt"
    # any other job's pod runs torchrun itself
    _, plain, _ = render_attempt(workload_for(request(), CONFIG), "Job")
    assert plain["spec"]["template"]["spec"]["containers"][0]["command"][0] == "torchrun"


def test_a_matrix_image_is_checked_by_each_pod_before_torchrun_and_a_full_reference_is_not() -> (
    None
):
    import json

    from tensoryard.images import default_matrix

    w = workload_for(request(image="cpu", volumes=[{"claim": "data", "mount": "/data"}]), CONFIG)
    _, job, _ = render_attempt(w, "Job")
    validate(job)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:5] == [
        "python", "-m", "tensoryard.images.preflight", "--", "torchrun",
    ]  # fmt: skip
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e.get("value") for e in container["env"]}
    pins = json.loads(env["TYARD_IMAGE_EXPECT"])
    assert pins["ref"] == container["image"] and pins["name"] == "cpu"
    assert pins["torch"] == default_matrix().get("cpu").torch
    w = workload_for(request(), CONFIG)  # ghcr.io/example/trainer:1.0
    _, job, _ = render_attempt(w, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "torchrun"
    assert "TYARD_IMAGE_EXPECT" not in {e["name"] for e in container["env"]}


def test_a_teams_volumes_come_first_in_every_pod_of_its_jobs_and_options_are_checked() -> None:
    from tensoryard.cli.k8s import kubernetes_config
    from tensoryard.errors import SpecError

    config = kubernetes_config(
        namespace="ml", team_volumes=["default=team-data:/data:ro", "default=cache:/cache"]
    )
    assert config.team_volumes == {
        "default": (("team-data", "/data", True), ("cache", "/cache", False))
    }
    w = workload_for(request(volumes=[{"claim": "mine", "mount": "/mine"}]), config)
    assert [c for c, _, _ in w.volumes] == ["team-data", "cache", "mine"]
    _, job, _ = render_attempt(w, "Job")
    validate(job)
    other = workload_for(request(team="vision"), config)  # another team: none of them
    assert other.volumes == ()
    for bad, says in [
        ("team-data:/data", "TEAM=CLAIM:/PATH"),
        ("Default=x:/data", "TEAM=CLAIM:/PATH"),
        ("nlp=x:data", "not an absolute directory"),
        ("nlp=x:/opt/tensoryard", "elsewhere"),
        ("nlp=Bad_Claim:/data", "kubectl get pvc"),
    ]:
        with pytest.raises(SpecError) as caught:
            kubernetes_config(team_volumes=[bad])
        (issue,) = caught.value.issues
        assert issue.path == "--team-volume" and says in issue.message, issue
    with pytest.raises(SpecError, match="overlap"):
        kubernetes_config(team_volumes=["nlp=a:/data", "nlp=b:/data/b"])
