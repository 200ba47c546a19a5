"""Process bookkeeping for local jobs: identity across pid reuse, finding and stopping them.

A process is identified by (pid, create_time): a pid alone can be reused by an unrelated
process after the original exits. Every process of an attempt carries the environment variable
``TYARD_ATTEMPT_KEY`` (inherited by all descendants), which lets us find leftovers even when
their supervisor is gone and they were re-parented to init.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterable

import psutil

from tensoryard import envvars

__all__ = [
    "ATTEMPT_KEY_ENV",
    "become_subreaper",
    "create_time",
    "descendants",
    "is_alive",
    "kill_all",
    "marked_processes",
    "signal_groups",
]

ATTEMPT_KEY_ENV = envvars.ATTEMPT_KEY.name
_CREATE_TIME_TOLERANCE_S = 0.05
_PR_SET_CHILD_SUBREAPER = 36


def create_time(pid: int) -> float:
    """The kernel's start time of `pid` (seconds since the epoch); raises psutil errors."""
    return float(psutil.Process(pid).create_time())


def is_alive(pid: int, started: float) -> bool:
    """True when `pid` runs and is the same process that started at `started` (no pid reuse).

    A zombie counts as dead; it is reaped here when it is our own child.
    """
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started) > _CREATE_TIME_TOLERANCE_S:
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
            return False
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def marked_processes(key: str, *, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Live processes whose environment has TYARD_ATTEMPT_KEY == key (ours to read only)."""
    skip = {os.getpid(), *exclude}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in skip:
            continue
        try:
            if proc.environ().get(ATTEMPT_KEY_ENV) == key and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """All live descendants of `pid` (default: this process)."""
    try:
        procs = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in procs if _running(p)]


def signal_groups(procs: Iterable[psutil.Process], sig: signal.Signals) -> int:
    """Send `sig` once to each process group among `procs` (never our own group).

    Processes in our own group are signalled one by one. Returns how many were signalled.
    """
    own_group = os.getpgrp()
    groups: set[int] = set()
    count = 0
    for proc in procs:
        try:
            pgid = os.getpgid(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
        try:
            if pgid == own_group:
                proc.send_signal(sig)
            elif pgid not in groups:
                os.killpg(pgid, sig)
                groups.add(pgid)
            count += 1
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return count


def kill_all(procs: list[psutil.Process], *, term_grace_s: float = 0.0) -> int:
    """Stop `procs`: SIGTERM first when `term_grace_s` > 0, then SIGKILL what is left.

    Waits until they are gone (reaping our own children). Returns how many were running.
    """
    procs = [p for p in procs if _running(p)]
    running = len(procs)
    if not procs:
        return 0
    if term_grace_s > 0:
        signal_groups(procs, signal.SIGTERM)
        _, procs = psutil.wait_procs(procs, timeout=term_grace_s)
    deadline = time.monotonic() + 10.0
    alive = procs
    while alive and time.monotonic() < deadline:
        signal_groups(alive, signal.SIGKILL)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _, alive = psutil.wait_procs(alive, timeout=1.0)
    return running


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux PR_SET_CHILD_SUBREAPER), so none escape us."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
