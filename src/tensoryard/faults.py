"""Crash points for fault-injection tests: ``crashpoint("launch.after_intent")``.

Off unless the environment variable ``TYARD_CRASH_AT`` names a point when the process starts
(``NAME`` crashes at the first pass, ``NAME:N`` at the N-th). The process then SIGKILLs itself
at that exact place, as a power cut or the OOM killer would, so tests can prove that a restart
repairs whatever state the crash left. With ``TYARD_CRASH_SIGNAL=SIGSTOP`` it stops itself
there instead (a long GC pause, a frozen VM), for the test to resume with SIGCONT. A container
restarted by its kubelet keeps its environment and would crash again at the same point: with
``TYARD_CRASH_ONCE=PATH`` the crash happens only while PATH does not exist (it is created just
before), so the restarted process runs on. Production
never sets the variables; a disabled point costs one global lookup. A leaf module (stdlib
only): the store's transactions have points too.
"""

from __future__ import annotations

import os
import signal
import threading

from tensoryard import envvars

__all__ = ["CRASH_ENV", "ONCE_ENV", "POINTS", "SIGNAL_ENV", "crashpoint"]

CRASH_ENV = envvars.CRASH_AT.name
SIGNAL_ENV = envvars.CRASH_SIGNAL.name
ONCE_ENV = envvars.CRASH_ONCE.name

POINTS = (
    "launch.after_intent",  # attempt recorded, job STARTING, nothing launched yet
    "launch.after_start",  # executor launched it, the store does not know yet
    "running.before_mark",  # workers are up, the store still says STARTING
    "finish.before",  # the attempt ended, nothing recorded yet
    "finish.after",  # attempt end and job move committed, token not yet revoked
    "finish.locked",  # inside the finishing transaction: the job row locked, nothing committed
    "preempt.after_signal",  # victim signalled, its reason recorded
    "schedule.after_admit",  # a job admitted, not yet launched
    "retention.after_rows",  # checkpoint rows retired with removal intents, directories still there
)

_target: tuple[str, int] | None = None
_hits: dict[str, int] = {}
_lock = threading.Lock()


def _parse(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    name, _, count = value.partition(":")
    if name not in POINTS:
        raise ValueError(f"{CRASH_ENV}={value!r}: unknown crash point; known: {', '.join(POINTS)}")
    return name, int(count or 1)


_target = _parse(envvars.CRASH_AT.get())
_signal = signal.Signals[envvars.CRASH_SIGNAL.value()]


def crashpoint(name: str) -> None:
    """SIGKILL this process here when the test setting names this point (else nothing)."""
    if _target is None or _target[0] != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] == _target[1]:
            once = envvars.CRASH_ONCE.raw()
            if once:
                try:
                    os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                except FileExistsError:
                    return  # crashed here once already, in an earlier life of this container
            if os.getpid() == 1 and _signal == signal.SIGKILL:
                # PID 1 of a container: the kernel ignores the signals it sends itself that it
                # has no handler for, SIGKILL included. _exit ends it as abruptly (no cleanup,
                # nothing flushed) with the status a SIGKILL gives a container (137).
                os._exit(128 + signal.SIGKILL)
            os.kill(os.getpid(), _signal)
