"""Launch on Slurm: submit -> running through tensoryard next to plain `sbatch`, in one run.

On a real Slurm cluster started for the run (scripts/slurm-testenv: munged, slurmctld and four
slurmd on this machine), the same workload is started for 1, 2 and 4 nodes, one process per
node, alternately:

- sbatch: the batch script a Slurm user writes for it (srun, one torchrun per node, static
  rendezvous on the first node), submitted with `sbatch`;
- tensoryard: the same workload as a JobSpec (launcher torchrun) submitted through the REST API
  to a control plane started with `tyard server --executor slurm` and its defaults.

Each rank of the workload writes the time it started (time.time()) to a file; submit -> running
is the time from the submission call until the last rank of the job started. The medians of
the repeats are compared: ratio tensoryard/sbatch and the difference in seconds. Goal (issue
34): the platform adds under 10% and under 0.5 s.

    python benchmarks/slurm_launch.py                       # 1, 2, 4 nodes x 3 repeats
    python benchmarks/slurm_launch.py --repeats 1 --no-results-line --json PATH
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import benchmark_main, provenance, started_at, wait  # noqa: E402

from tensoryard.client import Client  # noqa: E402

NAME = "slurm_launch"
SCRIPT = REPO / "scripts" / "slurm-testenv"
PORT_BASE = 27150  # slurmctld; the slurmds on the next four
RENDEZVOUS = (27170, 27179)
GOAL_RATIO, GOAL_EXTRA_S = 1.10, 0.5

MARKER = """import os, sys, time
t = time.time()
out = os.path.join(sys.argv[1], f"rank-{os.environ.get('RANK', '0')}")
with open(out + ".tmp", "w") as f:
    f.write(repr(t))
