"""Fault injection on this machine: kill, stop (hang) or slow one rank of a job.

The ranks of a job are found by their environment in ``/proc/<pid>/environ``: a training worker
has ``TYARD_RUN_DIR`` (the job's own directory, unique per control plane: job ids are not, two
control planes on one machine both have a job 1) and ``RANK`` (set by torchrun for its workers,
not for torchrun itself). Matching is always by run directory, never by job id alone. When
several attempts' processes are alive, the newest attempt's wins.

    kill    SIGKILL the rank (a crash)
    stop    SIGSTOP it for `duration` then SIGCONT (None: leave it stopped: a hang)
    slow    for `duration`, stop it for (1 - speed) of every 100 ms (a straggler)
    cut     cut the rank's node off the network for `duration` (None: until restored by hand):
            only for network-namespace nodes (`tyard server --node-netns`): the rank's
            TYARD_NODE names its namespace, whose eth0 goes down

`run_schedule` repeats one action every `every` seconds, `count` times, looking the rank up
again each time (after a restart it is a new process).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from tensoryard import envvars

__all__ = ["Action", "ChaosRecord", "find_rank", "inject", "run_schedule"]

Action = Literal["kill", "stop", "slow", "cut"]
ACTIONS: tuple[Action, ...] = ("kill", "stop", "slow", "cut")
_SLOW_PERIOD_S = 0.1


@dataclass(frozen=True)
class ChaosRecord:
    """One injection: when, what, to which process, and what happened."""

    at: float  # Unix time the signal was sent
    action: Action
    run_dir: str  # the job's TYARD_RUN_DIR
    rank: int
    pid: int | None
    ok: bool
    note: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _environ(path: Path) -> dict[str, str]:
    try:
        raw = path.read_bytes()
    except OSError:  # gone, or another user's process
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _candidates(run_dir: str, rank: int, proc: Path) -> Iterator[tuple[int, int]]:
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        env = _environ(entry / "environ")
        if run_dir and envvars.RUN_DIR.get(env) == run_dir and env.get("RANK") == str(rank):
            attempt = env.get(envvars.ATTEMPT.name, "0")
            yield (int(attempt) if attempt.isdigit() else 0, int(entry.name))


def find_rank(run_dir: str, rank: int, *, proc: Path = Path("/proc")) -> int | None:
    """The pid of `rank` of the job whose TYARD_RUN_DIR is `run_dir` (newest attempt, then
    newest pid), or None."""
    found = sorted(_candidates(str(Path(run_dir)), rank, proc))
    return found[-1][1] if found else None


def inject(
    action: Action,
    pid: int,
    *,
    duration: float | None = None,
    speed: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    kill: Callable[[int, int], None] = os.kill,
) -> str:
    """Do `action` to `pid`; blocks for stop/slow/cut with a duration. Returns a note."""
    if action == "cut":
        return _cut(pid, duration, sleep)
    if action == "kill":
        kill(pid, signal.SIGKILL)
        return "killed"
    if action == "stop":
        kill(pid, signal.SIGSTOP)
        if duration is None:
            return "stopped (left stopped: a hang)"
        sleep(duration)
        kill(pid, signal.SIGCONT)
        return f"stopped for {duration:g}s"
    if not 0.0 < speed < 1.0:
        raise ValueError(f"speed={speed} must be between 0 and 1 (fix: e.g. 0.5 = half speed)")
    if duration is None or duration <= 0:
        raise ValueError("slow needs a positive duration (fix: pass --duration 30s)")
    periods = max(1, round(duration / _SLOW_PERIOD_S))
    for _ in range(periods):
        kill(pid, signal.SIGSTOP)
        sleep(_SLOW_PERIOD_S * (1.0 - speed))
        kill(pid, signal.SIGCONT)
        sleep(_SLOW_PERIOD_S * speed)
    return f"slowed to {speed:.0%} for {duration:g}s"


def _cut(pid: int, duration: float | None, sleep: Callable[[float], None]) -> str:
    from tensoryard.executors.local.netns import cut_netns, restore_netns

    node = _environ(Path(f"/proc/{pid}/environ")).get(envvars.NODE.name)
    if not node:
        raise ValueError(
            f"pid {pid} runs on no network-namespace node (no TYARD_NODE): cut needs "
            "`tyard server --local-nodes A,B --node-netns`"
        )
    cut_netns(f"tyard-{node}")
    if duration is None:
        fix = f"ip -n tyard-{node} link set eth0 up"
        return f"cut node {node} off the network (left cut: restore with `{fix}`)"
    sleep(duration)
    restore_netns(f"tyard-{node}")
    return f"cut node {node} off the network for {duration:g}s"


def run_schedule(
    run_dir: str,
    rank: int,
    action: Action,
    *,
    every: float,
    count: int,
    start_after: float = 0.0,
    duration: float | None = None,
    speed: float = 0.5,
    wait_for_rank: float = 60.0,
    proc: Path = Path("/proc"),
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    kill: Callable[[int, int], None] = os.kill,
    on_record: Callable[[ChaosRecord], None] | None = None,
) -> list[ChaosRecord]:
    """Inject `action` `count` times, `every` seconds apart (from the planned times)."""
    if action not in ACTIONS:
        raise ValueError(f"action={action!r} is not one of {', '.join(ACTIONS)}")
    records: list[ChaosRecord] = []
    planned = clock() + start_after
    for _ in range(count):
        delay = planned - clock()
        if delay > 0:
            sleep(delay)
        pid = _wait_for(run_dir, rank, wait_for_rank, proc, clock, sleep)
        if pid is None:
            note = f"no process of rank {rank} in {run_dir} within {wait_for_rank:g}s (skipped)"
            record = ChaosRecord(clock(), action, run_dir, rank, None, False, note)
        else:
            at = clock()
            try:
                note = inject(action, pid, duration=duration, speed=speed, sleep=sleep, kill=kill)
                record = ChaosRecord(at, action, run_dir, rank, pid, True, note)
            except ProcessLookupError:
                record = ChaosRecord(at, action, run_dir, rank, pid, False, "exited meanwhile")
        records.append(record)
        if on_record is not None:
            on_record(record)
        planned += every
    return records


def _wait_for(
    run_dir: str,
    rank: int,
    timeout: float,
    proc: Path,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> int | None:
    deadline = clock() + timeout
    while True:
        pid = find_rank(run_dir, rank, proc=proc)
        if pid is not None or clock() >= deadline:
            return pid
        sleep(0.2)
