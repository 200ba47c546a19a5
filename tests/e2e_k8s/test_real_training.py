"""Training in real containers: tensoryard's Kubernetes executor runs the tiny GPT on the real
nodes of the test cluster (kubelet, containerd, runc, CNI, kube-proxy, CoreDNS), from the CPU
image `tyard images build cpu` makes, with run directories and checkpoints on a volume.

The control plane is `tyard server --executor kubernetes` as the least-privilege ServiceAccount
of deploy/kubernetes/rbac.yaml, listening on the host's address on the nodes' network (where the
pods report to), with `--runs-claim`: a ReadWriteMany claim it mounts at its runs directory
(here a hostPath volume of the same directory: every "node" of this machine shares its disk, as
the nodes of a real cluster share an NFS, JuiceFS or GPFS volume) and that each pod mounts its
job's directory of. The job's code comes with the image (/opt/tensoryard/examples).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tensoryard.client import Client
from tensoryard.executors.kubernetes.manifests import LABEL_JOB_ID
from tests.e2e.conftest import ServerProcess, free_port, wait_for
from tests.e2e_k8s.conftest import REAL_NODE_LABEL, SCRIPT, K8sEnv, _unavailable, wait_until
from tests.e2e_k8s.platform import tyard

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
IN_IMAGE = "/opt/tensoryard/examples/tiny_gpt"  # the image's copy of examples/tiny_gpt
TEXT = "README.md"  # the same bytes in the repository and in the image: both arms train on it
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
RUNS_CLAIM = "tensoryard-runs"


@pytest.fixture(scope="module")
def gateway(k8s_env: K8sEnv, real_nodes: list[str]) -> str:
    """The host's address on the real nodes' network: the control plane listens there."""
    return subprocess.run(
        [SCRIPT, "gateway", "--dir", str(k8s_env.dir)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@dataclass
class Platform:
    server: ServerProcess
    client: Client
    namespace: str

    @property
    def runs(self) -> Path:
        return self.server.home / "runs"

    def run_dir(self, job_id: int) -> Path:
        return Path(self.client.job(job_id)["run_dir"])


def runs_volume(core: Any, namespace: str, path: Path) -> None:
    """A ReadWriteMany claim bound to a hostPath volume of `path` (the runs directory)."""
    pv_name = f"runs-{namespace}"
    core.create_persistent_volume(
        {
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": RUNS_CLAIM},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": RUNS_CLAIM},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": {"storage": "10Gi"}},
            },
        },
    )


@pytest.fixture
def platform(
    core: Any,
    namespace: str,
    identity: Path,
    gateway: str,
    cpu_image: str,
    tmp_path: Path,
) -> Iterator[Platform]:
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    runs_volume(core, namespace, home / "runs")
    server = ServerProcess(
        home=home,
        port=free_port(),
        host=gateway,
        extra_args=[
            "--executor", "kubernetes",
            "--kubeconfig", str(identity),
            "--namespace", namespace,
            "--node-selector", f"{REAL_NODE_LABEL}=true",
            "--toleration", f"{REAL_NODE_LABEL}:NoSchedule",
            "--runs-claim", RUNS_CLAIM,
            "--cancel-grace", "5",
        ],
    )  # fmt: skip
    client = server.start()
    try:
        yield Platform(server, client, namespace)
    finally:
        server.stop()
        core.delete_persistent_volume(f"runs-{namespace}")


def tiny_gpt(
    tmp_path: Path, *, steps: int, nodes: int = 2, procs: int = 1, workdir: str = IN_IMAGE
) -> Path:
    spec = {
        "name": "tiny-gpt",
        "image": "cpu",
        "command": [
            "train.py", "--text-file", TEXT, "--steps", str(steps),
            "--d-model", "64", "--seq-len", "64", "--batch-size", "8", "--warmup", "5",
        ],
        "workdir": workdir,
        "env": {"OMP_NUM_THREADS": "1"},
        "resources": {
            "nodes": nodes, "gpus_per_node": 0, "processes_per_node": procs,
            "cpu": 0.5, "memory": "2Gi",
        },
        "checkpoint": {"interval": 10},
        "restart": {"max_restarts": 2, "backoff": "0s"},
    }  # fmt: skip
    path = tmp_path / f"tiny-gpt-{nodes}x{procs}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def submit(server: ServerProcess, spec: Path) -> int:
    done = tyard(server, "submit", str(spec), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return int(json.loads(done.stdout)["id"])


def losses(client: Client, job_id: int) -> dict[int, float]:
    """The loss of each step, from the newest attempt that reported it."""
    out: dict[int, float] = {}
    for m in sorted(client.metrics(job_id), key=lambda m: (m["attempt"], m["step"])):
        if "loss" in m["values"]:
            out[m["step"]] = float(m["values"]["loss"])
    return out


def job_pods(core: Any, namespace: str, job_id: int) -> list[Any]:
    return list(
        core.list_namespaced_pod(namespace, label_selector=f"{LABEL_JOB_ID}={job_id}").items
    )


def explain(platform: Platform, job_id: int) -> str:
    events = "\n".join(e["message"] for e in platform.client.events(job_id))
    described = tyard(platform.server, "describe", str(job_id))
    return f"events:\n{events}\n\ndescribe:\n{described.stdout}{described.stderr}"


def test_a_two_pod_gang_trains_across_two_real_nodes_like_the_local_executor(
    platform: Platform, core: Any, real_nodes: list[str], tmp_path: Path
) -> None:
    steps = 30
    job_id = submit(platform.server, tiny_gpt(tmp_path, steps=steps))
    client = platform.client
    wait_for(client, job_id, {"RUNNING"} | TERMINAL, timeout=180)
    wait_until(lambda: client.metrics(job_id) or None, timeout=180, what="the first reported step")
    # Live logs from the running pods, through the API (rank 1 is the second pod's worker);
    # `tyard logs -f` streams until the job ends, as a user following it would.
    follow = subprocess.Popen(
        [sys.executable, "-m", "tensoryard.cli.main", "logs", "-f", str(job_id), "--rank", "0"],
        env={
            **os.environ,
            "TYARD_SERVER": platform.server.url,
            "TYARD_TOKEN": (platform.server.home / "admin.token").read_text().strip(),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    live = tyard(platform.server, "logs", str(job_id), "--rank", "1")
    assert live.returncode == 0, live.stderr
    assert live.stdout.strip(), "rank 1's log is empty while it trains"

    job = wait_for(client, job_id, TERMINAL, timeout=300)
    followed, errors = follow.communicate(timeout=60)  # it ends by itself with the job
    assert follow.returncode == 0, errors
    assert f"attempt 1 ran {steps} steps" in followed, followed[-2000:]
    assert job["state"] == "SUCCEEDED", explain(platform, job_id)
    assert job["attempts"] == 1 and job["restarts"] == 0

    pods = job_pods(core, platform.namespace, job_id)
    on = sorted(p.spec.node_name for p in pods)
    assert len(set(on)) == 2 and set(on) <= set(real_nodes)  # one pod per real node
    assert all(p.status.phase == "Succeeded" for p in pods)
    assert all(p.spec.security_context.run_as_user == 1000 for p in pods)

    summary = client.summary(job_id)
    assert summary["steps"] == steps
    assert summary["final_loss"] < summary["initial_loss"]
    assert 0 < summary["goodput"] <= 1

    # The pods wrote metrics and checkpoints to the volume; the control plane reads them there.
    run_dir = platform.run_dir(job_id)
    assert (run_dir / "attempt-1" / "metrics.jsonl").is_file()
    checkpoints = client.checkpoints(job_id)
    assert {c["step"] for c in checkpoints} >= {10, 20, 30}
    assert all(Path(c["path"]).is_relative_to(run_dir) for c in checkpoints)
    assert all(Path(c["path"]).exists() for c in checkpoints)
    assert Path(checkpoints[-1]["path"]).stat().st_uid == 1000  # written by the pods' user
    assert (run_dir / "nccl").stat().st_uid == 1000  # NCCL's log directory is theirs too

    # The same job and seed under the local executor: one node, two processes (the same world
    # size and data), from the repository's copy of the example.
    local = ServerProcess(
        home=tmp_path / "local", port=free_port(), extra_args=["--cpu-slots", "2"]
    )
    local.home.mkdir()
    local_client = local.start()
    try:
        spec = tiny_gpt(
            tmp_path, steps=steps, nodes=1, procs=2, workdir=str(REPO / "examples" / "tiny_gpt")
        )
        local_id = submit(local, spec)
        local_job = wait_for(local_client, local_id, TERMINAL, timeout=300)
        assert local_job["state"] == "SUCCEEDED", local_job["reason"]
        ours, theirs = losses(client, job_id), losses(local_client, local_id)
        local_summary = local_client.summary(local_id)
    finally:
        local.stop()
    assert sorted(ours) == sorted(theirs) == list(range(1, steps + 1))
    for step in ours:
        assert ours[step] == pytest.approx(theirs[step], rel=1e-3, abs=1e-4), step
    assert local_summary["steps"] == summary["steps"]
    assert 0 < local_summary["goodput"] <= 1
    # The least-privilege identity could do all it tried (its watches included).
    assert "forbidden" not in (platform.server.home / "server.out").read_text().lower()


def workers_of(run_dir: Path, rank: int) -> list[psutil.Process]:
    """The training worker of `rank` of the job whose TYARD_RUN_DIR is `run_dir` (its
    container's processes are this machine's processes, seen from the host)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
        if env.get("TYARD_RUN_DIR") == str(run_dir) and env.get("RANK") == str(rank):
            found.append(p)
    return found


