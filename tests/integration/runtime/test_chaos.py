"""`tyard chaos` and tensoryard.executors.chaos against real processes: a rank is found by its
run directory and RANK, killed, stopped (and resumed) and slowed; a process of another run with
the same job id is never touched; the CLI prints JSON for scripts."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app
from tensoryard.executors.chaos import find_rank, inject, run_schedule


def spawn(run_dir: str, rank: int, attempt: int = 1) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TYARD_JOB_ID": "1",  # as in every other control plane's first job
        "TYARD_RUN_DIR": run_dir,
        "RANK": str(rank),
        "TYARD_ATTEMPT": str(attempt),
    }
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield str(tmp_path / f"run-{secrets.token_hex(4)}"), procs
    for proc in procs:
        proc.kill()
        proc.wait()


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def wait_state(pid: int, wanted: str) -> str:
    deadline = time.monotonic() + 5
    while state(pid) != wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    return state(pid)


def test_the_rank_of_the_newest_attempt_is_found_and_killed(
    job: tuple[str, list[subprocess.Popen[bytes]]],
) -> None:
    name, procs = job
    procs += [spawn(name, 0), spawn(name, 1, attempt=1), spawn(name, 1, attempt=2)]
    time.sleep(0.2)  # the environment is readable once exec'd
    assert find_rank(name, 1) == procs[2].pid
    assert find_rank(name, 7) is None
    assert find_rank(name + "-other", 1) is None
    inject("kill", procs[2].pid)
    assert procs[2].wait(timeout=5) == -9
    assert procs[0].poll() is None and procs[1].poll() is None


def test_stop_with_a_duration_resumes_and_without_one_leaves_a_hang(
    job: tuple[str, list[subprocess.Popen[bytes]]],
) -> None:
    name, procs = job
    procs.append(spawn(name, 1))
    pid = procs[0].pid
    time.sleep(0.2)
    seen: list[str] = []
    inject("stop", pid, duration=0.3, sleep=lambda s: seen.append(wait_state(pid, "T")))
    assert seen == ["T"] and wait_state(pid, "S") == "S"
    assert "a hang" in inject("stop", pid)
    assert wait_state(pid, "T") == "T"


def test_slow_alternates_stop_and_continue_for_its_duration(
    job: tuple[str, list[subprocess.Popen[bytes]]],
) -> None:
    name, procs = job
    procs.append(spawn(name, 1))
    time.sleep(0.2)
    started = time.monotonic()
    note = inject("slow", procs[0].pid, duration=0.5, speed=0.5)
    assert 0.4 < time.monotonic() - started < 3 and "50%" in note
    assert wait_state(procs[0].pid, "S") == "S"  # left running
    with pytest.raises(ValueError, match="between 0 and 1"):
        inject("slow", procs[0].pid, duration=1, speed=1.5)


def test_a_schedule_finds_the_restarted_rank_each_time_and_skips_when_none(
    job: tuple[str, list[subprocess.Popen[bytes]]],
) -> None:
    name, procs = job
    procs.append(spawn(name, 1, attempt=1))
    time.sleep(0.2)

    def restart_after_kill(seconds: float) -> None:
        for proc in procs:
            proc.poll()  # reap what was killed, so /proc no longer shows it
        if procs[-1].returncode is not None and len(procs) == 1:
            procs.append(spawn(name, 1, attempt=2))  # what the control plane would do
            time.sleep(0.2)
        time.sleep(min(seconds, 0.05))

    records = run_schedule(
        name, 1, "kill", every=0.5, count=3, wait_for_rank=1.0, sleep=restart_after_kill
    )
    assert [r.ok for r in records] == [True, True, False]
    assert [r.pid for r in records[:2]] == [procs[0].pid, procs[1].pid]
    assert "no process of rank 1" in records[2].note


def test_a_process_of_another_run_with_the_same_job_id_and_rank_is_never_touched(
    job: tuple[str, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    name, procs = job
    procs.append(spawn(str(tmp_path / "someone-else"), 1, attempt=9))
    time.sleep(0.2)
    records = run_schedule(name, 1, "kill", every=0, count=1, wait_for_rank=0.3)
    assert not records[0].ok and procs[0].poll() is None


def test_the_cli_kills_a_rank_and_prints_json(
    job: tuple[str, list[subprocess.Popen[bytes]]],
) -> None:
    name, procs = job
    procs.append(spawn(name, 1))
    time.sleep(0.2)
    result = CliRunner().invoke(app, ["chaos", "--run-dir", name, "--rank", "1", "--json"])
    assert result.exit_code == 0, result.output
    (record,) = json.loads(result.output)
    assert record["pid"] == procs[0].pid and record["ok"] and record["action"] == "kill"
    assert procs[0].wait(timeout=5) == -9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-dir", "/nowhere", "--action", "explode"], "not one of kill, stop, slow"),
        (["--run-dir", "/nowhere", "--action", "slow"], "needs --duration"),
        (["--run-dir", "/nowhere", "--every", "soon"], "--every"),
        (["7", "--run-dir", "/nowhere"], "either a job id or --run-dir"),
        ([], "either a job id or --run-dir"),
    ],
    ids=[
        "an unknown action",
        "slow without a duration",
        "a bad duration",
        "both targets",
        "no target",
    ],
)
def test_bad_options_get_a_clear_error(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["chaos", *args])
    assert result.exit_code == 2 and message in result.output
