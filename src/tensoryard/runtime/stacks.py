"""Where each rank is stuck when the control plane calls an attempt hung.

A hung gang waits in a collective; killing it loses the answer to "where?". Before it acts on a
hang, the control plane asks the executor to signal every rank that enabled stack dumps
(SIGUSR2); each writes the Python stacks of all its threads, from the signal handler itself
(`faulthandler`: C code, no GIL needed, so it works while the main thread is blocked inside
a collective), to ``TYARD_STACKS_DIR/rank-R.stacks.txt``. `summarize` turns a dump into one
line for the job's events: the rank's innermost frame in the job's own code and the call it
waits in (``rank 0 at train.py:245 in train_step, waiting in all_reduce
(distributed_c10d.py:2810)``). A rank that does not answer (a stopped process) is named as
such.

A process may receive SIGUSR2 only after it enabled the dumps (the default action of SIGUSR2
is to terminate): `enable` writes ``rank-R.stacks.pid`` after registering the handler, and the
executor signals only the processes named there that still carry the attempt's key.

For NCCL jobs, PyTorch's flight recorder (``TORCH_NCCL_DUMP_ON_TIMEOUT``, set for every launch)
dumps the collective trace on the watchdog's timeout; these stacks add the Python side and
work for gloo too. Standard library only.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tensoryard import envvars

__all__ = ["STACKS_ENV", "Frame", "enable", "main_thread_frames", "summarize"]

STACKS_ENV = envvars.STACKS_DIR.name
SIGNAL = signal.SIGUSR2

_enabled: IO[str] | None = None  # kept open for the process's life: the handler writes to it


def enable(rank: int, env: Mapping[str, str] | None = None) -> Path | None:
    """Dump all threads' stacks to ``$TYARD_STACKS_DIR/rank-R.stacks.txt`` on SIGUSR2; the
    file's path, or None when the executor asked for no dumps (or the directory is gone)."""
    global _enabled
    env = os.environ if env is None else env
    where = env.get(STACKS_ENV)
    if not where:
        return None
    directory = Path(where)
    path = directory / f"rank-{rank}.stacks.txt"
    try:
        out = path.open("a", encoding="utf-8")
    except OSError:
        return None
    faulthandler.register(SIGNAL, file=out, all_threads=True, chain=False)
    if _enabled is not None:
        _enabled.close()
    _enabled = out
    pid_file = directory / f"rank-{rank}.stacks.pid"
    tmp = pid_file.with_name(f".{pid_file.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        tmp.write_text(str(os.getpid()), encoding="utf-8")
        os.replace(tmp, pid_file)  # only now may the executor signal this process
    return path


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"

    @property
    def in_library(self) -> bool:
        """Not the job's own code: an installed package, the standard library, or tensoryard
        itself (its runtime's collectives are where a rank waits, not why)."""
        if self.file.startswith(_TENSORYARD):
            return True
        parts = Path(self.file).parts
        return (
            "site-packages" in parts
            or "dist-packages" in parts
            or any(re.fullmatch(r"python3\.\d+", p) for p in parts)
            or self.file.startswith("<")
        )


_TENSORYARD = str(Path(__file__).resolve().parents[1]) + os.sep  # the package's directory

_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def _threads(text: str) -> list[list[Frame]]:
    """The thread stacks in one dump (the executor passes only what this dump appended),
    innermost frame first."""
    threads: list[list[Frame]] = []
    current: list[Frame] | None = None
    for line in text.splitlines():
        if _THREAD.match(line.strip()):
            current = []
            threads.append(current)
            continue
        frame = _FRAME.match(line)
        if frame is not None and current is not None:
            current.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3).strip()))
    return threads


def main_thread_frames(text: str) -> list[Frame]:
    """The main thread of a dump: the stack whose outermost frame is a ``<module>`` (the
    script), innermost first; [] when none is found."""
    mains = [t for t in _threads(text) if t and t[-1].function == "<module>"]
    return mains[-1] if mains else []


def summarize(rank: int, text: str | None) -> str:
    """One line: where the rank's main thread is, in the job's code and in the library."""
    if text is None:
        return f"rank {rank}: no stack dump (the process did not answer: stopped or gone)"
    frames = main_thread_frames(text)
    if not frames:
        if text.startswith("("):  # the executor's note: e.g. the process is stopped
            return f"rank {rank}: {text.strip('()')}"
        return f"rank {rank}: no main-thread stack in its dump"
    own = next((f for f in frames if not f.in_library), None)
    inner = frames[0]
    if own is None:
        return f"rank {rank} in {inner.function} ({inner.where})"
    if own is inner:
        return f"rank {rank} at {own.where} in {own.function}"
    return (
        f"rank {rank} at {own.where} in {own.function}, waiting in {inner.function} ({inner.where})"
    )
