"""A Kubernetes gang's in-place restart, without Kubernetes: two real torchruns stand in for the
two pods of a 2-node JobSet and run the command the executor renders for them (the gang
launcher, c10d rendezvous hosted by node 0, each worker under the round counter, each pod with
its own round directory). Node 1's worker fails in round 0; both nodes restart their workers
for round 1, which every worker reports as attempt L + 1, although torchrun's own restart count
grows on node 1 only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.slow

WORKER = """
import json, os, sys, time
out = {k: os.environ.get(k) for k in ("RANK", "TYARD_RESTART_ROUND", "TYARD_ATTEMPT",
       "TYARD_LAUNCH_ATTEMPT", "TORCHELASTIC_RESTART_COUNT")}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(out) + "\\n")
if os.environ["TYARD_RESTART_ROUND"] == "0":
    if os.environ["NODE_RANK"] == "1":
        time.sleep(2)
        sys.exit(1)  # node 1's worker fails in round 0
    time.sleep(120)  # node 0's keeps training until its agent restarts it for round 1
"""


def test_both_pods_restart_their_workers_in_place_and_agree_on_the_round(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = free_port()
    pods = []
    for node in (0, 1):
        env = {
            **os.environ,
            "NODE_RANK": str(node),
            "NNODES": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TYARD_ATTEMPT": "3",
            "TYARD_ATTEMPT_KEY": "k8s-gang-test",
            "TYARD_ROUNDS_DIR": str(tmp_path / f"pod-{node}" / "rounds"),  # pod-local
        }
        argv = [
            sys.executable, "-m", "tensoryard.runtime.gang", "launch", "--",
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=2", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=k8s-gang-test",
            "--max-restarts=1", "--monitor-interval=0.5",
            "--no-python",
            sys.executable, "-m", "tensoryard.runtime.gang", "round", "--",
            sys.executable, str(worker), str(tmp_path / f"node-{node}.jsonl"),
        ]  # fmt: skip
        pods.append(
            subprocess.Popen(
                argv,
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    for pod in pods:
        try:
            out, _ = pod.communicate(timeout=150)
        finally:
            pod.kill()
        outputs.append(out)
    assert [p.returncode for p in pods] == [0, 0], "\n\n".join(o[-3000:] for o in outputs)

    starts = {
        node: [
            json.loads(line) for line in (tmp_path / f"node-{node}.jsonl").read_text().splitlines()
        ]
        for node in (0, 1)
    }
    for node in (0, 1):
        rounds = [(s["TYARD_RESTART_ROUND"], s["TYARD_ATTEMPT"]) for s in starts[node]]
        assert rounds == [("0", "3"), ("1", "4")], (node, starts[node])
        assert starts[node][1]["TYARD_LAUNCH_ATTEMPT"] == "3"
    # torchrun's own count: grown on the node whose worker failed only (why rounds are counted)
    counts = {node: starts[node][1]["TORCHELASTIC_RESTART_COUNT"] for node in (0, 1)}
    assert counts[1] == "1", counts
    assert sorted(os.listdir(tmp_path / "pod-0" / "rounds" / "0")) == ["0", "1"]
