"""When things break: time from a fault to the attempt ending (detection) and to every rank
training again (recovery), on real Kubernetes nodes and locally, in one run.

Modes, each repeated, all on the tiny GPT (2 ranks, a checkpoint every 10 steps):

- k8s-node-notready: on the test cluster of scripts/k8s-testenv with three real nodes (see
  _k8s_real.py), the kubelet under one pod of a 2-pod gang is stopped; the third node is the
  spare. The fault counts from when the API shows the node not Ready (polled every 0.1 s);
  Kubernetes' own part before that (the controller-manager's node grace period, 20 s in the
  test cluster, 40 s by default) is reported beside it as `api_s`;
- k8s-container-killed: rank 1's training process SIGKILLed inside its container;
- local-rank-killed: the same with the local executor (one node, two processes).

Detection is the attempt's end as the control plane records it; recovery is the first step the
next attempt reports (every rank has loaded the checkpoint and run one step together: DDP).
Goals (issue 37): detection <= 10 s after the API shows the fault, recovery <= 30 s with a spare.

    python benchmarks/failures.py                    # every mode x 3
    python benchmarks/failures.py --repeats 1 --no-results-line --json PATH
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _k8s_real import REPO, RealCluster
from _results import benchmark_main, provenance, wait

from tensoryard.client import Client

NAME = "failures"
GOAL_DETECT_S, GOAL_RECOVER_S = 10.0, 30.0
MODES = ("k8s-node-notready", "k8s-container-killed", "local-rank-killed")


def tiny_gpt(*, nodes: int, procs: int, workdir: str) -> dict[str, Any]:
    return {
        "name": "tiny-gpt",
        "image": "cpu",
        "command": [
            "train.py", "--text-file", "README.md", "--steps", "100000",
            "--d-model", "64", "--seq-len", "64", "--batch-size", "8",
        ],
        "workdir": workdir,
        "env": {"OMP_NUM_THREADS": "1"},
        "resources": {
            "nodes": nodes, "gpus_per_node": 0, "processes_per_node": procs,
            "cpu": 0.5, "memory": "2Gi",
        },
        "checkpoint": {"interval": 10},
        "restart": {"max_restarts": 5, "backoff": "0s"},
    }  # fmt: skip


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def checkpointed(client: Client, job_id: int) -> None:
    wait(
        lambda: any(c["step"] >= 10 for c in client.checkpoints(job_id)),
        300,
        "a checkpoint at step 10",
        every=0.2,
    )


def outcome(client: Client, job_id: int, t0: float) -> dict[str, float]:
    """Detection and recovery of `job_id`'s first failure, counted from `t0`."""
    first = wait(
        lambda: (a := client.attempts(job_id)) and a[0]["finished_at"] and a[0],
        300,
        "the attempt to end",
        every=0.05,
    )
    resumed = wait(
        lambda: [m for m in client.metrics(job_id) if m["attempt"] >= 2],
        300,
        "a step of the next attempt",
        every=0.1,
    )
    return {
        "detect_s": _ts(first["finished_at"]) - t0,
        "recover_s": min(m["ts"] for m in resumed) - t0,
    }


