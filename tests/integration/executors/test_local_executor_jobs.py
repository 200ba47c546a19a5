"""The local executor with real processes: python and torchrun jobs, failures, cancel."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from localexec_helpers import Launch, read_pids, wait_for

from tensoryard.executors.base import AttemptPhase
from tensoryard.executors.local import LocalExecutor, LocalHandle
from tensoryard.executors.local.layout import read_json
from tensoryard.executors.local.procs import marked_processes


def attempt_dir(handle: dict[str, Any]) -> Path:
    return Path(handle["attempt_dir"])


def no_process_left(handle: dict[str, Any], pids: Sequence[int] = ()) -> bool:
    key = LocalHandle.from_dict(handle).attempt_key
    return not marked_processes(key) and not any(psutil.pid_exists(p) for p in pids)


def test_a_python_job_succeeds_with_its_output_in_the_rank_log(
    executor: LocalExecutor, launch: Launch
) -> None:
    handle = launch(
        """
        import os
        print("job", os.environ["TYARD_JOB_ID"], "attempt", os.environ["TYARD_ATTEMPT"])
        print("cwd", os.getcwd() == os.environ["WORK"])
        """
    )
    status = executor.wait(handle, timeout_s=60)
    assert status.phase == AttemptPhase.SUCCEEDED and status.exit_code == 0
    log = executor.log_paths(handle)[0].read_text()
    assert "job 1 attempt 1" in log and "cwd True" in log
    record = read_json(attempt_dir(handle) / "exit.json")
    assert record is not None and record["exit_code"] == 0
    assert "supervising attempt" in executor.launcher_log_path(handle).read_text()


def test_a_python_job_that_exits_with_an_error_fails_naming_the_code(
    executor: LocalExecutor, launch: Launch
) -> None:
    handle = launch("import sys\nprint('about to fail')\nsys.exit(3)\n")
    status = executor.wait(handle, timeout_s=60)
    assert status.phase == AttemptPhase.FAILED
    assert (status.exit_code, status.failed_ranks) == (3, (0,))
    assert status.reason == "rank 0 exited with code 3"
    assert "about to fail" in executor.log_paths(handle)[0].read_text()


RANK_WAITS_FOR_GO = """
    import os, pathlib, time
    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    work = pathlib.Path(os.environ["WORK"])
    print(f"rank {rank} of {world} up")
    go = work / "go"
    deadline = time.time() + 60
    while not go.exists() and time.time() < deadline:
        time.sleep(0.05)
    print(f"rank {rank} done")
"""


def test_a_torchrun_job_writes_one_live_log_per_rank(
    executor: LocalExecutor, launch: Launch, tmp_path: Path
) -> None:
    handle = launch(RANK_WAITS_FOR_GO, launcher="torchrun", procs=2)
    logs = executor.log_paths(handle)
    assert sorted(logs) == [0, 1]

    def both_up() -> bool:
        return all(p.exists() and "up" in p.read_text() for p in logs.values())

    wait_for(both_up, 60, "both ranks to log 'up'")
    # The lines are in the files while the job still runs: logs are live, not copied at the end.
    assert executor.poll(handle).phase == AttemptPhase.RUNNING
    (tmp_path / "go").touch()
    status = executor.wait(handle, timeout_s=60)
    assert status.phase == AttemptPhase.SUCCEEDED, status.reason
    for rank, path in logs.items():
        text = path.read_text()
        assert f"rank {rank} of 2 up" in text and f"rank {rank} done" in text
        assert f"rank {1 - rank} " not in text  # each file holds its own rank only


RANK_SLEEPS = """
    import os, pathlib, signal, time
    if os.environ.get("IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    work = pathlib.Path(os.environ["WORK"])
    (work / f"pid-{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
    print("sleeping", flush=True)
    time.sleep(60)
"""


def test_a_rank_killed_by_sigkill_fails_the_attempt_naming_that_rank(
    executor: LocalExecutor, launch: Launch, tmp_path: Path
) -> None:
    handle = launch(RANK_SLEEPS, launcher="torchrun", procs=2)
    wait_for(lambda: all((tmp_path / f"pid-{r}").exists() for r in (0, 1)), 60, "both ranks")
    pids = read_pids(tmp_path / "pid-0") + read_pids(tmp_path / "pid-1")
    os.kill(pids[1], signal.SIGKILL)
    status = executor.wait(handle, timeout_s=60)
    assert status.phase == AttemptPhase.FAILED
    assert status.failed_ranks == (1,)
    assert status.exit_code == -9
    assert status.reason.startswith("rank 1 was killed by SIGKILL (exit -9)")
    assert "rank 0 stopped after that" in status.reason
    assert no_process_left(handle, pids)


def test_cancel_stops_a_job_gracefully_and_leaves_no_process_of_its_group(
    executor: LocalExecutor, launch: Launch, tmp_path: Path
) -> None:
    handle = launch(
        """
        import os, pathlib, signal, subprocess, sys, time
        work = pathlib.Path(os.environ["WORK"])
        helper = subprocess.Popen(["sleep", "60"])  # same process group as the job
        (work / "pids").write_text(f"{os.getpid()} {helper.pid}")
        def stop(signum, frame):
            print("got SIGTERM, saving and exiting", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        time.sleep(60)
        """
    )
    wait_for(lambda: (tmp_path / "pids").exists(), 30, "the job to start")
    pids = read_pids(tmp_path / "pids")
    started = time.monotonic()
    executor.cancel(handle, grace_s=20)
    executor.cancel(handle, grace_s=20)  # idempotent
    assert time.monotonic() - started < 1.0  # cancel returns at once
    status = executor.wait(handle, timeout_s=30)
    assert status.phase == AttemptPhase.CANCELLED
    assert status.reason == "cancelled on request"  # no SIGKILL was needed
    assert time.monotonic() - started < 15  # far below the 20 s grace
    assert "got SIGTERM" in executor.log_paths(handle)[0].read_text()
    assert no_process_left(handle, pids)
    executor.cancel(handle, grace_s=20)  # cancelling a finished attempt is a no-op
    assert executor.poll(handle).phase == AttemptPhase.CANCELLED


def test_cancel_kills_torchrun_ranks_that_ignore_sigterm_after_the_grace(
    executor: LocalExecutor, launch: Launch, tmp_path: Path
) -> None:
    handle = launch(RANK_SLEEPS, launcher="torchrun", procs=2, env={"IGNORE_SIGTERM": "1"})
    wait_for(lambda: all((tmp_path / f"pid-{r}").exists() for r in (0, 1)), 60, "both ranks")
    pids = read_pids(tmp_path / "pid-0") + read_pids(tmp_path / "pid-1")
    started = time.monotonic()
    executor.cancel(handle, grace_s=1.0)
    status = executor.wait(handle, timeout_s=30)
    elapsed = time.monotonic() - started
    assert status.phase == AttemptPhase.CANCELLED
    assert "forced with SIGKILL" in status.reason
    assert 1.0 <= elapsed < 20
    assert no_process_left(handle, pids)
    assert "grace period over: SIGKILL" in executor.launcher_log_path(handle).read_text()
