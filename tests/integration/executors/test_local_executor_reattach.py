"""Control-plane restarts: the job outlives its launcher, reattach finds it or says LOST."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
from localexec_helpers import Launch, read_pids, wait_for

from tensoryard.executors.base import AttemptPhase
from tensoryard.executors.local import LocalExecutor, LocalHandle
from tensoryard.executors.local.procs import create_time, kill_all, marked_processes

# A stand-in for the control plane: launches a job, prints the handle, then waits to be killed.
CONTROL_PLANE = """
import json, sys, time
from pathlib import Path
from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.local import LocalExecutor
from tensoryard.spec.job import parse_job_spec

work = Path(sys.argv[1])
spec = parse_job_spec({
    "name": "survivor", "launcher": "python", "command": ["job.py"], "workdir": str(work),
    "env": {"WORK": str(work)},
})
handle = LocalExecutor().launch(LaunchRequest("9", 1, spec, work / "run"))
print(json.dumps(handle), flush=True)
time.sleep(120)
"""

JOB_WAITS_FOR_GO = """
import os, pathlib, time
work = pathlib.Path(os.environ["WORK"])
(work / "pid").write_text(str(os.getpid()))
while not (work / "go").exists():
    time.sleep(0.05)
print("finished after the control plane died", flush=True)
"""


def test_a_job_survives_the_sigkill_of_its_control_plane_and_is_reattached(
    tmp_path: Path,
) -> None:
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB_WAITS_FOR_GO))
    plane = subprocess.Popen(
        [sys.executable, "-c", CONTROL_PLANE, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert plane.stdout is not None
        handle = json.loads(plane.stdout.readline())
        wait_for(lambda: (tmp_path / "pid").exists(), 30, "the job to start")
        plane.kill()  # SIGKILL: no cleanup code of the control plane runs
        plane.wait()
        shim = psutil.Process(handle["shim_pid"])
        assert shim.is_running() and shim.ppid() != plane.pid

        restarted = LocalExecutor()  # a fresh control plane with only the stored handle
        assert restarted.reattach(handle).phase == AttemptPhase.RUNNING
        (tmp_path / "go").touch()
        status = restarted.wait(handle, timeout_s=30)
        assert status.phase == AttemptPhase.SUCCEEDED
        assert "finished after the control plane died" in restarted.log_paths(handle)[0].read_text()
        assert (Path(handle["attempt_dir"]) / "exit.json").exists()
        assert restarted.reattach(handle).phase == AttemptPhase.SUCCEEDED
    finally:
        plane.kill()
        plane.wait()
        (tmp_path / "go").touch()


def test_reattach_reports_lost_and_kills_the_workers_when_the_shim_died(
    executor: LocalExecutor, launch: Launch, tmp_path: Path
) -> None:
    handle = launch(
        """
        import os, pathlib, time
        pathlib.Path(os.environ["WORK"], "pid").write_text(str(os.getpid()))
        time.sleep(60)
        """
    )
    wait_for(lambda: (tmp_path / "pid").exists(), 30, "the job to start")
    worker = read_pids(tmp_path / "pid")[0]
    shim = psutil.Process(handle["shim_pid"])
    os.kill(shim.pid, signal.SIGKILL)  # the supervisor dies, the worker lives on
    shim.wait(timeout=10)
    assert psutil.pid_exists(worker)

    status = LocalExecutor().reattach(handle)
    assert status.phase == AttemptPhase.LOST
    assert f"the job supervisor (pid {handle['shim_pid']}) is gone" in status.reason
    assert "killed 1 leftover process(es)" in status.reason
    assert not psutil.pid_exists(worker)
    assert not marked_processes(LocalHandle.from_dict(handle).attempt_key)


def test_a_reused_pid_is_not_mistaken_for_the_shim(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "attempt-1").mkdir()
        handle = LocalHandle(
            job_id="5",
            attempt=1,
            attempt_dir=str(tmp_path / "attempt-1"),
            launcher="python",
            world_size=1,
            shim_pid=stranger.pid,
            shim_create_time=create_time(stranger.pid),
            attempt_key="5-1-test",
        )
        executor = LocalExecutor()
        # Same pid and create time: that is our shim (still starting: no shim.json yet).
        assert executor.reattach(handle.to_dict()).phase == AttemptPhase.STARTING

        # Same pid, different create time: the pid was reused by an unrelated process.
        reused = {**handle.to_dict(), "shim_create_time": handle.shim_create_time - 100.0}
        status = executor.reattach(reused)
        assert status.phase == AttemptPhase.LOST
        executor.cancel(reused, grace_s=0)
        assert stranger.poll() is None  # the stranger was neither signalled nor killed
    finally:
        kill_all([psutil.Process(stranger.pid)])
        stranger.wait()