def rank_process(run_dir: str, rank: int) -> list[psutil.Process]:
    """The training process of `rank` of the job whose TYARD_RUN_DIR is `run_dir` (a container's
    processes are this machine's, seen from the host)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
        if env.get("TYARD_RUN_DIR") == run_dir and env.get("RANK") == str(rank):
            found.append(p)
    return found


def kill_rank(client: Client, job_id: int) -> float:
    run_dir = client.job(job_id)["run_dir"]
    victims = wait(lambda: rank_process(run_dir, 1), 60, "rank 1's process", every=0.2)
    t0 = time.time()
    for p in victims:
        os.kill(p.pid, signal.SIGKILL)
    return t0


def end(client: Client, job_id: int) -> None:
    client.cancel(job_id)
    wait(
        lambda: client.job(job_id)["state"] in ("CANCELLED", "FAILED", "SUCCEEDED"),
        120,
        "the job to end",
        every=0.2,
    )


def node_ready(cluster: RealCluster, name: str) -> bool:
    node = json.loads(cluster.kubectl("get", "node", name, "-o", "json"))
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    return bool(ready) and ready[0]["status"] == "True"


def k8s_node_notready(cluster: RealCluster) -> dict[str, float]:
    client = cluster.client
    job_id = client.submit(tiny_gpt(nodes=2, procs=1, workdir="/opt/tensoryard/examples/tiny_gpt"))[
        "id"
    ]
    checkpointed(client, job_id)
    lost = sorted(client.job(job_id)["placement"])[-1]
    stopped = time.time()
    cluster.node("node-stop", lost, "--kubelet-only")
    try:
        wait(lambda: not node_ready(cluster, lost), 180, f"{lost} NotReady", every=0.1)
        t0 = time.time()
        result = {"api_s": t0 - stopped, **outcome(client, job_id, t0)}
        moved = sorted(client.job(job_id)["placement"])
        if lost in moved:
            raise RuntimeError(f"the gang was placed on the lost node again: {moved}")
        end(client, job_id)
    finally:
        cluster.node("node-start", lost)
    return result


def k8s_container_killed(cluster: RealCluster) -> dict[str, float]:
    client = cluster.client
    job_id = client.submit(tiny_gpt(nodes=2, procs=1, workdir="/opt/tensoryard/examples/tiny_gpt"))[
        "id"
    ]
    checkpointed(client, job_id)
    result = outcome(client, job_id, kill_rank(client, job_id))
    end(client, job_id)
    return result


def local_rank_killed(work: Path, repeats: int) -> list[dict[str, float]]:
    home = work / "local"
    home.mkdir()
    port = free_port()
    log = (work / "local.out").open("ab")
    argv = [sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(home)]
    argv += ["--port", str(port), "--cpu-slots", "2"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait(lambda: _healthy(url, proc), 60, "the local control plane", every=0.2)
        client = Client(url, (home / "admin.token").read_text().strip())
        results = []
        for _ in range(repeats):
            spec = tiny_gpt(nodes=1, procs=2, workdir=str(REPO / "examples" / "tiny_gpt"))
            job_id = client.submit(spec)["id"]
            checkpointed(client, job_id)
            results.append(outcome(client, job_id, kill_rank(client, job_id)))
            end(client, job_id)
        return results
    finally:
        proc.terminate()
        proc.wait(30)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(url: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise RuntimeError("the local control plane exited")
    try:
        Client(url, None, timeout=2).healthz()
    except Exception:
        return False
    return True


def measure(args: argparse.Namespace) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with RealCluster("tensoryard-failures-", 3) as cluster:
        for repeat in range(args.repeats):
            for mode, fn in (
                ("k8s-node-notready", k8s_node_notready),
                ("k8s-container-killed", k8s_container_killed),
            ):
                cluster.idle()
                took = fn(cluster)
                samples[mode].append(took)
                print(f"[{repeat + 1}/{args.repeats}] {mode}: {took}", flush=True)
        setup_s = cluster.setup_s
    work = Path(tempfile.mkdtemp(prefix="tensoryard-failures-local-"))
    samples["local-rank-killed"] = local_rank_killed(work, args.repeats)
    for took in samples["local-rank-killed"]:
        print(f"local-rank-killed: {took}", flush=True)
    modes: dict[str, Any] = {}
    for mode, runs in samples.items():
        row: dict[str, Any] = {"runs": runs}
        for key in runs[0]:
            row[f"{key}_median"] = statistics.median(r[key] for r in runs)
        modes[mode] = row
    return {
        "benchmark": NAME,
        **provenance("failures.py"),
        "setup_s": round(setup_s, 1),
        "repeats": args.repeats,
        "modes": modes,
        "goal": {"detect_s_max": GOAL_DETECT_S, "recover_s_max": GOAL_RECOVER_S},
    }


def summary(result: dict[str, Any]) -> tuple[str, str]:
    parts, met = [], []
    for mode, row in result["modes"].items():
        text = (
            f"{mode}: detected {row['detect_s_median']:.1f} s, every rank training again "
            f"{row['recover_s_median']:.1f} s after the fault"
        )
        if "api_s_median" in row:
            text += f" (the API showed it {row['api_s_median']:.1f} s after the kubelet stopped)"
        parts.append(text)
        ok = row["detect_s_median"] <= GOAL_DETECT_S and row["recover_s_median"] <= GOAL_RECOVER_S
        met.append(f"{mode} {'yes' if ok else 'no'}")
    text = (
        f"tiny GPT, 2 ranks, medians of {result['repeats']}: "
        + "; ".join(parts)
        + f"; load average at the end {result['load_average']}"
    )
    return text, ", ".join(met)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3)


if __name__ == "__main__":
    benchmark_main(
        NAME,
        __doc__,
        "detection <= 10 s after the API shows the fault, recovery <= 30 s with a spare",
        measure,
        summary,
        add_arguments,
        needs_root="real nodes need root (network namespaces, mounts, cgroups)",
    )