def test_a_killed_training_container_resumes_from_the_checkpoint_on_the_volume(
    platform: Platform, core: Any, tmp_path: Path
) -> None:
    steps = 300  # long enough to be killed mid-run (about 20 ms a step)
    job_id = submit(platform.server, tiny_gpt(tmp_path, steps=steps))
    client = platform.client
    wait_until(
        lambda: [c for c in client.checkpoints(job_id) if c["step"] >= 20] or None,
        timeout=300,
        what="a checkpoint at step 20",
    )
    run_dir = platform.run_dir(job_id)
    victims = workers_of(run_dir, 1)
    assert victims, "rank 1's worker is not running"
    for p in victims:
        os.kill(p.pid, signal.SIGKILL)
    # The newest checkpoint the server knows of once rank 1 is dead. Rank 0 cannot finish another
    # step without rank 1, so at most the one checkpoint it was writing can come after it (reports
    # are asynchronous; the server's metrics and checkpoint lists may lag the volume a little).
    seen = max(c["step"] for c in client.checkpoints(job_id))

    job = wait_for(client, job_id, TERMINAL, timeout=400)
    assert job["state"] == "SUCCEEDED", explain(platform, job_id)
    assert job["restarts"] == 1

    described = tyard(platform.server, "describe", str(job_id), "--json")
    info = json.loads(described.stdout)
    first, second = info["attempts_detail"]
    assert first["state"] == "failed", first
    resumed = second["resumed_from_step"]
    # It resumed from the last checkpoint the killed attempt wrote: not an older one.
    assert resumed is not None and seen <= resumed <= seen + 10, (resumed, seen)
    assert resumed % 10 == 0  # a checkpoint step
    metrics = client.metrics(job_id)
    again = sorted(m["step"] for m in metrics if m["attempt"] == 2)
    assert again[0] == resumed + 1 and again[-1] == steps  # only the steps since it ran again
    curve = losses(client, job_id)
    first_losses = [curve[s] for s in range(1, 6)]
    assert curve[resumed + 1] < min(first_losses)  # the curve continues, not from scratch
    assert client.summary(job_id)["steps"] == steps
    # The failed attempt's log outlives its pod: kept in the run dir on the volume.
    kept = tyard(platform.server, "logs", str(job_id), "--attempt", "1", "--rank", "0")
    assert kept.returncode == 0 and kept.stdout.strip(), kept.stderr


