"""A fake node that goes NotReady under a running gang (the heartbeat of a node kwok does not
manage, stopped by the test: conftest.HeartbeatNode): the attempt ends naming the node and its
state, within seconds of the API showing it, and the gang moves to the spare node, uncharged.

The same path on real kubelet nodes: test_real_training.py (a stopped kubelet)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ServerProcess, wait_for
from tests.e2e_k8s.conftest import HeartbeatNode, fake_gpu_node, wait_until
from tests.e2e_k8s.platform import (
    COMPLETE_DELAY,
    COMPLETE_JITTER,
    job_spec,
    start_server,
    tyard,
)

pytestmark = pytest.mark.slow

LONG_RUNNING = ("--pod-annotation", f"{COMPLETE_DELAY}=600s")
LONG_RUNNING += ("--pod-annotation", f"{COMPLETE_JITTER}=600s")


def _ready(core: Any, name: str) -> str:
    node = core.read_node(name)
    return next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "?")


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("stop", "Unknown since"),  # the kubelet died: Kubernetes marks it after its grace period
        ("not_ready", "NotReady since"),  # the kubelet says so (KubeletNotReady)
    ],
    ids=["its kubelet stops posting", "its kubelet reports NotReady"],
)
def test_a_gang_on_a_node_that_goes_not_ready_ends_naming_it_and_moves_to_the_spare(
    how: str, words: str, core: Any, namespace: str, identity: Path,
    gpu_nodes: Callable[[int], list[str]], heartbeat_nodes: Callable[[str], HeartbeatNode],
    servers: list[ServerProcess], tmp_path: Path,
) -> None:  # fmt: skip
    flaky = heartbeat_nodes("hb")
    (steady,) = gpu_nodes(1)
    server, client = start_server(tmp_path / "home", identity, namespace, *LONG_RUNNING)
    servers.append(server)
    out = tyard(server, "submit", str(job_spec(tmp_path / "job.yaml")), "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    job_id = int(json.loads(out.stdout)["id"])
    job = wait_for(client, job_id, {"RUNNING"}, timeout=90)
    assert sorted(job["placement"]) == sorted([flaky.name, steady])

    spare = f"{namespace}-spare"
    core.create_node(fake_gpu_node(spare, pool=namespace))
    try:
        wait_until(lambda: _ready(core, spare) == "True", timeout=60, what=f"{spare} Ready")
        getattr(flaky, how)()
        wait_until(
            lambda: _ready(core, flaky.name) != "True",
            timeout=60,
            what=f"the API to show {flaky.name} not Ready",
        )
        shown = time.monotonic()
        first = wait_until(
            lambda: next((a for a in client.attempts(job_id) if a["state"] != "running"), None),
            timeout=30,
            what="attempt 1 to end",
        )
        detected = time.monotonic() - shown
        assert detected <= 10, f"attempt 1 ended {detected:.1f}s after the API showed the node"
        assert first["reason"].startswith(f"node {flaky.name} {words} "), first["reason"]

        def running_on_spare() -> dict[str, Any] | None:
            job = client.job(job_id)
            moved = job["state"] == "RUNNING" and job["attempts"] == 2
            return job if moved else None

        job = wait_until(running_on_spare, timeout=60, what="attempt 2 running")
        assert sorted(job["placement"]) == sorted([spare, steady])
        assert job["restarts"] == 0  # the cluster's failure, not the job's
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_node(spare)
