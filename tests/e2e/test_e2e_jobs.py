"""The README flow with real processes: a control plane subprocess, the `tyard` CLI, and the
tiny GPT example trained with DDP (gloo, 2 processes) on the CPU."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tensoryard.executors.chaos import find_rank
from tests.e2e.conftest import REPO, ServerProcess, tyard, wait_for

EXAMPLE = REPO / "examples" / "tiny_gpt"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}

pytestmark = pytest.mark.slow


def tiny_job(tmp_path: Path, *args: str, name: str = "tiny-gpt", **extra: Any) -> Path:
    """A JobSpec file for a short run of the example (small model, few steps)."""
    spec = {
        "name": name,
        "launcher": "torchrun",
        "resources": {"processes_per_node": 2, "cpu": 2, "memory": "2Gi"},
        "command": ["train.py", "--d-model", "64", "--seq-len", "64", "--batch-size", "8", *args],
        "workdir": str(EXAMPLE),
        "checkpoint": {"interval": 10, "keep": 2},
        "restart": {"max_restarts": 2, "backoff": "1s"},
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def env_for(server: ServerProcess) -> dict[str, str]:
    return {"TYARD_SERVER": server.url, "TYARD_HOME": str(server.home)}


def submit(spec: Path, env: dict[str, str]) -> int:
    """`tyard submit SPEC --json` as a user runs it; the new job's id."""
    submitted = tyard("submit", str(spec), "--json", env=env)
    assert submitted.returncode == 0, submitted.stderr
    return int(json.loads(submitted.stdout.strip().splitlines()[-1])["id"])


