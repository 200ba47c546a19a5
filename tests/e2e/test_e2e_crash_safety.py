"""Fault injection: SIGKILL the control plane at each point of the launch and finish paths
(crash points, `tensoryard.server.faults`) and at random moments during a storm of
submissions. Afterwards every accepted job has run exactly once per attempt, nothing runs that
the store does not know, and every job ends.

Each job appends one line per run to a ledger file (O_APPEND, atomic for short lines), so a
duplicated run shows as two lines for one (job, attempt).
"""

from __future__ import annotations

import collections
import random
import textwrap
import time
from pathlib import Path

import pytest

from tensoryard.client import Client
from tensoryard.errors import ClientError
from tests.e2e.conftest import ServerProcess, free_port, wait_for

pytestmark = pytest.mark.slow

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}

JOB_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    line = f"{os.environ['TYARD_JOB_ID']} {os.environ['TYARD_ATTEMPT']} {os.getpid()}\\n"
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, line.encode())
    os.close(fd)
    time.sleep(float(sys.argv[1]))
    """
)


@pytest.fixture
def plane(tmp_path: Path) -> ServerProcess:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "job.py").write_text(JOB_SCRIPT)
    return ServerProcess(home=home, port=free_port(), extra_args=["--cpu-slots", "4"])


def job_spec(tmp_path: Path, name: str, seconds: float, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "launcher": "python",
        "command": ["job.py", str(seconds)],
        "workdir": str(tmp_path),
        "env": {"LEDGER": str(tmp_path / "ledger.txt")},
        "resources": {"cpu": 1, "memory": "64Mi"},
        "restart": {"max_restarts": 3, "backoff": "0s"},
        **extra,
    }


def ledger(tmp_path: Path) -> collections.Counter[tuple[int, int]]:
    path = tmp_path / "ledger.txt"
    lines = path.read_text().split() if path.exists() else []
    runs = collections.Counter[tuple[int, int]]()
    for i in range(0, len(lines), 3):
        runs[(int(lines[i]), int(lines[i + 1]))] += 1
    return runs


def wait_killed(server: ServerProcess, timeout: float = 60) -> None:
    assert server.proc is not None
    try:
        code = server.proc.wait(timeout)
    except Exception as exc:  # pragma: no cover - a crash point that was never reached
        raise AssertionError("the control plane did not reach its crash point") from exc
    assert code == -9, f"expected SIGKILL at the crash point, got exit code {code}"


def assert_nothing_untracked(server: ServerProcess, client: Client) -> None:
    """Every job has ended, so no process of any attempt may still run."""
    from tests.e2e.test_e2e_jobs import processes_of

    deadline = time.monotonic() + 20
    while processes_of(server.home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(server.home), "processes of ended jobs still run"


@pytest.mark.parametrize(
    "point",
    [
        "schedule.after_admit",
        "launch.after_intent",
        "launch.after_start",
        "running.before_mark",
        "finish.before",
        "finish.after",
    ],
)
def test_a_crash_at_each_point_of_the_launch_and_finish_paths_runs_the_job_exactly_once(
    plane: ServerProcess, tmp_path: Path, point: str
) -> None:
    plane.env = {"TYARD_CRASH_AT": point}
    client = plane.start()
    spec = job_spec(tmp_path, "crash", 1.5)
    try:
        job_id: int | None = client.submit(spec, key="crash-test", retries=0)["id"]
    except ClientError as exc:
        # the control plane may die before it answers (it schedules while it responds)
        assert exc.status == 0, exc
        job_id = None
    wait_killed(plane)
    plane.env = {}
    client = plane.start()
    # repeating the submission with the same key never stores a second job
    again = client.submit(spec, key="crash-test")["id"]
    assert job_id in (None, again)
    job_id = again
    assert client.jobs()["total"] == 1
    job = wait_for(client, job_id, TERMINAL, timeout=120)
    events = [e["message"] for e in client.events(job_id)]
    assert job["state"] == "SUCCEEDED", (job["reason"], events)
    runs = ledger(tmp_path)
    assert runs == {(job_id, 1): 1}, f"runs per (job, attempt): {dict(runs)}; events: {events}"
    assert job["attempts"] == 1
    assert_nothing_untracked(plane, client)
    plane.stop()


def test_a_crash_right_after_signalling_a_preemption_victim_requeues_it_once(
    plane: ServerProcess, tmp_path: Path
) -> None:
    plane.env = {"TYARD_CRASH_AT": "preempt.after_signal"}
    client = plane.start()
    low = client.submit(job_spec(tmp_path, "low", 8, resources={"cpu": 4, "memory": "64Mi"}))
    wait_for(client, low["id"], {"RUNNING"}, timeout=60)
    high = job_spec(tmp_path, "high", 0.5, priority=10, resources={"cpu": 4, "memory": "64Mi"})
    high_id = client.submit(high)["id"]
    wait_killed(plane)
    plane.env = {}
    client = plane.start()
    done = [wait_for(client, j, TERMINAL, timeout=120) for j in (low["id"], high_id)]
    assert [j["state"] for j in done] == ["SUCCEEDED", "SUCCEEDED"]
    runs = ledger(tmp_path)
    assert all(n == 1 for n in runs.values()), dict(runs)
    assert (low["id"], 1) in runs and (high_id, 1) in runs
    assert_nothing_untracked(plane, client)
    plane.stop()


def test_a_storm_of_submissions_with_the_control_plane_sigkilled_at_random_runs_each_once(
    plane: ServerProcess, tmp_path: Path
) -> None:
    rng = random.Random(7)
    client = plane.start()
    accepted: list[int] = []
    kills = 0
    for round_ in range(4):
        for i in range(10):
            spec = job_spec(tmp_path, f"storm-{round_}-{i}", rng.uniform(0.2, 1.0))
            accepted.append(client.submit(spec)["id"])
            time.sleep(rng.uniform(0.0, 0.15))
        time.sleep(rng.uniform(0.5, 3.0))
        plane.kill()
        kills += 1
        client = plane.start()
    jobs = [wait_for(client, j, TERMINAL, timeout=240) for j in accepted]
    states = collections.Counter(j["state"] for j in jobs)
    runs = ledger(tmp_path)
    duplicated = {k: n for k, n in runs.items() if n > 1}
    print(
        f"storm: {len(accepted)} jobs accepted, {kills} SIGKILLs, states {dict(states)}, "
        f"{sum(runs.values())} runs, {len(duplicated)} duplicated"
    )
    assert states == {"SUCCEEDED": len(accepted)}
    assert not duplicated, f"attempts that ran twice: {duplicated}"
    for job in jobs:
        attempts = client.attempts(job["id"])
        ran = {a for (j, a) in runs if j == job["id"]}
        succeeded = [a["number"] for a in attempts if a["state"] == "succeeded"]
        assert len(succeeded) == 1 and succeeded[0] in ran, (job["id"], attempts, ran)
    assert_nothing_untracked(plane, client)
    plane.stop()
