"""Process exits as events: one thread waits on Linux pidfds of the attempts' supervisors and
tells the control loop which job's attempt may have ended, so the loop need not wait for its
next tick (or poll every attempt) to notice. Where pidfds are not available the watch is off
and the loop's polls see every exit, as before."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable

from tensoryard.executors.local.procs import is_alive

__all__ = ["ExitWatch"]

log = logging.getLogger("tensoryard.executors.local")


class ExitWatch:
    """Calls ``changed(job_id)`` once when a watched process exits."""

    def __init__(self, changed: Callable[[int | None], None]) -> None:
        self._changed = changed
        self._lock = threading.Lock()
        self._by_fd: dict[int, tuple[int, int | None]] = {}  # pidfd -> (pid, job id)
        self._pids: set[int] = set()
        self.enabled = hasattr(os, "pidfd_open") and hasattr(select, "epoll")
        self._epoll = select.epoll() if self.enabled else None
        self._thread = threading.Thread(target=self._run, name="tyard-exits", daemon=True)
        if self.enabled:
            self._thread.start()

    def add(self, pid: int, create_time: float, job_id: int | None) -> None:
        """Watch `pid` (the process started at `create_time`); a no-op when already watched,
        gone, or pidfds are not available."""
        if not self.enabled or pid <= 0:
            return
        with self._lock:
            if pid in self._pids:
                return
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return  # gone already: the next poll sees its end
        if not is_alive(pid, create_time):  # the pid was reused before we opened it
            os.close(fd)
            return
        with self._lock:
            self._pids.add(pid)
            self._by_fd[fd] = (pid, job_id)
        assert self._epoll is not None
        self._epoll.register(fd, select.EPOLLIN)  # epoll: safe while the thread waits

    def watching(self) -> int:
        with self._lock:
            return len(self._by_fd)

    def _run(self) -> None:
        assert self._epoll is not None
        while True:
            try:
                ready = self._epoll.poll()
            except InterruptedError:
                continue
            for fd, _ in ready:
                with self._lock:
                    pid, job_id = self._by_fd.pop(fd, (0, None))
                    self._pids.discard(pid)
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)
                os.close(fd)
                try:
                    self._changed(job_id)
                except Exception:  # the watcher must outlive a bad callback
                    log.exception("exit callback failed")
