"""Stack dumps of a hung attempt (tensoryard.runtime.stacks + LocalExecutor.dump_stacks) with
real processes: a rank blocked in a wait answers SIGUSR2 with its threads' stacks, written by
faulthandler while its main thread stays blocked; a process that never enabled dumps is not
signalled (SIGUSR2 would kill it); a stopped one is named as not answering."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensoryard.executors.local.executor import LocalExecutor, LocalHandle
from tensoryard.executors.local.procs import ATTEMPT_KEY_ENV
from tensoryard.runtime.stacks import STACKS_ENV, main_thread_frames, summarize

BLOCKED = """\
import sys, threading, time
from tensoryard.runtime.stacks import enable

def wait_for_peers(event):
    event.wait()  # stands in for a collective that never completes

def train_step(event):
    wait_for_peers(event)

if sys.argv[1] == "enable":
    enable(int(sys.argv[2]))
threading.Thread(target=time.sleep, args=(3600,), name="loader", daemon=True).start()
print("ready", flush=True)
train_step(threading.Event())
"""


@pytest.fixture
def attempt(tmp_path: Path) -> Iterator[tuple[Path, str, list[subprocess.Popen[str]]]]:
    procs: list[subprocess.Popen[str]] = []
    yield tmp_path, f"test-{uuid.uuid4().hex[:8]}", procs
    for proc in procs:
        proc.kill()
        proc.wait()


def start(script: Path, directory: Path, key: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, STACKS_ENV: str(directory), ATTEMPT_KEY_ENV: key}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def handle(directory: Path, key: str) -> dict[str, object]:
    return LocalHandle("1", 1, str(directory), "torchrun", 3, 1, 0.0, key).to_dict()


def test_each_rank_tells_where_it_waits_and_the_others_are_left_alone(
    attempt: tuple[Path, str, list[subprocess.Popen[str]]],
) -> None:
    directory, key, procs = attempt
    script = directory / "blocked.py"
    script.write_text(BLOCKED)
    procs.append(start(script, directory, key, "enable", "0"))
    procs.append(start(script, directory, key, "enable", "1"))
    procs.append(start(script, directory, key, "plain", "2"))  # no handler: never signalled
    os.kill(procs[1].pid, signal.SIGSTOP)  # a stopped rank cannot answer

    executor = LocalExecutor.__new__(LocalExecutor)
    started = time.monotonic()
    texts = executor.dump_stacks(handle(directory, key), wait_s=1.0)
    assert time.monotonic() - started < 5
    assert set(texts) == {0, 1}  # rank 2 never enabled dumps
    assert texts[1] is None
    rank0 = texts[0]
    assert rank0 is not None
    frames = main_thread_frames(rank0)
    assert [f.function for f in frames][-3:] == ["wait_for_peers", "train_step", "<module>"]
    line = summarize(0, rank0)
    assert line.startswith("rank 0 at blocked.py:5 in wait_for_peers, waiting in wait")
    assert "threading.py" in line
    assert summarize(1, None).startswith("rank 1: no stack dump")

    for proc in (procs[0], procs[2]):  # both still blocked, alive: nobody was killed
        assert proc.poll() is None
    os.kill(procs[1].pid, signal.SIGCONT)

    # A second hang in the same attempt: only what the new dump wrote is read.
    again = executor.dump_stacks(handle(directory, key), wait_s=1.0)
    again0, again1 = again[0], again[1]
    assert again0 is not None and again0.count("most recent call first") == rank0.count(
        "most recent call first"
    )
    assert again1 is not None and "wait_for_peers" in again1  # answered once continued


def test_no_dumps_when_no_rank_enabled_them(
    attempt: tuple[Path, str, list[subprocess.Popen[str]]],
) -> None:
    directory, key, procs = attempt
    script = directory / "blocked.py"
    script.write_text(BLOCKED)
    procs.append(start(script, directory, key, "plain", "0"))
    executor = LocalExecutor.__new__(LocalExecutor)
    assert executor.dump_stacks(handle(directory, key), wait_s=0.5) == {}
    assert procs[0].poll() is None
