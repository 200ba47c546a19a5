"""The closed health loop, end to end with real processes: a control plane subprocess offering
this machine as two nodes (`--local-nodes n1,n2`), the tiny GPT example (DDP, gloo, 2 processes,
torch on the CPU) running on one of them, and the node agent of that node serving /metrics over
HTTP. Only the GPU is fake (tensoryard.agent.fake_nvml): the fault injected is an NVML XID 79
event on GPU 2. The agent reports it, the control plane drains the node, the job checkpoints,
is requeued and resumes on the other node from its last checkpoint, and finishes."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tensoryard.agent.fake_nvml import FakeNvml
from tensoryard.agent.service import AgentConfig, NodeAgent
from tests.e2e.conftest import REPO, ServerProcess, tyard, wait_for
from tests.e2e.test_e2e_jobs import TERMINAL, env_for, processes_of, tiny_job

SYS_FIXTURE = REPO / "tests" / "unit" / "observability" / "fixtures" / "sys"

pytestmark = pytest.mark.slow


def checkpointed_job(client: Any, tmp_path: Path) -> tuple[int, str, str]:
    """The tiny GPT running on one of n1, n2 with a checkpoint written: (job, its node, the
    other). 600 steps: still running when the fault lands (60 steps took 2 s in one CI run)."""
    spec = yaml.safe_load(tiny_job(tmp_path, "--steps", "600").read_text())
    job_id = int(client.submit(spec)["id"])
    [node] = wait_for(client, job_id, {"RUNNING"})["placement"]
    deadline = time.monotonic() + 120
    while not client.checkpoints(job_id):
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.3)
    return job_id, node, "n2" if node == "n1" else "n1"


def test_an_xid_on_a_node_drains_it_and_the_job_resumes_on_the_other_node_from_its_checkpoint(
    two_nodes: ServerProcess, tmp_path: Path
) -> None:
    client = two_nodes.start()
    env = env_for(two_nodes)
    job_id, sick, healthy = checkpointed_job(client, tmp_path)

    nvml = FakeNvml.with_gpus(4)
    agent = NodeAgent(
        AgentConfig(
            node=sick,
            port=0,
            sys_root=Path(shutil.copytree(SYS_FIXTURE, tmp_path / "sys")),
            jobs_interval_s=0.5,
            health_interval_s=0.5,
        ),
        control_plane=client,
        nvml=nvml,
    )
    url = agent.start()
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            before = response.read().decode()
        assert f'Hostname="{sick}"' in before and "DCGM_FI_DEV_GPU_UTIL" in before

        nvml.gpus[2].xid_events.append(79)  # the injected fault
        deadline = time.monotonic() + 30
        while {n["name"]: n["state"] for n in client.nodes()}[sick] != "draining":
            assert time.monotonic() < deadline, "the agent's report did not drain the node"
            time.sleep(0.2)
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            after = response.read().decode()
        assert 'tyard_gpu_xid_errors_total{gpu="2"' in after
        assert any(
            line.startswith('tyard_gpu_xid_errors_total{gpu="2"')
            and 'xid="79"' in line
            and line.endswith(" 1")
            for line in after.splitlines()
        )
    finally:
        agent.stop()

    job = wait_for(client, job_id, TERMINAL, timeout=300)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["attempts"] == 2 and job["restarts"] == 0  # a sick node is not the job's fault
    first, second = client.attempts(job_id)
    assert first["reason"] == f"node {sick} drained: XID 79 on GPU 2"
    assert second["resumed_from_step"] is not None and second["resumed_from_step"] >= 10
    admitted = [e["message"] for e in client.events(job_id) if "admitted on" in e["message"]]
    assert admitted[-1].endswith(f"admitted on {healthy}")
    drains = [e["message"] for e in client.events(job_id) if e["kind"] == "drain"]
    assert drains and drains[0].startswith(f"node {sick} drained: XID 79 on GPU 2")
    assert client.summary(job_id)["steps"] == 600

    listed = tyard("nodes", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    states = {n["name"]: (n["state"], n["reason"]) for n in json.loads(listed.stdout)}
    assert states == {sick: ("draining", "XID 79 on GPU 2"), healthy: ("ready", "")}
    back = tyard("nodes", "uncordon", sick, "--reason", "GPU 2 replaced", env=env)
    assert back.returncode == 0, back.stderr
    history = json.loads(tyard("nodes", "history", sick, "--json", env=env).stdout)
    assert [(e["kind"], e["message"]) for e in history] == [
        ("uncordon", "GPU 2 replaced"),
        ("drain", "XID 79 on GPU 2"),
        ("registered", ""),
    ]
    assert not processes_of(two_nodes.home)


def test_a_node_whose_agent_stops_reporting_is_lost_and_its_job_resumes_on_the_other_node(
    two_nodes: ServerProcess, tmp_path: Path
) -> None:
    """Node loss where the executor has no view of its own (local): each node's `tyard agent`
    (a real process) reports every half second; the agent of the job's node is SIGKILLed; after
    the heartbeat timeout the control plane takes the node as lost, kills the attempt by key,
    and the job resumes on the other node from its checkpoint, uncharged."""
    import signal
    import subprocess
    import sys

    from tests.e2e.conftest import free_port

    two_nodes.extra_args += ["--agent-heartbeat-timeout", "3"]
    client = two_nodes.start()
    token = (two_nodes.home / "admin.token").read_text().strip()
    sysfs = Path(shutil.copytree(SYS_FIXTURE, tmp_path / "sys"))
    agents: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp_path / "agents"
    logs.mkdir()
    for node in ("n1", "n2"):
        agents[node] = subprocess.Popen(
            [
                sys.executable, "-m", "tensoryard.cli.main", "agent", "--node", node,
                "--port", str(free_port()), "--interval", "0.5", "--sys-root", str(sysfs),
                "--server", two_nodes.url, "--token", token,
            ],
            stdout=(logs / f"{node}.log").open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not all(n.get("heartbeat_at") for n in client.nodes()):
            assert time.monotonic() < deadline, "the agents did not report"
            time.sleep(0.2)
        job_id, sick, healthy = checkpointed_job(client, tmp_path)
        agents[sick].send_signal(signal.SIGKILL)  # the node's agent is gone
        agents[sick].wait()
        killed_at = time.monotonic()
        deadline = killed_at + 60
        while len(client.attempts(job_id)) < 2:
            assert time.monotonic() < deadline, "the silent node's attempt did not end"
            time.sleep(0.2)
        assert time.monotonic() - killed_at < 3 + 10  # the timeout, then within seconds
        job = wait_for(client, job_id, TERMINAL, timeout=300)
    finally:
        for proc in agents.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(15)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["attempts"] == 2 and job["restarts"] == 0  # a lost node is not the job's fault
    first, second = client.attempts(job_id)
    assert f"node {sick} lost: its agent has not reported since" in first["reason"], first
    assert second["resumed_from_step"] is not None and second["resumed_from_step"] >= 10
    assert sorted(job["placement"]) == [healthy]
    assert client.summary(job_id)["steps"] == 600
    assert not processes_of(two_nodes.home)
