"""A node where a job failed twice is avoided: a control plane offering this machine as two
nodes (`--local-nodes n1,n2`), a job whose first two attempts fail (exit 1) on the node it was
placed on. The first failure restarts it in place (same node, the allocation kept); the second
makes that node one where two of its attempts failed, so the job goes back to the queue
(counted as a restart) and the scheduler places its third attempt on the other node, where it
succeeds. Real processes; the failure is the job's own exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ServerProcess
from tests.e2e.test_e2e_jobs import TERMINAL, wait_for

pytestmark = pytest.mark.slow

FAIL_TWICE = """\
import os, sys
attempt = int(os.environ["TYARD_ATTEMPT"])
print(f"attempt {attempt}", flush=True)
sys.exit(1 if attempt <= 2 else 0)
"""


def test_a_node_where_a_job_failed_twice_is_avoided_by_its_next_placement(
    two_nodes: ServerProcess, tmp_path: Path
) -> None:
    client = two_nodes.start()
    (tmp_path / "fail_twice.py").write_text(FAIL_TWICE)
    spec = {
        "name": "flaky-node",
        "launcher": "python",
        "command": ["fail_twice.py"],
        "workdir": str(tmp_path),
        "resources": {"cpu": 1},
        "restart": {"max_restarts": 3, "backoff": "0s"},
    }
    job_id = client.submit(yaml.safe_load(yaml.safe_dump(spec)))["id"]
    job = wait_for(client, job_id, TERMINAL, timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    first, second, third = client.attempts(job_id)
    assert first["nodes"] == second["nodes"] and len(first["nodes"]) == 1
    [bad] = first["nodes"]
    assert (first["state"], second["state"], third["state"]) == ("failed", "failed", "succeeded")
    assert third["nodes"] == ["n2" if bad == "n1" else "n1"]
    assert job["restarts"] == 2  # the requeue is counted as the restart it is
    messages = [e["message"] for e in client.events(job_id)]
    requeued = [m for m in messages if "requeued to be placed elsewhere" in m]
    assert requeued and f"avoids {bad} ({bad}: attempts 1, 2 failed there)" in requeued[0]
    assert not any("not avoiding" in m for m in messages)