def events_of(client: Client, job_id: int) -> list[str]:
    return [e["message"] for e in client.events(job_id)]


def test_an_image_that_cannot_be_pulled_is_reported_within_seconds_and_cancel_leaves_nothing(
    platform: Platform, core: Any, tmp_path: Path
) -> None:
    spec = yaml.safe_load(tiny_gpt(tmp_path, steps=5).read_text())
    spec["image"] = "localhost/tensoryard/no-such-image:0.0"
    path = tmp_path / "missing-image.yaml"
    path.write_text(yaml.safe_dump(spec))
    job_id = submit(platform.server, path)
    client = platform.client
    started = time.monotonic()
    pulled = wait_until(
        lambda: [m for m in events_of(client, job_id) if "cannot be pulled" in m] or None,
        timeout=60,
        what="the image pull failure reported",
    )
    assert time.monotonic() - started < 60
    assert "localhost/tensoryard/no-such-image:0.0" in pulled[0]
    assert "ErrImagePull" in pulled[0] or "ImagePullBackOff" in pulled[0]
    described = tyard(platform.server, "describe", str(job_id))
    assert "cannot be pulled" in described.stdout

    done = tyard(platform.server, "cancel", str(job_id))
    assert done.returncode == 0, done.stderr
    assert wait_for(client, job_id, TERMINAL, timeout=60)["state"] == "CANCELLED"
    wait_until(
        lambda: not job_pods(core, platform.namespace, job_id),
        timeout=60,
        what="the job's pods deleted",
    )


