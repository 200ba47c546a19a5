"""The control plane inside the test cluster, deployed as a platform engineer deploys it.

`kubectl apply -k` of deploy/kubernetes-overlays/dev (the base in deploy/kubernetes plus the
PostgreSQL of deploy/kubernetes-overlays/postgres), with only what any site changes on top: the
images (tensoryard's CPU image, imported into the real nodes, and its PostgreSQL image, pushed
with `tyard images push` to the test cluster's registry and pulled from there by the node), the
database password (a Secret), where the pods may run (the
real nodes' label and taint) and a NodePort on the Service so that `tyard` on the host reaches it.
The control plane then runs as its ServiceAccount with the in-cluster config (the `kubernetes`
Service, through kube-proxy), keeps its state in PostgreSQL and its run directories on the
`tensoryard-runs` claim, and launches the tiny GPT as a gang of two pods on two real nodes.
The control plane SIGKILLed mid-launch (its container restarted by the kubelet) and then its pod
force-deleted while the job trains lose nothing: each next server reads the database, adopts
the JobSet, and the job ends once, from one JobSet, with no restart.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tensoryard.client import Client
from tensoryard.errors import ClientError
from tensoryard.executors.kubernetes.manifests import LABEL_JOB_ID
from tests.e2e_k8s import platform
from tests.e2e_k8s.conftest import REAL_NODE_LABEL, REPO, K8sEnv, _unavailable, wait_until

pytestmark = pytest.mark.slow

NAMESPACE = "tensoryard"  # the base's namespace, as deployed
DEV = REPO / "deploy" / "kubernetes-overlays" / "dev"
IN_IMAGE = "/opt/tensoryard/examples/tiny_gpt"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
TOLERATION = {"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
T = TypeVar("T")


def _name_tag(ref: str) -> tuple[str, str]:
    name, _, tag = ref.rpartition(":")
    return name, tag


def site_overlay(where: Path, cpu_image: str, postgres_image: str, password: str) -> Path:
    """A site's kustomization over the dev overlay: images, the database Secret, placement,
    a NodePort. Nothing else of the shipped manifests is changed."""
    cpu_name, cpu_tag = _name_tag(cpu_image)
    pg_name, pg_tag = _name_tag(postgres_image)
    url = f"postgresql+psycopg://tensoryard:{password}@postgres.{NAMESPACE}.svc:5432/tensoryard"
    pod = "/spec/template/spec"
    placement = [
        {"op": "add", "path": f"{pod}/nodeSelector", "value": {REAL_NODE_LABEL: "true"}},
        {"op": "add", "path": f"{pod}/tolerations", "value": [TOLERATION]},
    ]
    server_args = [
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": arg}
        for arg in (
            f"--node-selector={REAL_NODE_LABEL}=true",
            f"--toleration={REAL_NODE_LABEL}:NoSchedule",
            "--cancel-grace=5",
        )
    ]
    # The test's fault: the server SIGKILLs itself once its first launch created the JobSet,
    # before the database knows (tensoryard.faults); the kubelet restarts the container.
    # Once: the restarted container (same environment) runs past the point, as the marker on
    # its home claim says it crashed there already.
    for name, value in (
        ("TYARD_CRASH_AT", "launch.after_start"),
        ("TYARD_CRASH_ONCE", "/var/lib/tensoryard/crashed-mid-launch"),
    ):
        env = {"name": name, "value": value}
        server_args.append({"op": "add", "path": f"{pod}/containers/0/env/-", "value": env})
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEV, where)],
        "images": [
            {"name": "tensoryard/tensoryard", "newName": cpu_name, "newTag": cpu_tag},
            {"name": "tensoryard/postgres", "newName": pg_name, "newTag": pg_tag},
        ],
        "secretGenerator": [
            {
                "name": "tensoryard-db",
                "namespace": NAMESPACE,
                "behavior": "replace",
                "literals": [f"password={password}", f"url={url}"],
                "options": {"disableNameSuffixHash": True},
            }
        ],
        "patches": [
            {
                "target": {"kind": "Deployment", "name": "tensoryard-server"},
                "patch": yaml.safe_dump(placement + server_args),
            },
            {
                "target": {"kind": "StatefulSet", "name": "postgres"},
                "patch": yaml.safe_dump(placement),
            },
            {
                "target": {"kind": "Service", "name": "tensoryard-server"},
                "patch": yaml.safe_dump([{"op": "add", "path": "/spec/type", "value": "NodePort"}]),
            },
        ],
    }  # fmt: skip
    where.mkdir(parents=True, exist_ok=True)
    (where / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return where


def agent_overlay(where: Path, cpu_image: str, token: str) -> Path:
    """deploy/kubernetes-overlays/agent as a site applies it beside the control plane (its
    default TYARD_SERVER is the in-cluster Service), for the CPU-only real nodes here: the CPU
    image, no NVIDIA runtime class, the real nodes' label and taint, a 1 s health interval."""
    name, tag = _name_tag(cpu_image)
    pod = "/spec/template/spec"
    term = {"key": REAL_NODE_LABEL, "operator": "In", "values": ["true"]}
    selector = f"{pod}/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
    patch = [
        {"op": "remove", "path": f"{pod}/runtimeClassName"},
        {"op": "replace", "path": f"{selector}/nodeSelectorTerms/0/matchExpressions/0",
         "value": term},
        {"op": "add", "path": f"{pod}/tolerations/-", "value": TOLERATION},
        {"op": "add", "path": f"{pod}/containers/0/args/-", "value": "--interval=1"},
    ]  # fmt: skip
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEV.parent / "agent", where)],
        "images": [{"name": "tensoryard/tensoryard", "newName": name, "newTag": tag}],
        "secretGenerator": [
            {
                "name": "tensoryard-agent",
                "namespace": NAMESPACE,
                "literals": [f"token={token}"],
                "options": {"disableNameSuffixHash": True},
            }
        ],
        "patches": [
            {"target": {"kind": "DaemonSet", "name": "tensoryard-agent"},
             "patch": yaml.safe_dump(patch)},
        ],
    }  # fmt: skip
    where.mkdir(parents=True, exist_ok=True)
    (where / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return where


def kubectl(env: K8sEnv, *args: str, check: bool = True, timeout: float = 120) -> str:
    """kubectl's output (tests/e2e_k8s/platform.py runs it)."""
    return platform.kubectl(env, *args, check=check, timeout=timeout).stdout


@dataclass
class Deployed:
    env: K8sEnv
    url: str
    token: str
    client: Client

    def tyard(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tensoryard.cli.main", *args],
            env={**os.environ, "TYARD_SERVER": self.url, "TYARD_TOKEN": self.token},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def _server_pods(core: Any) -> list[Any]:
    pods = core.list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/name=tensoryard-server"
    ).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _diagnose(env: K8sEnv) -> str:
    out = [kubectl(env, "get", "pods,pvc,svc", "-n", NAMESPACE, "-o", "wide", check=False)]
    for app in ("tensoryard-server", "postgres"):
        out.append(
            kubectl(
                env, "logs", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={app}",
                "--tail=40", check=False,
            )
        )  # fmt: skip
    out.append(kubectl(env, "get", "events", "-n", NAMESPACE, check=False)[-3000:])
    return "\n".join(out)


def _admin_token(env: K8sEnv, core: Any) -> str:
    """The admin token the server wrote to its home claim, read as an operator reads it."""
    pod = _server_pods(core)[0].metadata.name
    return kubectl(
        env, "exec", "-n", NAMESPACE, pod, "--", "cat", "/var/lib/tensoryard/admin.token"
    ).strip()


@pytest.fixture
def postgres_image(registry: tuple[str, Path]) -> str:
    """The PostgreSQL image pushed with `tyard images push` to the cluster's registry, which the
    nodes pull it from (it is not imported into them): its reference there."""
    from tensoryard import __version__

    address, ca_dir = registry
    done = subprocess.run(
        [
            sys.executable, "-m", "tensoryard.cli.main", "images", "push", "postgres",
            f"{address}/site", "--cert-dir", str(ca_dir), "--json",
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0 and "is not built" in done.stdout + done.stderr:
        _unavailable("the postgres image is not built: run `tyard images build postgres`")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        json.loads(done.stdout)["destination"] == f"docker://{address}/site/postgres:{__version__}"
    )
    return f"{address}/site/postgres:{__version__}"


@pytest.fixture
def deployed(
    k8s_env: K8sEnv,
    core: Any,
    real_nodes: list[str],
    cpu_image: str,
    postgres_image: str,
    tmp_path: Path,
) -> Iterator[Deployed]:
    overlay = site_overlay(tmp_path / "site", cpu_image, postgres_image, secrets.token_hex(16))
    # Another test's `tensoryard` namespace (the dry-run of the overlays) may still be going.
    wait_until(
        lambda: NAMESPACE not in {n.metadata.name for n in core.list_namespace().items},
        timeout=180,
        what=f"namespace {NAMESPACE} gone",
        interval=1,
    )
    try:
        kubectl(k8s_env, "apply", "-k", str(overlay))
        try:
            wait_until(
                lambda: [p for p in _server_pods(core) if _ready(p)] or None,
                timeout=420,  # PostgreSQL pulled from the registry and initialised first
                what="a Ready control plane pod",
                interval=1,
            )
        except BaseException:
            print(_diagnose(k8s_env))
            raise
        service = core.read_namespaced_service("tensoryard-server", NAMESPACE)
        node_port = service.spec.ports[0].node_port
        node = core.read_node(real_nodes[0])
        ip = next(a.address for a in node.status.addresses if a.type == "InternalIP")
        url = f"http://{ip}:{node_port}"
        token = _admin_token(k8s_env, core)
        yield Deployed(k8s_env, url, token, Client(url, token=token))
    finally:
        # The namespace (and with it the claims, whose volumes the provisioner deletes) too.
        kubectl(k8s_env, "delete", "-k", str(overlay), "--wait=true", check=False, timeout=300)


def reachable(probe: Callable[[], T]) -> Callable[[], T | None]:
    """`probe`, None while the control plane cannot be reached: it restarts in this test (its
    container after the crash point, its pod after the delete) and the Service follows."""

    def call() -> T | None:
        try:
            return probe()
        except ClientError:
            return None

    return call


def _ended(client: Client, job_id: int) -> dict[str, Any] | None:
    job = client.job(job_id)
    return job if job["state"] in TERMINAL else None


def _heartbeats(client: Client, names: list[str]) -> dict[str, str] | None:
    """Each named node's last agent heartbeat, once every one of them has one."""
    beats = {n["name"]: n.get("heartbeat_at") for n in client.nodes()}
    if all(beats.get(name) for name in names):
        return {name: str(beats[name]) for name in names}
    return None


def _spec(tmp_path: Path, steps: int) -> Path:
    spec = {
        "name": "tiny-gpt-in-cluster",
        "image": "cpu",
        "command": [
            "train.py", "--text-file", "README.md", "--steps", str(steps),
            "--d-model", "64", "--seq-len", "64", "--batch-size", "8", "--warmup", "5",
        ],
        "workdir": IN_IMAGE,
        "env": {"OMP_NUM_THREADS": "1"},
        "resources": {
            "nodes": 2, "gpus_per_node": 0, "processes_per_node": 1, "cpu": 0.25, "memory": "1Gi",
        },
        "checkpoint": {"interval": 50},
        "restart": {"max_restarts": 2, "backoff": "0s"},
    }  # fmt: skip
    path = tmp_path / "tiny-gpt.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_control_plane_deployed_from_deploy_trains_a_gang_and_survives_its_own_pod_kill(
    deployed: Deployed,
    core: Any,
    real_nodes: list[str],
    cpu_image: str,
    postgres_image: str,
    tmp_path: Path,
) -> None:
    env = deployed.env
    assert deployed.client.healthz()["ok"] is True  # through the Service's NodePort

    # Long enough to outlast the restarts below on a loaded machine: rows a rank queues while
    # the control plane is down are delivered once it is back, if the rank still runs.
    steps = 1000
    done = deployed.tyard("submit", str(_spec(tmp_path, steps)), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = int(json.loads(done.stdout)["id"])
    client = deployed.client
    try:
        wait_until(
            reachable(lambda: client.metrics(job_id)),
            timeout=240,
            what="the first step",
            interval=1,
        )
    except BaseException:
        print(_diagnose(env))
        raise

    # The server was SIGKILLed mid-launch (JobSet created, not yet recorded): the kubelet
    # restarted its container, which found the JobSet by its attempt key and adopted it.
    (server_pod,) = _server_pods(core)
    (status,) = server_pod.status.container_statuses
    assert status.restart_count == 1, status
    assert status.last_state.terminated.exit_code == 137, status.last_state  # SIGKILL

    # SIGKILL the control plane mid-run (the container dies with no grace, as on a node loss):
    # the Deployment starts another pod, which resumes from the database.
    victim = server_pod.metadata.name
    at_kill = client.job(job_id)
    assert at_kill["state"] == "RUNNING", at_kill
    kubectl(env, "delete", "pod", "-n", NAMESPACE, victim, "--grace-period=0", "--force")
    wait_until(
        lambda: [p for p in _server_pods(core) if _ready(p) and p.metadata.name != victim] or None,
        timeout=180,
        what="the control plane's next pod Ready",
        interval=1,
    )
    job = wait_until(
        reachable(lambda: _ended(client, job_id)),
        timeout=420,
        what=f"job {job_id} to end",
        interval=1,
    )
    assert job["state"] == "SUCCEEDED", client.events(job_id)
    # The training never noticed either kill: each next control plane adopted the attempt.
    assert job["attempts"] == 1 and job["restarts"] == 0, client.events(job_id)

    # One JobSet for the job: no second one after the crash mid-launch.
    jobsets = kubectl(
        env, "get", "jobsets", "-n", NAMESPACE, "-l", f"{LABEL_JOB_ID}={job_id}", "-o", "json"
    )
    assert len(json.loads(jobsets)["items"]) == job["attempts"], jobsets
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"{LABEL_JOB_ID}={job_id}").items
    assert {p.spec.node_name for p in pods} <= set(real_nodes)
    assert len({p.spec.node_name for p in pods if p.status.phase == "Succeeded"}) == 2

    summary = client.summary(job_id)
    assert summary["steps"] == steps
    assert summary["final_loss"] < summary["initial_loss"]
    # Checkpoints on the runs claim, read by the control plane through its mount of it.
    steps_saved = {c["step"] for c in client.checkpoints(job_id)}
    assert max(steps_saved) == steps, steps_saved  # (the newest few are kept)
    described = deployed.tyard("describe", str(job_id))
    assert described.returncode == 0 and "SUCCEEDED" in described.stdout, described.stderr
    # Live logs came through the API from the pods (kept by the platform once they ended).
    logs = deployed.tyard("logs", str(job_id), "--rank", "1")
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr

    # PostgreSQL's image came from the registry: the node pulled it (it was never imported).
    (pg_pod,) = core.list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/name=postgres"
    ).items
    pulled = pg_pod.status.container_statuses[0].image_id
    assert pulled.startswith(postgres_image.rsplit(":", 1)[0] + "@sha256:"), pulled
    # The state lives in the PostgreSQL pod: the job's row, read there with psql.
    query = f"SELECT state FROM jobs WHERE id = {job_id}"
    row = kubectl(
        env, "exec", "-n", NAMESPACE, "postgres-0", "--", "sh", "-c",
        f'PGPASSWORD="$POSTGRES_PASSWORD" psql -h /tmp -U tensoryard -d tensoryard -tAc "{query}"',
    )  # fmt: skip
    assert row.strip() == "SUCCEEDED", row
    # The agent DaemonSet on every real node reports to this control plane through its
    # Service name (CoreDNS, kube-proxy): each node's heartbeat arrives.
    agents = agent_overlay(tmp_path / "agent", cpu_image, deployed.token)
    kubectl(env, "apply", "-k", str(agents))
    try:
        beats = wait_until(
            lambda: _heartbeats(client, real_nodes),
            timeout=180,
            what="a heartbeat from the agent of every real node",
            interval=1,
        )
    except BaseException:
        print(_diagnose(env))
        print(
            kubectl(env, "logs", "-n", NAMESPACE, "ds/tensoryard-agent", "--tail=30", check=False)
        )
        raise
    finally:
        kubectl(env, "delete", "-k", str(agents), "--wait=true", check=False, timeout=120)
    assert set(beats) == set(real_nodes)
    # Never as cluster-admin: the control plane's pods ran as the shipped ServiceAccount.
    assert all(
        p.spec.service_account_name == "tensoryard-control-plane" for p in _server_pods(core)
    )
