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


class Attempt:
    """An attempt directory and key, and the blocked processes started in it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = f"test-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen[str]] = []
        self.script = directory / "blocked.py"
        self.script.write_text(BLOCKED)

    def start(self, *args: str) -> subprocess.Popen[str]:
        env = {**os.environ, STACKS_ENV: str(self.directory), ATTEMPT_KEY_ENV: self.key}
        proc = subprocess.Popen(
            [sys.executable, str(self.script), *args], env=env, stdout=subprocess.PIPE, text=True
        )
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    def dump(self, wait_s: float) -> dict[int, str | None]:
        handle = LocalHandle("1", 1, str(self.directory), "torchrun", 3, 1, 0.0, self.key)
        return LocalExecutor.__new__(LocalExecutor).dump_stacks(handle.to_dict(), wait_s=wait_s)


@pytest.fixture
def attempt(tmp_path: Path) -> Iterator[Attempt]:
    made = Attempt(tmp_path)
    yield made
    for proc in made.procs:
        proc.kill()
        proc.wait()


def test_each_rank_tells_where_it_waits_and_the_others_are_left_alone(attempt: Attempt) -> None:
    rank0 = attempt.start("enable", "0")
    rank1 = attempt.start("enable", "1")
    plain = attempt.start("plain", "2")  # no handler: never signalled
    os.kill(rank1.pid, signal.SIGSTOP)  # a stopped rank cannot answer

    started = time.monotonic()
    texts = attempt.dump(wait_s=1.0)
    assert time.monotonic() - started < 1.0  # nobody to wait for: the stopped one cannot answer
    assert set(texts) == {0, 1}  # rank 2 never enabled dumps
    assert (
        summarize(1, texts[1]) == f"rank 1: process {rank1.pid} is stopped: SIGSTOP or a debugger"
    )
    first = texts[0]
    assert first is not None
    frames = main_thread_frames(first)
    assert [f.function for f in frames][-3:] == ["wait_for_peers", "train_step", "<module>"]
    line = summarize(0, first)
    assert line.startswith("rank 0 at blocked.py:5 in wait_for_peers, waiting in wait")
    assert "threading.py" in line
    assert summarize(1, None).startswith("rank 1: no stack dump")

    for proc in (rank0, plain):  # both still blocked, alive: nobody was killed
        assert proc.poll() is None
    os.kill(rank1.pid, signal.SIGCONT)

    # A second hang in the same attempt: only what the new dump wrote is read.
    again = attempt.dump(wait_s=1.0)
    again0, again1 = again[0], again[1]
    threads = "most recent call first"
    assert again0 is not None and again0.count(threads) == first.count(threads)
    assert again1 is not None and "wait_for_peers" in again1  # answered once continued


def test_no_dumps_when_no_rank_enabled_them(attempt: Attempt) -> None:
    plain = attempt.start("plain", "0")
    assert attempt.dump(wait_s=0.5) == {}
    assert plain.poll() is None
