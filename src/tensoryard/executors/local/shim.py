"""The supervisor of one attempt (like containerd-shim): ``python -m ...shim ATTEMPT_DIR``.

The executor starts it in a session of its own, so the control plane can die (even by
SIGKILL) without taking the job along. The shim then:

1. becomes a child subreaper, so no descendant of the job can escape it by re-parenting;
2. writes ``shim.json`` (its pid, create time, later the workload's pid/pgid);
3. starts the workload from ``launch.json`` in a session of its own (torchrun or python);
4. supervises: a cancel request (``cancel.json`` + SIGTERM to the shim) sends SIGTERM to the
   workload's process group, then SIGKILL to every process of the job after the grace period;
5. when the workload ends, stops any stragglers it left, then writes ``exit.json`` atomically.

For a Megatron job (TYARD_MEGATRON_SAVE in the workload's environment) it also follows the rank
logs and the save directory and reports the job's progress and checkpoints for it
(tensoryard.runtime.megatron), since Megatron itself does not talk to the control plane.

It exits with 0 whenever it wrote an exit record; what happened to the job is in the record.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType

import psutil

from tensoryard.executors.local.layout import AttemptLayout, read_json, write_json_atomic
from tensoryard.executors.local.outcome import ExitRecord, RankExit, parse_torchrun_failures
from tensoryard.executors.local.plan import LaunchPlan
from tensoryard.executors.local.procs import (
    become_subreaper,
    descendants,
    kill_all,
    marked_processes,
    signal_groups,
)
from tensoryard.runtime.megatron import SAVE_ENV as MEGATRON_SAVE_ENV
from tensoryard.runtime.megatron import MegatronMonitor
from tensoryard.runtime.report import Reporter, ReporterConfig

__all__ = ["Shim", "main"]

_TICK_S = 0.1
_STRAGGLER_GRACE_S = 5.0
_LOG_TAIL_BYTES = 256 * 1024


class Shim:
    """Runs and watches one workload; see the module docstring for the steps."""

    def __init__(self, layout: AttemptLayout, plan: LaunchPlan) -> None:
        self.layout = layout
        self.plan = plan
        self.started_at = time.time()
        self.workload: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.signalled = False
        self.cancel_sent_at: float | None = None
        self.kill_deadline: float | None = None
        self.escalated = False
        self.cancelled_before_start = False
        self._monitor: tuple[MegatronMonitor, threading.Thread, threading.Event] | None = None

    # -- 1-2: setup -------------------------------------------------------------------------

    def setup(self) -> None:
        subreaper = become_subreaper()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        me = psutil.Process()
        self._shim_info = {
            "pid": me.pid,
            "pgid": os.getpgrp(),
            "create_time": me.create_time(),
            "started_at": self.started_at,
            "subreaper": subreaper,
        }
        write_json_atomic(self.layout.shim, self._shim_info)
        self.log(f"supervising attempt in {self.layout.dir} (subreaper: {subreaper})")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True

    # -- 3: start ---------------------------------------------------------------------------

    def start(self) -> str:
        """Start the workload; return an error message when it cannot be started."""
        out = None
        if self.plan.launcher == "python":
            # A plain python job is rank 0; torchrun jobs get per-rank files from rank.py.
            out = os.open(self.layout.rank_log(0), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        who = self.plan.run_as
        if who is not None and out is not None:
            os.fchown(out, who.uid, who.gid)  # the job's own log
        try:
            self.workload = subprocess.Popen(
                self.plan.argv,
                cwd=self.plan.cwd,
                env=self.plan.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
                user=who.uid if who is not None else None,
                group=who.gid if who is not None else None,
                extra_groups=list(who.groups) if who is not None else None,
            )
        except OSError as exc:
            hint = (
                f" (the job runs as Unix user {who.name!r}: it needs access to the interpreter, "
                "the workdir and the script)"
                if who is not None
                else ""
            )
            why = exc.strerror or exc
            return f"cannot start {self.plan.argv[0]!r} in {self.plan.cwd}: {why}{hint}"
        finally:
            if out is not None:
                os.close(out)
        pid = self.workload.pid
        self._shim_info.update(workload_pid=pid, workload_pgid=pid, workload_started_at=time.time())
        write_json_atomic(self.layout.shim, self._shim_info)
        self.log(f"started {self.plan.launcher} (pid {pid}): {' '.join(self.plan.argv)}")
        return ""

    def start_monitor(self) -> None:
        """Follow a Megatron job's logs and save directory (see the module docstring)."""
        save = self.plan.env.get(MEGATRON_SAVE_ENV)
        if not save or self.plan.launcher != "torchrun":
            return
        config = ReporterConfig.from_env(self.plan.env, close_timeout_s=5.0)
        monitor = MegatronMonitor(self.layout.dir, Path(save), Reporter(config))
        monitor.start()
        stop = threading.Event()
        thread = threading.Thread(
            target=monitor.run, args=(stop,), name="tyard-megatron", daemon=True
        )
        thread.start()
        self._monitor = (monitor, thread, stop)
        self.log(f"following Megatron's logs and checkpoints in {save}")

    def stop_monitor(self) -> None:
        if self._monitor is None:
            return
        monitor, thread, stop = self._monitor
        self._monitor = None
        stop.set()
        thread.join(timeout=30)
        sink = monitor.sink
        if isinstance(sink, Reporter):
            sink.close()  # delivers what is left, within close_timeout_s

    # -- 4: supervise -----------------------------------------------------------------------

    def supervise(self) -> int:
        """Wait for the workload while serving cancel requests; return its exit code."""
        while True:
            code = self._reap()
            if code is not None:
                return code
            if self.cancel_sent_at is None and self.cancel_requested():
                self._send_sigterm()
            deadline = self.kill_deadline
            if deadline is not None and not self.escalated and time.monotonic() >= deadline:
                self._escalate()
            time.sleep(_TICK_S)

    def cancel_requested(self) -> bool:
        return self.signalled or self.layout.cancel.exists()

    def _reap(self) -> int | None:
        """Reap every exited child (we are their subreaper); the workload's code when done."""
        assert self.workload is not None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return self.exit_code
            if pid == 0:
                return self.exit_code
            if pid == self.workload.pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.workload.returncode = self.exit_code

    def _send_sigterm(self) -> None:
        assert self.workload is not None
        request = _read_quietly(self.layout.cancel)
        grace = _as_float(request.get("grace_s"), self.plan.default_grace_s)
        self.cancel_sent_at = time.time()
        self.kill_deadline = time.monotonic() + max(grace, 0.0)
        origin = "cancel requested" if request else "SIGTERM received without a request"
        self.log(f"{origin}: SIGTERM to process group {self.workload.pid}, SIGKILL in {grace:g}s")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.workload.pid, signal.SIGTERM)

    def _escalate(self) -> None:
        self.escalated = True
        procs = self._job_processes()
        self.log(f"grace period over: SIGKILL to {len(procs)} process(es)")
        signal_groups(procs, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def _job_processes(self) -> list[psutil.Process]:
        found = {p.pid: p for p in descendants()}
        for proc in marked_processes(self.plan.attempt_key):
            found.setdefault(proc.pid, proc)
        return list(found.values())

    # -- 5: clean up and record -------------------------------------------------------------

    def stop_stragglers(self) -> int:
        """Stop processes the workload left behind (daemons, orphaned helpers)."""
        procs = self._job_processes()
        if not procs:
            return 0
        self.log(f"workload ended; stopping {len(procs)} leftover process(es)")
        grace = 0.0 if self.escalated else _STRAGGLER_GRACE_S
        count = kill_all(procs, term_grace_s=grace)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        return count

    def record(self, *, error: str = "", stragglers: int = 0) -> ExitRecord:
        failures: dict[int, int] = {}
        root = None
        if self.plan.launcher == "torchrun" and self.exit_code not in (0, None):
            failures, root = parse_torchrun_failures(_tail(self.layout.launcher_log))
        return ExitRecord(
            launcher=self.plan.launcher,
            exit_code=self.exit_code,
            started_at=self.started_at,
            ended_at=time.time(),
            cancelled=self.cancel_sent_at is not None or self.cancelled_before_start,
            escalated=self.escalated,
            error=error,
            ranks=self._rank_exits(),
            torchrun_failures=failures,
            torchrun_root=root,
            stragglers_killed=stragglers,
        )

    def _rank_exits(self) -> dict[int, RankExit]:
        if self.plan.launcher == "python":
            if self.exit_code is None:
                return {}
            return {0: RankExit(self.exit_code, time.time(), self.cancel_sent_at)}
        ranks = {}
        for rank in range(self.plan.world_size):
            data = _read_quietly(self.layout.rank_exit(rank))
            if data:
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    ranks[rank] = RankExit.from_dict(data)
        return ranks

    def write_exit(self, record: ExitRecord) -> None:
        write_json_atomic(self.layout.exit, record.to_dict())
        self.log(f"exit record written: exit code {record.exit_code}")

    def log(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"[tyard-shim {stamp}] {message}", flush=True)

    # -- the whole life -----------------------------------------------------------------------

    def run(self) -> int:
        self.setup()
        if self.cancel_requested():
            self.log("cancelled before the workload started")
            self.cancelled_before_start = True
            self.write_exit(self.record())
            return 0
        self.start_monitor()  # before the workload: a checkpoint it commits is new
        try:
            error = self.start()
            if error:
                self.log(error)
                self.write_exit(self.record(error=error))
                return 0
            self.exit_code = self.supervise()
        finally:
            self.stop_monitor()
        self.log(f"workload exited with code {self.exit_code}")
        stragglers = self.stop_stragglers()
        self.write_exit(self.record(stragglers=stragglers))
        return 0


def _read_quietly(path: Path) -> dict[str, object]:
    try:
        return read_json(path) or {}
    except Exception:  # a damaged file must not take the supervisor down
        return {}


def _as_float(value: object, default: float) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - _LOG_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tensoryard.executors.local.shim ATTEMPT_DIR", file=sys.stderr)
        return 2
    os.umask(0o077)  # logs, records and checkpoints of a job are private to its owner
    layout = AttemptLayout(Path(args[0]))
    plan = LaunchPlan.from_dict(read_json(layout.launch) or {})
    shim = Shim(layout, plan)
    try:
        return shim.run()
    except Exception:
        # The supervisor itself failed: leave nothing running, and say so in the record.
        shim.log("supervisor failed:\n" + traceback.format_exc())
        shim.escalated = True
        kill_all(shim._job_processes())
        shim.write_exit(shim.record(error="the job supervisor failed (see launcher.log)"))
        return 1


if __name__ == "__main__":
    sys.exit(main())