os.replace(out + ".tmp", out)
"""

PLAIN_SBATCH = """#!/bin/bash
#SBATCH --ntasks-per-node=1
# A plain Slurm batch script: one torchrun per node, static rendezvous on the first node.
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$head" -o | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')
port=$(( {low} + SLURM_JOB_ID % {span} ))
srun bash -c 'exec "$0" -m torch.distributed.run --nnodes "$SLURM_JOB_NUM_NODES" \\
  --node-rank "$SLURM_NODEID" --nproc-per-node 1 --master-addr "$1" --master-port "$2" \\
  "$3" "$4"' {python} "$addr" "$port" {marker} "$1"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Bench:
    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work = work
        self.env = env
        self.marker = work / "marker.py"
        self.marker.write_text(MARKER)
        self.runs = 0
        self.to_sbatch: list[float] = []  # tensoryard arm: API submit -> sbatch returned

    def out_dir(self) -> Path:
        self.runs += 1
        out = self.work / f"run-{self.runs}"
        out.mkdir()
        return out

    def alive_jobs(self) -> list[str]:
        done = subprocess.run(
            ["squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING,CONFIGURING", "-o", "%i"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        )
        return done.stdout.split()

    def idle(self) -> None:
        wait(lambda: not self.alive_jobs(), 120, "the cluster to be idle", every=0.2)

    def sbatch(self, nodes: int) -> float:
        out = self.out_dir()
        script = self.work / f"plain-{self.runs}.sbatch"
        low, high = RENDEZVOUS
        script.write_text(
            PLAIN_SBATCH.format(
                low=low,
                span=high - low + 1,
                python=shlex.quote(sys.executable),
                marker=shlex.quote(str(self.marker)),
            )
        )
        argv = ["sbatch", "--parsable", f"--nodes={nodes}", "--cpus-per-task=1", "--mem=512M"]
        argv += [f"--output={out / 'slurm.out'}", str(script), str(out)]
        t0 = time.time()
        subprocess.run(argv, env=self.env, check=True, capture_output=True, timeout=30)
        last = wait(lambda: started_at(out, nodes), 180, f"plain sbatch on {nodes} node(s)")
        return float(last) - t0

    def tensoryard(self, client: Client, nodes: int) -> float:
        out = self.out_dir()
        spec = {
            "name": f"bench-{nodes}n",
            "launcher": "torchrun",
            "command": [str(self.marker), str(out)],
            "workdir": str(self.work),
            "resources": {"nodes": nodes, "processes_per_node": 1, "cpu": 1, "memory": "512Mi"},
            "restart": {"max_restarts": 0},
        }
        t0 = time.time()
        job = client.submit(spec)
        last = wait(lambda: started_at(out, nodes), 180, f"tensoryard on {nodes} node(s)")
        wait(
            lambda: client.job(job["id"])["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"),
            120,
            "the job to end",
            every=0.2,
        )
        # the platform's own share: API submit -> sbatch returned (the executor's record)
        record = Path(client.job(job["id"])["run_dir"]) / "attempt-1" / "slurm-job.json"
        self.to_sbatch.append(float(json.loads(record.read_text())["submitted_at"]) - t0)
        return float(last) - t0


def start_plane(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Client]:
    home = work / "home"
    home.mkdir()
    config = work / "slurm.yaml"
    config.write_text(
        json.dumps(
            {"slurm_conf": env["SLURM_CONF"], "rendezvous_ports": list(RENDEZVOUS)}
        )  # JSON is YAML
    )
    port = free_port()
    log = (work / "server.out").open("ab")
    argv = [sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(home)]
    argv += ["--port", str(port), "--executor", "slurm", "--slurm-config", str(config)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    probe = Client(url, None, timeout=2)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError((work / "server.out").read_text()[-3000:])
        try:
            probe.healthz()
        except Exception:
            return False
        return True

    wait(up, 60, "the control plane", every=0.2)
    return proc, Client(url, (home / "admin.token").read_text().strip())


def slurm_version(env: dict[str, str]) -> str:
    done = subprocess.run(["sbatch", "--version"], env=env, capture_output=True, text=True)
    return (done.stdout or done.stderr).strip() or "slurm (version unknown)"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tensoryard-slurm-launch-"))
    cluster = work / "cluster"
    env = {**os.environ, "TYARD_SLURM_PORT_BASE": str(PORT_BASE), "SLURM_CONF": ""}
    env["SLURM_CONF"] = str(cluster / "slurm.conf")
    subprocess.run(
        [SCRIPT, "up", "--dir", cluster, "--nodes", str(max(args.nodes))],
        env=env,
        check=True,
        timeout=120,
    )
    proc = None
    bench = Bench(work, env)
    samples: dict[int, dict[str, list[float]]] = {
        n: {"sbatch": [], "tensoryard": []} for n in args.nodes
    }
    try:
        proc, client = start_plane(work, env)
        for repeat in range(args.repeats):
            for nodes in args.nodes:
                order = ("sbatch", "tensoryard") if repeat % 2 == 0 else ("tensoryard", "sbatch")
                for arm in order:
                    bench.idle()
                    took = (
                        bench.sbatch(nodes) if arm == "sbatch" else bench.tensoryard(client, nodes)
                    )
                    samples[nodes][arm].append(took)
                    print(
                        f"[{repeat + 1}/{args.repeats}] {nodes} node(s) {arm:10s} "
                        f"submit -> running {took:.3f} s",
                        flush=True,
                    )
        bench.idle()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        subprocess.run([SCRIPT, "down", "--dir", cluster], env=env, timeout=120)
    per_size = {}
    for nodes, arms in samples.items():
        plain, ours = statistics.median(arms["sbatch"]), statistics.median(arms["tensoryard"])
        per_size[str(nodes)] = {
            "sbatch_s": arms["sbatch"],
            "tensoryard_s": arms["tensoryard"],
            "sbatch_median_s": plain,
            "tensoryard_median_s": ours,
            "ratio": ours / plain,
            "extra_s": ours - plain,
        }
    return {
        "benchmark": NAME,
        "tensoryard_submit_to_sbatch_s": bench.to_sbatch,
        "tensoryard_submit_to_sbatch_median_s": statistics.median(bench.to_sbatch),
        **provenance("slurm_launch.py"),
        "slurm": slurm_version(env),
        "repeats": args.repeats,
        "nodes": per_size,
        "goal": {"ratio_max": GOAL_RATIO, "extra_s_max": GOAL_EXTRA_S},
    }


def summary(result: dict[str, Any]) -> tuple[str, str]:
    parts, met = [], []
    for nodes, row in result["nodes"].items():
        parts.append(
            f"{nodes} node(s): tensoryard {row['tensoryard_median_s']:.2f} s vs sbatch "
            f"{row['sbatch_median_s']:.2f} s = {row['ratio']:.2f}x ({row['extra_s']:+.2f} s)"
        )
        ok = row["ratio"] <= GOAL_RATIO and row["extra_s"] <= GOAL_EXTRA_S
        met.append(f"{nodes}n {'yes' if ok else 'no'}")
    text = (
        f"submit -> every rank running (one torchrun per node), median of {result['repeats']} "
        f"alternating runs on {result['slurm']} (4 slurmd on this machine): "
        + "; ".join(parts)
        + f"; tensoryard's own share, API submit -> sbatch returned: median "
        f"{result['tensoryard_submit_to_sbatch_median_s']:.3f} s; load average at the end "
        f"{result['load_average']}"
    )
    return text, ", ".join(met)


def node_counts(text: str) -> list[int]:
    sizes = [int(n) for n in text.split(",")]
    if max(sizes) > 4 or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes between 1 and 4 (the test cluster has four nodes)")
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=node_counts, default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)


if __name__ == "__main__":
    benchmark_main(
        NAME,
        __doc__,
        "tensoryard adds < 10% and < 0.5 s to plain sbatch's submit -> running",
        measure,
        summary,
        add_arguments,
    )