def test_pods_a_quota_refuses_are_reported_within_seconds_naming_the_quota(
    platform: Platform, core: Any, tmp_path: Path
) -> None:
    # The team's namespace allows one pod: the gang's second cannot be created.
    core.create_namespaced_resource_quota(
        platform.namespace, {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}}
    )
    try:
        job_id = submit(platform.server, tiny_gpt(tmp_path, steps=5))
        client = platform.client
        started = time.monotonic()
        refused = wait_until(
            lambda: [m for m in events_of(client, job_id) if "FailedCreate" in m] or None,
            timeout=60,
            what="the refused pod creation reported",
        )
        assert time.monotonic() - started < 30
        assert "exceeded quota: one-pod" in refused[0], refused
        described = tyard(platform.server, "describe", str(job_id))
        assert "cannot create its pods" in described.stdout
        done = tyard(platform.server, "cancel", str(job_id))
        assert done.returncode == 0, done.stderr
        assert wait_for(client, job_id, TERMINAL, timeout=60)["state"] == "CANCELLED"
        wait_until(
            lambda: not job_pods(core, platform.namespace, job_id),
            timeout=60,
            what="the job's pods deleted",
        )
    finally:
        core.delete_namespaced_resource_quota("one-pod", platform.namespace)


def test_an_oom_killed_pod_fails_the_attempt_naming_the_memory_limit(
    platform: Platform, tmp_path: Path
) -> None:
    spec = {
        "name": "too-big",
        "image": "cpu",
        "command": ["python", "-c", "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096])"],
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpu": 0.5, "memory": "256Mi"},
        "restart": {"max_restarts": 0},
    }
    path = tmp_path / "oom.yaml"
    path.write_text(yaml.safe_dump(spec))
    job_id = submit(platform.server, path)
    job = wait_for(platform.client, job_id, TERMINAL, timeout=180)
    assert job["state"] == "FAILED"
    described = tyard(platform.server, "describe", str(job_id))
    assert "OOMKilled" in described.stdout, explain(platform, job_id)
    assert "memory limit 256Mi" in described.stdout


WRITE = """
import os, pathlib
out = pathlib.Path('/data/hello.txt')
out.write_text(f'written by job {os.environ["TYARD_JOB_ID"]}')
print('wrote', out)
"""
READ = """
import pathlib
print('read:', pathlib.Path('/data/hello.txt').read_text())
try:
    pathlib.Path('/data/other.txt').write_text('no')
except OSError as exc:
    print('refused:', exc.strerror)
"""