def processes_of(home: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = p.info.get("environ") or {}
            if str(home) in env.get("TYARD_RUN_DIR", ""):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_a_killed_rank_restarts_from_the_last_checkpoint_and_the_loss_curve_continues(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    control_plane.start()
    env = env_for(control_plane)
    spec = tiny_job(tmp_path, "--steps", "40", "--fail-at-step", "25", "--fail-rank", "1")
    job_id = submit(spec, env)

    client = control_plane.client()
    job = wait_for(client, job_id, TERMINAL, timeout=240)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["restarts"] == 1

    described = tyard("describe", str(job_id), "--json", env=env)
    assert described.returncode == 0, described.stderr
    info = json.loads(described.stdout)
    first, second = info["attempts_detail"]
    assert first["state"] == "failed" and "rank 1" in first["reason"]
    assert second["resumed_from_step"] == 20  # checkpoints every 10 steps, killed at 25
    assert any("restarting from the last checkpoint" in e["message"] for e in info["events"])

    metrics = client.metrics(job_id)
    attempt2 = sorted(m["step"] for m in metrics if m["attempt"] == 2)
    assert attempt2[0] == 21 and attempt2[-1] == 40
    summary = info["summary"]
    assert summary["steps"] == 40
    assert summary["final_loss"] < summary["initial_loss"]
    assert summary["steps_lost"] >= 4  # steps 21..24 (and maybe 25) ran twice
    assert 0 < summary["goodput"] < 1

    logs = tyard("logs", str(job_id), "--rank", "1", "--attempt", "1", env=env)
    assert "fault injection: killing rank 1" in logs.stdout
    assert not processes_of(control_plane.home)


def test_the_job_survives_a_sigkilled_control_plane_and_ends_correctly(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    client = control_plane.start()
    spec = yaml.safe_load(tiny_job(tmp_path, "--steps", "60").read_text())
    job_id = client.submit(spec)["id"]
    wait_for(client, job_id, {"RUNNING"})
    deadline = time.monotonic() + 60
    while not client.metrics(job_id) and time.monotonic() < deadline:
        time.sleep(0.3)

    control_plane.kill()
    workers = processes_of(control_plane.home)
    assert workers, "the job must keep running while the control plane is down"
    time.sleep(2)

    client = control_plane.start()
    job = wait_for(client, job_id, TERMINAL, timeout=240)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["attempts"] == 1  # re-attached, not restarted
    events = [e["message"] for e in client.events(job_id)]
    assert any("control plane restarted" in m for m in events)
    assert client.summary(job_id)["steps"] == 60
    assert not processes_of(control_plane.home)


def test_a_cancelled_job_stops_and_leaves_no_process_behind(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    client = control_plane.start()
    env = env_for(control_plane)
    spec = yaml.safe_load(tiny_job(tmp_path, "--steps", "100000").read_text())
    job_id = client.submit(spec)["id"]
    wait_for(client, job_id, {"RUNNING"})
    result = tyard("cancel", str(job_id), env=env)
    assert result.returncode == 0, result.stderr
    job = wait_for(client, job_id, TERMINAL, timeout=60)
    assert job["state"] == "CANCELLED"
    deadline = time.monotonic() + 15
    while processes_of(control_plane.home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(control_plane.home)


def test_following_logs_streams_until_the_job_ends(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    client = control_plane.start()
    env = env_for(control_plane)
    spec = yaml.safe_load(tiny_job(tmp_path, "--steps", "15").read_text())
    job_id = client.submit(spec)["id"]
    followed = tyard("logs", str(job_id), "-f", "--rank", "0", env=env, timeout=240)
    assert followed.returncode == 0, followed.stderr
    assert "[rank 0]" in followed.stdout
    assert client.job(job_id)["state"] in TERMINAL


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("name: tiny\ncommand: [train.py\n", "malformed YAML at line"),
        ("name: tiny\ncommand: train.py\nresources: {nodes: -3}\n", "resources.nodes"),
        ("name: tiny\ncommand: train.py\nresources: {gpus_per_node: 512}\n", "gpus_per_node"),
        ("name: tiny\n", "command"),
        ("name: tiny\ncommand: train.py\nteam: nobody\n", "unknown team 'nobody'"),
        ("name: tiny\ncommand: train.py\ncolour: blue\n", "colour"),
    ],
    ids=[
        "malformed YAML",
        "a negative node count",
        "an absurd GPU count",
        "a missing command",
        "an unknown team",
        "an unknown field",
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_stores_nothing(
    control_plane: ServerProcess, tmp_path: Path, content: str, needle: str
) -> None:
    client = control_plane.start()
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    result = tyard("submit", str(path), env=env_for(control_plane))
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert client.jobs()["total"] == 0


def test_the_cli_says_how_to_fix_an_unreachable_control_plane(tmp_path: Path) -> None:
    result = tyard("jobs", "--server", "http://127.0.0.1:9", env={"TYARD_HOME": str(tmp_path)})
    assert result.returncode == 1
    assert "cannot reach the control plane" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_higher_priority_job_preempts_at_a_checkpoint_and_the_victim_resumes_later(
    tmp_path: Path,
) -> None:
    from tests.e2e.conftest import _kill_leftovers, free_port

    server = ServerProcess(
        home=tmp_path / "home", port=free_port(), extra_args=["--cpu-slots", "2"]
    )
    server.home.mkdir()
    try:
        client = server.start()
        low = yaml.safe_load(tiny_job(tmp_path, "--steps", "60", name="low").read_text())
        low_id = client.submit(low)["id"]
        wait_for(client, low_id, {"RUNNING"})
        deadline = time.monotonic() + 90
        while not client.checkpoints(low_id) and time.monotonic() < deadline:
            time.sleep(0.3)
        high = yaml.safe_load(tiny_job(tmp_path, "--steps", "10", name="high").read_text())
        high_id = client.submit({**high, "priority": 10})["id"]

        done_high = wait_for(client, high_id, TERMINAL, timeout=240)
        assert done_high["state"] == "SUCCEEDED", done_high["reason"]
        done_low = wait_for(client, low_id, TERMINAL, timeout=240)
        assert done_low["state"] == "SUCCEEDED", done_low["reason"]

        events = [e["message"] for e in client.events(low_id)]
        assert any(m.startswith("preempted for job") for m in events), events
        assert any("requeued, resumes from its last checkpoint" in m for m in events), events
        first, second = client.attempts(low_id)[:2]
        assert first["reason"].startswith("preempted")
        assert second["resumed_from_step"] is not None and second["resumed_from_step"] > 0
        assert done_low["restarts"] == 0  # a preemption is not a failure
        assert client.summary(low_id)["steps"] == 60
    finally:
        server.stop()
        _kill_leftovers(server.home)


def test_a_killed_rank_is_restarted_in_place_without_a_new_launch(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    control_plane.start()
    env = env_for(control_plane)
    spec = tiny_job(
        tmp_path,
        "--steps", "40", "--fail-at-step", "25", "--fail-rank", "1",
        restart={"max_restarts": 2, "in_place": 1, "backoff": "1s"},
    )  # fmt: skip
    job_id = submit(spec, env)

    client = control_plane.client()
    job = wait_for(client, job_id, TERMINAL, timeout=240)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["restarts"] == 1  # counted against max_restarts like any restart

    described = tyard("describe", str(job_id), "--json", env=env)
    info = json.loads(described.stdout)
    first, second = info["attempts_detail"]
    assert (first["state"], first["launch_attempt"]) == ("failed", None)
    assert (second["state"], second["launch_attempt"]) == ("succeeded", 1)
    assert second["resumed_from_step"] == 20
    messages = [e["message"] for e in info["events"]]
    assert any("restarted in place as attempt 2" in m for m in messages), messages
    assert sum("-> STARTING" in m for m in messages) == 1  # launched once, never requeued
    assert sorted(m["step"] for m in client.metrics(job_id) if m["attempt"] == 2)[0] == 21
    human = tyard("describe", str(job_id), env={**env, "COLUMNS": "200"})
    assert "2 (in place, launch 1)" in human.stdout
    logs = tyard("logs", str(job_id), "--rank", "0", "--attempt", "1", env=env)
    assert "restarted in place by torchrun (restart 1)" in logs.stdout
    assert not processes_of(control_plane.home)


def test_a_hung_rank_is_detected_and_the_workers_restarted_in_place(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    control_plane.start()
    env = env_for(control_plane)
    spec = tiny_job(
        tmp_path,
        "--steps", "400",  # long enough that rank 1 is stopped mid-training, not at its end
        restart={"max_restarts": 2, "in_place": 1, "backoff": "1s"},
        health={"min_stall": "8s", "stall_factor": 10},
    )  # fmt: skip
    job_id = submit(spec, env)
    client = control_plane.client()
    run_dir = client.job(job_id)["run_dir"]
    deadline = time.monotonic() + 120
    while not any(m["step"] >= 12 for m in client.metrics(job_id)):
        assert time.monotonic() < deadline, client.events(job_id)
        time.sleep(0.3)
    hang_rank_1_and_see_it_restarted_in_place(client, job_id, run_dir, timeout=240)
    assert not processes_of(control_plane.home)


def hang_rank_1_and_see_it_restarted_in_place(
    client: Any, job_id: int, run_dir: str, *, timeout: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stop rank 1 (SIGSTOP: rank 0 waits for it in the all-reduce) and check the hang path
    with in-place restarts: detected within 60 s, the ranks asked where they wait (rank 0 from
    inside the all-reduce, rank 1 named as stopped), the workers killed once and restarted by
    torchrun in the same launch, the job succeeded. Returns the two attempts."""
    pid = find_rank(run_dir, 1)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()

    job = wait_for(client, job_id, TERMINAL, timeout=timeout)
    assert job["state"] == "SUCCEEDED", job["reason"]
    first, second = client.attempts(job_id)
    assert first["state"] == "failed" and first["reason"].startswith("hung: no step for")
    assert (second["state"], second["launch_attempt"]) == ("succeeded", 1)
    messages = [(e["ts"], e["message"]) for e in client.events(job_id)]
    killed = [ts for ts, m in messages if "for torchrun to restart them in place" in m]
    assert len(killed) == 1, messages
    detected_after = datetime.fromisoformat(killed[0]).timestamp() - stopped_at
    assert detected_after < 60  # the bound for detecting a hang
    assert sum("-> STARTING" in m for _, m in messages) == 1  # no new launch
    (where,) = [m for _, m in messages if "where the ranks are" in m]
    assert "rank 0 at train.py:" in where and "is stopped: SIGSTOP" in where, where
    return first, second
