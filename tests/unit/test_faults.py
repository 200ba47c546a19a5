"""Crash points (tensoryard.faults): a named point ends the process there, abruptly; as PID 1 of
a container too, where the kernel ignores the SIGKILL a process sends itself."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = (
    "from tensoryard.faults import crashpoint\n"
    "crashpoint('finish.before')\n"
    "print('passed the first', flush=True)\n"
    "crashpoint('finish.before')\n"
    "print('ran on', flush=True)\n"
)


def run(*prefix: str, point: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT],
        env={**os.environ, "TYARD_CRASH_AT": point, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_nth_pass_of_a_point_sigkills_the_process() -> None:
    done = run(point="finish.before:2")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "passed the first\n"


def test_an_unknown_point_is_refused_naming_the_known_ones() -> None:
    done = run(point="no.such.point")
    assert done.returncode == 1
    assert "unknown crash point; known: launch.after_intent" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root")
def test_as_pid_1_of_a_pid_namespace_it_still_ends_with_the_status_of_a_sigkill() -> None:
    done = run("unshare", "--pid", "--fork", point="finish.before:2")
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    assert done.stdout == "passed the first\n"


def test_with_a_once_file_a_restarted_process_runs_past_the_point(tmp_path: Path) -> None:
    marker = tmp_path / "crashed"
    first = run(point="finish.before", TYARD_CRASH_ONCE=str(marker))
    assert first.returncode == -signal.SIGKILL and first.stdout == ""
    assert marker.exists()
    again = run(point="finish.before", TYARD_CRASH_ONCE=str(marker))  # as a container restarted
    assert again.returncode == 0
    assert again.stdout == "passed the first\nran on\n"