def python_job(tmp_path: Path, name: str, code: str, volumes: list[dict[str, Any]]) -> Path:
    spec = {
        "name": name,
        "image": "cpu",
        "launcher": "python",
        "command": ["python", "-c", code],
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpu": 0.25, "memory": "512Mi"},
        "restart": {"max_restarts": 0},
        "volumes": volumes,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_jobs_volume_claims_are_mounted_in_its_pods_read_only_where_asked(
    platform: Platform, core: Any, tmp_path: Path
) -> None:
    core.create_namespaced_persistent_volume_claim(
        platform.namespace,
        {
            "metadata": {"name": "team-data"},
            "spec": {
                "storageClassName": "tensoryard-local",
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "64Mi"}},
            },
        },
    )
    client = platform.client
    volume = {"claim": "team-data", "mount": "/data"}
    writer = submit(platform.server, python_job(tmp_path, "writer", WRITE, [volume]))
    job = wait_for(client, writer, TERMINAL, timeout=180)
    assert job["state"] == "SUCCEEDED", explain(platform, writer)
    # The next job mounts the same claim read-only (`--volume` on the command line).
    path = python_job(tmp_path, "reader", READ, [])
    done = tyard(platform.server, "submit", str(path), "--volume", "team-data:/data:ro", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    reader = int(json.loads(done.stdout)["id"])
    job = wait_for(client, reader, TERMINAL, timeout=180)
    assert job["state"] == "SUCCEEDED", explain(platform, reader)
    assert job["spec"]["volumes"] == [{"claim": "team-data", "mount": "/data", "read_only": True}]
    log = tyard(platform.server, "logs", str(reader)).stdout
    assert f"read: written by job {writer}" in log, log
    assert "refused: Read-only file system" in log, log

    # The team's volume, mounted by the server into every job of the team (--team-volume).
    server = platform.server
    server.stop()
    server.extra_args = [*server.extra_args, "--team-volume", "default=team-data:/data:ro"]
    server.start()
    team_reader = submit(server, python_job(tmp_path, "team-reader", READ, []))
    job = wait_for(client, team_reader, TERMINAL, timeout=180)
    assert job["state"] == "SUCCEEDED", explain(platform, team_reader)
    log = tyard(server, "logs", str(team_reader)).stdout
    assert f"read: written by job {writer}" in log and "refused: Read-only" in log, log
    # A job of the team may not mount its own volume over the team's.
    path = python_job(tmp_path, "overlap", READ, [{"claim": "team-data", "mount": "/data/x"}])
    done = tyard(server, "submit", str(path))
    assert done.returncode != 0 and "volumes.0.mount" in done.stdout + done.stderr, done


def test_a_job_naming_a_claim_that_does_not_exist_is_refused_at_submit_naming_it(
    platform: Platform, tmp_path: Path
) -> None:
    path = python_job(tmp_path, "lost", READ, [{"claim": "no-such-data", "mount": "/data"}])
    done = tyard(platform.server, "submit", str(path))
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "volumes.0.claim" in said and "no-such-data" in said and "fix:" in said, said
    assert "Traceback" not in said
    assert platform.client.jobs()["total"] == 0  # nothing stored, nothing created


def test_an_image_whose_torch_is_not_the_matrix_pin_fails_at_once_naming_both_and_the_fix(
    platform: Platform, tmp_path: Path
) -> None:
    from tensoryard.images.matrix import DEFAULT_MATRIX

    # The site's matrix pins torch 2.10.0 for `cpu`; the image under that tag holds 2.13.0 (as
    # when an image built from an older matrix is still pushed under the same tag).
    site = yaml.safe_load(DEFAULT_MATRIX.read_text())
    held = site["entries"]["cpu"]["torch"]
    site["entries"]["cpu"]["torch"] = "2.10.0"
    matrix = tmp_path / "site-matrix.yaml"
    matrix.write_text(yaml.safe_dump(site))
    server = platform.server
    server.stop()
    server.env = {"TYARD_IMAGE_MATRIX": str(matrix)}
    server.start()
    job_id = submit(server, tiny_gpt(tmp_path, steps=5))  # max_restarts: 2
    job = wait_for(platform.client, job_id, TERMINAL, timeout=180)
    assert job["state"] == "FAILED", explain(platform, job_id)
    assert job["restarts"] == 0 and job["attempts"] == 1  # the next attempt would meet it too
    described = tyard(server, "describe", str(job_id)).stdout
    flat = " ".join(described.split())
    assert f"torch is {held}, the matrix pins 2.10.0" in flat, described
    assert "exited with code 78" in flat and "tyard images build cpu" in flat, described
    assert not platform.client.metrics(job_id)  # no training step ran


def refused_start(
    namespace: str, identity: Path, home: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    """`tyard server --executor kubernetes` with `options`, which must stop it at start: exit 1,
    like a missing namespace (the cluster lacks something; 2 is a malformed option), the fix in
    its error, no traceback."""
    done = subprocess.run(
        [
            sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(home),
            "--port", str(free_port()), "--executor", "kubernetes",
            "--kubeconfig", str(identity), "--namespace", namespace, *options,
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fix:" in done.stderr and "Traceback" not in done.stderr, done.stderr
    return done


def test_a_control_plane_whose_runs_claim_does_not_exist_refuses_to_start_naming_it(
    namespace: str, identity: Path, tmp_path: Path
) -> None:
    done = refused_start(namespace, identity, tmp_path, "--runs-claim", "no-such-claim")
    assert "no-such-claim" in done.stderr


def test_a_control_plane_whose_team_volume_claim_does_not_exist_refuses_to_start_naming_it(
    namespace: str, identity: Path, tmp_path: Path
) -> None:
    option = ("--team-volume", "nlp=no-such-data:/data:ro")
    done = refused_start(namespace, identity, tmp_path, *option)
    assert "--team-volume nlp" in done.stderr and "no-such-data" in done.stderr


def test_a_control_plane_whose_node_selector_matches_no_node_refuses_to_start_naming_it(
    namespace: str, identity: Path, tmp_path: Path
) -> None:
    option = ("--node-selector", "gpu.example.com/product=B300")
    done = refused_start(namespace, identity, tmp_path, *option)
    assert "gpu.example.com/product=B300" in done.stderr and "kubectl label node" in done.stderr


def jobsets_of(custom: Any, namespace: str, job_id: int) -> list[str]:
    listed = custom.list_namespaced_custom_object(
        "jobset.x-k8s.io",
        "v1alpha2",
        namespace,
        "jobsets",
        label_selector=f"{LABEL_JOB_ID}={job_id}",
    )
    return sorted(o["metadata"]["name"] for o in listed["items"])


@pytest.mark.parametrize("point", ["launch.after_intent", "launch.after_start"])
def test_a_control_plane_killed_mid_launch_launches_the_gang_once_and_loses_no_job(
    platform: Platform, api_client: Any, tmp_path: Path, point: str
) -> None:
    from kubernetes import client as k8s

    custom = k8s.CustomObjectsApi(api_client)
    server = platform.server
    server.stop()
    server.env = {"TYARD_CRASH_AT": point}  # SIGKILLs itself there, as a power cut would
    server.start()
    job_id = submit(server, tiny_gpt(tmp_path, steps=40))
    assert server.proc is not None
    server.proc.wait(timeout=60)  # it died at the crash point
    assert server.proc.returncode == -signal.SIGKILL
    launched = jobsets_of(custom, platform.namespace, job_id)
    assert launched == ([] if point == "launch.after_intent" else [f"ty-{job_id}-1"])

    server.env = {}
    client = server.start()
    job = wait_for(client, job_id, TERMINAL, timeout=300)
    assert job["state"] == "SUCCEEDED", explain(platform, job_id)
    assert job["attempts"] == 1  # re-attached or launched once: never a second attempt
    assert jobsets_of(custom, platform.namespace, job_id) == [f"ty-{job_id}-1"]
    assert client.summary(job_id)["steps"] == 40


def node_script(k8s_env: K8sEnv, verb: str, node: str, *args: str) -> None:
    subprocess.run(
        [SCRIPT, verb, node, *args, "--dir", str(k8s_env.dir)],
        check=True,
        capture_output=True,
        timeout=300,
    )


# Last in this module: they stop a real node (and start it again).
def lose_a_node_mid_run(
    platform: Platform, k8s_env: K8sEnv, job_id: int, steps: int
) -> tuple[str, list[str]]:
    """Wait for a checkpoint, then stop the kubelet of the job's last node: the node goes
    NotReady after the controller-manager's grace period (20 s in the test cluster); its
    container keeps running, cut off from the gang once its peers are deleted. Returns the
    lost node and the placement it was lost from."""
    client = platform.client
    wait_until(
        lambda: [c for c in client.checkpoints(job_id) if c["step"] >= 10] or None,
        timeout=300,
        what="a checkpoint at step 10",
    )
    placement = sorted(client.job(job_id)["placement"])
    lost = placement[-1]
    node_script(k8s_env, "node-stop", lost, "--kubelet-only")
    return lost, placement


def test_a_gang_on_a_lost_node_moves_to_the_spare_node_uncharged(
    platform: Platform, k8s_env: K8sEnv, real_nodes: list[str], tmp_path: Path
) -> None:
    if len(real_nodes) < 3:
        _unavailable("a gang of 2 moving off a lost node needs 3 real nodes (--real-nodes 3)")
    steps = 1500  # still training when the node is found NotReady (20 s and more)
    job_id = submit(platform.server, tiny_gpt(tmp_path, steps=steps))
    client = platform.client
    lost, placement = lose_a_node_mid_run(platform, k8s_env, job_id, steps)
    try:
        moved = wait_until(
            lambda: len(client.attempts(job_id)) >= 2 or None,
            timeout=180,
            what=f"a second attempt after {lost} went NotReady",
        )
        assert moved
        first = client.attempts(job_id)[0]
        assert first["state"] == "failed" and lost in first["reason"], first
        assert max(m["step"] for m in client.metrics(job_id)) < steps, "make the job longer"
        job = wait_for(client, job_id, TERMINAL, timeout=400)
    finally:
        node_script(k8s_env, "node-start", lost)
    assert job["state"] == "SUCCEEDED", explain(platform, job_id)
    assert job["restarts"] == 0  # a lost node is the cluster's failure, not the job's
    now = sorted(job["placement"])
    kept = sorted(set(placement) - {lost})
    assert lost not in now and set(kept) <= set(now) and len(now) == 2, (placement, now)
    events = events_of(client, job_id)
    assert any(f"{lost} replaced by" in m for m in events), events
    second = client.attempts(job_id)[-1]
    assert second["resumed_from_step"] is not None and second["resumed_from_step"] >= 10
    assert client.summary(job_id)["steps"] == steps


def test_a_gang_on_every_node_waits_for_the_lost_one_and_resumes_when_it_is_back(
    platform: Platform, k8s_env: K8sEnv, real_nodes: list[str], tmp_path: Path
) -> None:
    steps = 1500
    every = len(real_nodes)
    job_id = submit(platform.server, tiny_gpt(tmp_path, steps=steps, nodes=every))
    client = platform.client
    lost, _ = lose_a_node_mid_run(platform, k8s_env, job_id, steps)
    try:
        waiting = wait_until(
            lambda: ((j := client.job(job_id))["state"] == "PENDING" and j) or None,
            timeout=180,
            what=f"the job requeued after {lost} went NotReady",
        )
        assert f"waiting for a node to replace {lost}" in waiting["reason"], waiting["reason"]
        assert waiting["restarts"] == 0  # the cluster's failure, not the job's
        first = client.attempts(job_id)[0]
        assert first["state"] == "failed" and lost in first["reason"], first
        assert max(m["step"] for m in client.metrics(job_id)) < steps, "make the job longer"
        pending = tyard(platform.server, "describe", str(job_id)).stdout
        assert f"only {every - 1} of {every} are schedulable now" in pending, pending
        # `tyard nodes` shows Kubernetes' own word on the lost node
        (seen,) = [n for n in client.nodes() if n["name"] == lost]
        assert seen["schedulable"] is False and " since " in seen["condition"], seen
        time.sleep(5)
        still = client.job(job_id)
        assert still["state"] == "PENDING", explain(platform, job_id)  # no node: it waits
        assert len(client.attempts(job_id)) == 1  # and launches nothing meanwhile
    finally:
        node_script(k8s_env, "node-start", lost)
    job = wait_for(client, job_id, TERMINAL, timeout=400)
    assert job["state"] == "SUCCEEDED", explain(platform, job_id)
    second = client.attempts(job_id)[-1]
    assert second["resumed_from_step"] is not None and second["resumed_from_step"] >= 10
    assert client.summary(job_id)["steps"] == steps


def agent_daemonset(
    tmp_path: Path, namespace: str, image: str, server_url: str, fault_dir: Path
) -> list[dict[str, Any]]:
    """deploy/kubernetes-overlays/agent as rendered, for the CPU-only real nodes of this
    cluster: the CPU image, no NVIDIA runtime class, the real nodes' label and taint, the test's
    control plane, and a health check that fails once the file fault_dir/NODE exists."""
    from tests.unit.cluster.deploy_render import render

    objects = render("agent", tmp_path)
    for o in objects:
        o["metadata"]["namespace"] = namespace
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    pod.pop("runtimeClassName")
    term = {"key": REAL_NODE_LABEL, "operator": "In", "values": ["true"]}
    pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": [{"matchExpressions": [term]}]
    }
    pod["tolerations"].append(
        {"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
    )
    (container,) = pod["containers"]
    container["image"] = image
    container["imagePullPolicy"] = "Never"
    container["env"] = [e for e in container["env"] if not e["name"].startswith("NVIDIA_")]
    for e in container["env"]:
        if e["name"] == "TYARD_SERVER":
            e["value"] = server_url
    container["args"] += ["--interval=1", "--check=test ! -e /host/fault/$(NODE_NAME)"]
    container["volumeMounts"].append(
        {"name": "fault", "mountPath": "/host/fault", "readOnly": True}
    )
    pod["volumes"].append(
        {"name": "fault", "hostPath": {"path": str(fault_dir), "type": "Directory"}}
    )
    return objects


def test_the_agent_daemonset_reports_a_failed_health_check_and_the_gang_moves_off_the_node(
    platform: Platform,
    k8s_env: K8sEnv,
    core: Any,
    api_client: Any,
    real_nodes: list[str],
    cpu_image: str,
    tmp_path: Path,
) -> None:
    """The closed loop on real nodes: the agent (from the CPU image, as the DaemonSet of
    deploy/kubernetes-overlays/agent) runs its health check on each node; one fails, the agent
    reports it, the control plane drains the node (cordoning the Node too), and the gang resumes
    from its checkpoint on the spare node."""
    from kubernetes import client as k8s

    if len(real_nodes) < 3:
        _unavailable("a gang of 2 moving off a drained node needs 3 real nodes (--real-nodes 3)")
    namespace = platform.namespace
    fault = tmp_path / "fault"
    fault.mkdir()
    fault.chmod(0o755)
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "tensoryard-agent"},
            "stringData": {"token": (platform.server.home / "admin.token").read_text().strip()},
        },
    )
    objects = agent_daemonset(tmp_path, namespace, cpu_image, platform.server.url, fault)
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(k8s_env.kubeconfig), "apply", "-f", str(manifest)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    apps = k8s.AppsV1Api(api_client)
    selector = "app.kubernetes.io/name=tensoryard-agent"

    def agents_ready() -> list[Any] | None:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        ready = [
            p
            for p in pods
            if p.status.phase == "Running"
            and all(c.ready for c in (p.status.container_statuses or []))
        ]
        return ready if {p.spec.node_name for p in ready} == set(real_nodes) else None

    drained = ""
    try:
        wait_until(agents_ready, timeout=180, what="an agent ready on every real node")
        steps = 1500
        job_id = submit(platform.server, tiny_gpt(tmp_path, steps=steps))
        client = platform.client
        wait_until(
            lambda: [c for c in client.checkpoints(job_id) if c["step"] >= 10] or None,
            timeout=300,
            what="a checkpoint at step 10",
        )
        placement = sorted(client.job(job_id)["placement"])
        drained = placement[1]
        (fault / drained).touch()  # the node's health check fails from now on
        started = time.monotonic()
        node = wait_until(
            lambda: next(
                (n for n in client.nodes() if n["name"] == drained and n["state"] != "ready"),
                None,
            ),
            timeout=60,
            what=f"{drained} drained by the agent's report",
        )
        assert time.monotonic() - started < 30
        assert f"`test ! -e /host/fault/{drained}` failed (exit code 1)" in node["reason"], node
        wait_until(  # the Node is cordoned too (the control loop mirrors it)
            lambda: core.read_node(drained).spec.unschedulable,
            timeout=30,
            what=f"the Node {drained} cordoned",
        )
        job = wait_for(client, job_id, TERMINAL, timeout=500)
        assert job["state"] == "SUCCEEDED", explain(platform, job_id)
        now = sorted(job["placement"])
        assert drained not in now and len(now) == 2, (placement, now)
        last = client.attempts(job_id)[-1]
        assert last["resumed_from_step"] is not None and last["resumed_from_step"] >= 10
        assert client.summary(job_id)["steps"] == steps
    finally:
        if drained:
            (fault / drained).unlink(missing_ok=True)
            tyard(platform.server, "nodes", "uncordon", drained)
            core.patch_node(drained, {"spec": {"unschedulable": None}})
        apps.delete_namespaced_daemon_set("tensoryard-agent", namespace)
