"""LocalExecutor: runs each attempt as its own process tree on this machine.

    control plane ──Popen(new session)──> shim ──(new session)──> torchrun ──> rank.py ──> script
                                                                  (or python script directly)

The control plane and the job talk only through files in ``run_dir/attempt-N/`` (see
``layout``), so the control plane can be killed and restarted at any time: the shim keeps
supervising, and ``reattach`` finds it again by (pid, create time) from the stored handle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

import tensoryard
from tensoryard.errors import ExecutorError
from tensoryard.executors.base import AttemptPhase, AttemptStatus, LaunchRequest
from tensoryard.executors.local.exits import ExitWatch
from tensoryard.executors.local.layout import AttemptLayout, read_json, write_json_atomic
from tensoryard.executors.local.netns import NetnsNodes
from tensoryard.executors.local.outcome import ExitRecord, attempt_status
from tensoryard.executors.local.plan import (
    DEFAULT_ENV_ALLOW,
    RANK_WRAPPER,
    allowed_env,
    build_plan,
    python_path_with,
    run_as_for,
)
from tensoryard.executors.local.procs import (
    create_time,
    is_alive,
    kill_all,
    marked_processes,
)
from tensoryard.runtime.stacks import SIGNAL as STACK_SIGNAL

__all__ = ["LocalExecutor", "LocalHandle"]

_SRC_ROOT = Path(tensoryard.__file__).resolve().parent.parent
_HANDLE_VERSION = 1
_SHIM_MODULE = "tensoryard.executors.local.shim"


@dataclass(frozen=True)
class LocalHandle:
    """What the control plane stores for a local attempt (as a JSON-able dict)."""

    job_id: str
    attempt: int
    attempt_dir: str
    launcher: str
    world_size: int
    shim_pid: int
    shim_create_time: float
    attempt_key: str

    def to_dict(self) -> dict[str, Any]:
        return {"executor": "local", "version": _HANDLE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LocalHandle:
        if data.get("executor") != "local":
            raise ExecutorError(f"handle belongs to executor {data.get('executor')!r}, not 'local'")
        try:
            return cls(
                job_id=str(data["job_id"]),
                attempt=int(data["attempt"]),
                attempt_dir=str(data["attempt_dir"]),
                launcher=str(data["launcher"]),
                world_size=int(data["world_size"]),
                shim_pid=int(data["shim_pid"]),
                shim_create_time=float(data["shim_create_time"]),
                attempt_key=str(data["attempt_key"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExecutorError(f"malformed local executor handle ({exc!r}): {dict(data)}") from exc

    @property
    def layout(self) -> AttemptLayout:
        return AttemptLayout(Path(self.attempt_dir))


class LocalExecutor:
    """Runs jobs as supervised process trees on this machine (see the module docstring).

    Args:
        root: when given, run directories must lie under it (relative ones are taken
            relative to it); default: any directory, relative to the current one.
        python: the interpreter of the workload (torchrun runs under it); the shim always
            runs under this process's own interpreter.
        base_env: the environment jobs inherit before spec.env and the TYARD_* variables;
            default: the variables of this process's environment named by `env_allow`
            (never the control plane's secrets).
        env_allow: names (shell-style patterns allowed) passed on from this process's
            environment to jobs and to the shim; default `DEFAULT_ENV_ALLOW`.
        run_as_submitter: when this process runs as root, run each job as the Unix account
            named like the job's user, where one exists (see `plan.run_as_for`).
        confirm_start_s: how long `launch` waits for the shim to report in, so a shim that
            cannot start is an ExecutorError at launch rather than a LOST attempt later;
            0 returns at once.
    """

    name = "local"

    def __init__(
        self,
        root: Path | None = None,
        python: str = sys.executable,
        *,
        base_env: Mapping[str, str] | None = None,
        confirm_start_s: float = 15.0,
        env_allow: Sequence[str] = DEFAULT_ENV_ALLOW,
        run_as_submitter: bool = True,
        netns: NetnsNodes | None = None,
    ) -> None:
        self.root = Path(root).resolve() if root is not None else None
        self.python = python
        self.base_env = None if base_env is None else dict(base_env)
        self.confirm_start_s = confirm_start_s
        self.env_allow = tuple(env_allow)
        self.run_as_submitter = run_as_submitter
        self.netns = netns  # network-namespace nodes: multi-node jobs run across them
        # Shims we started, kept only to reap them (a shim outlives us when we die).
        self._shims: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._exits: ExitWatch | None = None  # see report_changes

    def report_changes(self, changed: Callable[[int | None], None]) -> bool:
        """Tell `changed(job_id)` when an attempt's supervisor exits (it has written the
        attempt's exit record by then), so the loop reconciles that job at once; False
        where the kernel has no pidfds."""
        self._exits = ExitWatch(changed)
        return self._exits.enabled

    # -- launch -------------------------------------------------------------------------------

    def prepare(self, request: LaunchRequest) -> dict[str, Any]:
        """The handle of the attempt, before anything starts (the shim is found through
        shim.json and its key later, so no pid is needed up front)."""
        layout = AttemptLayout.for_attempt(self._run_dir(request.run_dir), request.attempt)
        return self._handle(request, layout, _key_of(request), pid=0, started=0.0).to_dict()

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        """Start the attempt under a shim in a new session; return the handle to store.

        Idempotent per attempt key: when launch.json already names this key, the attempt is
        found again (running, finished or still starting) and nothing new starts; only an
        attempt whose supervisor never came up (no shim.json, no process with the key, no exit
        record) is started again. A directory holding another key's attempt is an error."""
        layout = AttemptLayout.for_attempt(self._run_dir(request.run_dir), request.attempt)
        key = _key_of(request)
        previous = read_json(layout.launch) if layout.dir.is_dir() else None
        if previous is not None and previous.get("attempt_key") != key:
            raise ExecutorError(
                f"attempt directory {layout.dir} already holds attempt "
                f"{previous.get('attempt_key')!r}, not {key!r} (fix: launch with a new attempt "
                "number)"
            )
        if previous is None:
            _make_attempt_dir(layout)
            # `ip netns exec` needs root: multi-node jobs run as the control plane's user
            run_as = (
                run_as_for(request.spec.user, enabled=self.run_as_submitter)
                if request.spec.resources.nodes == 1
                else None
            )
            plan = build_plan(
                request,
                layout,
                python=self.python,
                attempt_key=key,
                base_env=self._base_env(),
                run_as=run_as,
                netns=self.netns,
            )
            if run_as is not None:  # the job writes its logs, checkpoints and run files
                for path in (layout.dir.parent, layout.dir):
                    os.chown(path, run_as.uid, run_as.gid)
            # 0600: the environment carries the job's report token.
            write_json_atomic(layout.launch, plan.to_dict(), mode=0o600)
        elif self._started_before(layout, key):
            handle = self._handle(request, layout, key, pid=0, started=0.0)
            self._confirm_started(handle, None)
            return self._with_shim_identity(handle).to_dict()
        shim = self._start_shim(layout)
        handle = self._handle(
            request, layout, key, pid=shim.pid, started=_create_time_or_fail(shim.pid, layout)
        )
        self._confirm_started(handle, shim)
        self._watch_exit(handle)
        return handle.to_dict()

    def terminate(self, handle: dict[str, Any]) -> int:
        """Kill every process carrying the attempt's key, now; how many were running."""
        return kill_all(marked_processes(LocalHandle.from_dict(handle).attempt_key))

    def restart_workers(self, handle: dict[str, Any]) -> int:
        """SIGKILL the attempt's rank workers (each rank wrapper's process group: the wrapper
        and the training process), leaving torchrun and the shim running: torchrun sees failed
        workers and, with restarts left (``--max-restarts``), starts them again. Returns how
        many rank wrappers were killed (0: none found, e.g. a python-launcher job)."""
        h = LocalHandle.from_dict(handle)
        wrappers = [p for p in marked_processes(h.attempt_key) if _is_rank_wrapper(p)]
        groups: set[int] = set()
        for proc in wrappers:
            try:
                group = os.getpgid(proc.pid)
                parent_group = os.getpgid(proc.ppid())
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
            if group in (parent_group, os.getpgrp()) or group in groups:
                continue  # never the launcher's own group (or ours)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
                groups.add(group)
        return len(groups)

    def dump_stacks(self, handle: dict[str, Any], *, wait_s: float = 1.5) -> dict[int, str | None]:
        """Ask every rank that enabled stack dumps (tensoryard.runtime.stacks) to write its
        threads' stacks; rank -> what it wrote (None: it did not answer within ``wait_s``; a
        stopped process is not waited for: a line in parentheses says so). {} when no rank
        enabled them (a job without the runtime).

        Only a process named in ``rank-R.stacks.pid`` that still carries the attempt's key is
        signalled: SIGUSR2 would terminate a process that has no handler for it."""
        h = LocalHandle.from_dict(handle)
        directory = Path(h.attempt_dir)
        alive = {p.pid: p for p in marked_processes(h.attempt_key)}
        sizes: dict[int, int] = {}
        stopped: dict[int, str | None] = {}
        for pid_file in directory.glob("rank-*.stacks.pid"):
            try:
                rank = int(pid_file.name.split(".")[0].removeprefix("rank-"))
                pid = int(pid_file.read_text(encoding="utf-8").strip())
            except (OSError, ValueError):
                continue
            if pid not in alive:
                continue
            with contextlib.suppress(psutil.Error):
                if alive[pid].status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    # it cannot answer until continued: do not wait for it
                    stopped[rank] = f"(process {pid} is stopped: SIGSTOP or a debugger)"
                    continue
            out = directory / f"rank-{rank}.stacks.txt"
            try:
                sizes[rank] = out.stat().st_size
                os.kill(pid, STACK_SIGNAL)
            except (OSError, ProcessLookupError):
                continue
        texts: dict[int, str | None] = dict.fromkeys(sizes)
        deadline = time.monotonic() + wait_s
        while any(t is None for t in texts.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
            for rank, before in sizes.items():
                if texts[rank] is not None:
                    continue
                out = directory / f"rank-{rank}.stacks.txt"
                with contextlib.suppress(OSError), out.open("rb") as f:
                    f.seek(before)
                    new = f.read().decode("utf-8", "replace")
                    # faulthandler writes the newest thread first: the main thread, whose
                    # outermost frame is the script's <module>, ends a complete dump
                    if new.rstrip().endswith("<module>"):
                        texts[rank] = new
        for rank, before in sizes.items():  # whatever arrived by the deadline
            if texts[rank] is None:
                out = directory / f"rank-{rank}.stacks.txt"
                with contextlib.suppress(OSError), out.open("rb") as f:
                    f.seek(before)
                    texts[rank] = f.read().decode("utf-8", "replace") or None
        return {**texts, **stopped}

    def _handle(
        self, request: LaunchRequest, layout: AttemptLayout, key: str, *, pid: int, started: float
    ) -> LocalHandle:
        return LocalHandle(
            job_id=str(request.job_id),
            attempt=request.attempt,
            attempt_dir=str(layout.dir),
            launcher=request.spec.launcher,
            world_size=request.spec.resources.world_size,
            shim_pid=pid,
            shim_create_time=started,
            attempt_key=key,
        )

    def _started_before(self, layout: AttemptLayout, key: str) -> bool:
        """Whether an earlier launch of this attempt got its supervisor going at all."""
        return (
            layout.shim.exists()
            or layout.exit.exists()
            or bool(marked_processes(key))
            or bool(shim_processes(layout.dir))
        )

    def _with_shim_identity(self, h: LocalHandle) -> LocalHandle:
        info = read_json(h.layout.shim) or {}
        try:
            pid, started = int(info["pid"]), float(info["create_time"])
        except (KeyError, TypeError, ValueError):
            return h
        return LocalHandle(**{**asdict(h), "shim_pid": pid, "shim_create_time": started})

    def _base_env(self) -> dict[str, str]:
        if self.base_env is not None:
            return dict(self.base_env)
        return allowed_env(os.environ, self.env_allow)

    def _run_dir(self, run_dir: Path) -> Path:
        path = Path(run_dir)
        if self.root is None:
            return path.resolve()
        path = (self.root / path).resolve()
        if not path.is_relative_to(self.root):
            raise ExecutorError(
                f"run_dir {run_dir} lies outside the executor root {self.root} "
                "(fix: give a run_dir under the root)"
            )
        return path

    def _start_shim(self, layout: AttemptLayout) -> subprocess.Popen[bytes]:
        env = {**allowed_env(os.environ, self.env_allow), "PYTHONPATH": python_path_with(_SRC_ROOT)}
        argv = [sys.executable, "-m", _SHIM_MODULE, str(layout.dir)]  # ours: it needs psutil
        try:
            with layout.launcher_log.open("ab") as log:
                shim = subprocess.Popen(
                    argv,
                    cwd=layout.dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a control-plane SIGKILL must not reach the job
                )
        except OSError as exc:
            raise ExecutorError(f"cannot start the job supervisor {argv[0]!r}: {exc}") from exc
        with self._lock:
            self._shims[shim.pid] = shim
        return shim

    def _confirm_started(self, handle: LocalHandle, shim: subprocess.Popen[bytes] | None) -> None:
        """Wait until the shim has written shim.json, or fail with its output. Without a
        Popen (a relaunch found a shim starting up) it watches the key's processes."""
        layout = handle.layout
        if self.confirm_start_s <= 0:
            return
        deadline = time.monotonic() + self.confirm_start_s
        while time.monotonic() < deadline:
            if layout.shim.exists() or layout.exit.exists():
                return
            if shim is not None and shim.poll() is not None:
                break
            if shim is None and not shim_processes(layout.dir):
                break
            time.sleep(0.02)
        if layout.shim.exists() or layout.exit.exists():
            return
        extra = _as_list(shim.pid) if shim is not None else shim_processes(layout.dir)
        kill_all(marked_processes(handle.attempt_key) + extra)
        raise ExecutorError(
            f"the job supervisor for job {handle.job_id} attempt {handle.attempt} did not start "
            f"within {self.confirm_start_s:g}s; its output:\n{_tail_text(layout.launcher_log)}"
        )

    # -- watch --------------------------------------------------------------------------------

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        """STARTING until every rank is up, RUNNING, then the phase from exit.json.

        When the shim is gone without an exit record the attempt is LOST, and any process of
        it that survived is killed (nothing supervises it any more)."""
        h = LocalHandle.from_dict(handle)
        finished = self._finished(h)
        if finished is not None:
            return finished
        if self._shim_alive(h):
            self._watch_exit(h)
            phase = AttemptPhase.RUNNING if self._workers_up(h) else AttemptPhase.STARTING
            return AttemptStatus(phase)
        finished = self._finished(h)  # it may have finished between the two looks
        return finished if finished is not None else self._lost(h)

    def reattach(self, handle: dict[str, Any]) -> AttemptStatus:
        """After a control-plane restart: the recorded outcome, RUNNING, or LOST."""
        return self.poll(handle)

    def log_paths(self, handle: dict[str, Any]) -> dict[int, Path]:
        """Rank -> its live log file (it appears when the rank starts)."""
        h = LocalHandle.from_dict(handle)
        return {rank: h.layout.rank_log(rank) for rank in range(h.world_size)}

    def launcher_log_path(self, handle: dict[str, Any]) -> Path:
        """The shim's and torchrun's own output."""
        return LocalHandle.from_dict(handle).layout.launcher_log

    def wait(
        self, handle: dict[str, Any], *, timeout_s: float, interval_s: float = 0.1
    ) -> AttemptStatus:
        """Poll until the attempt finishes; raise ExecutorError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.poll(handle)
            if status.finished:
                return status
            if time.monotonic() >= deadline:
                raise ExecutorError(
                    f"attempt still {status.phase.value} after {timeout_s:g}s "
                    f"({handle.get('attempt_dir')})"
                )
            time.sleep(interval_s)

    def _finished(self, h: LocalHandle) -> AttemptStatus | None:
        data = read_json(h.layout.exit)
        if data is None:
            return None
        self._reap(h.shim_pid)
        return attempt_status(ExitRecord.from_dict(data))

    def _watch_exit(self, h: LocalHandle) -> None:
        """Have the exit watch report the end of this attempt's supervisor (when on)."""
        if self._exits is None or not h.shim_pid:
            return
        job_id = int(h.job_id) if h.job_id.isdigit() else None
        self._exits.add(h.shim_pid, h.shim_create_time, job_id)

    def _shim_alive(self, h: LocalHandle) -> bool:
        """Alive by (pid, create time); a handle recorded before launch learns them from
        shim.json, and while that is missing a process carrying the key counts."""
        if not h.shim_pid:
            known = self._with_shim_identity(h)
            if not known.shim_pid:
                return bool(shim_processes(h.layout.dir))
            h = known
        self._reap(h.shim_pid)
        return is_alive(h.shim_pid, h.shim_create_time)

    def _workers_up(self, h: LocalHandle) -> bool:
        if h.launcher == "python":
            info = read_json(h.layout.shim) or {}
            return "workload_pid" in info
        return len(h.layout.existing_rank_logs()) >= h.world_size

    def _lost(self, h: LocalHandle) -> AttemptStatus:
        leftovers = kill_all(marked_processes(h.attempt_key))
        reason = (
            f"the job supervisor (pid {h.shim_pid}) is gone and left no exit record "
            f"in {h.attempt_dir} (see launcher.log there)"
        )
        if leftovers:
            reason += f"; killed {leftovers} leftover process(es) of the attempt"
        return AttemptStatus(AttemptPhase.LOST, None, reason)

    def _reap(self, pid: int) -> None:
        with self._lock:
            shim = self._shims.get(pid)
            if shim is not None and shim.poll() is not None:
                del self._shims[pid]

    # -- stop ---------------------------------------------------------------------------------

    def cancel(self, handle: dict[str, Any], *, grace_s: float) -> None:
        """Ask the shim to stop the job: SIGTERM now, SIGKILL after `grace_s` (the shim
        escalates by itself, so it happens even if the control plane dies). Idempotent."""
        h = LocalHandle.from_dict(handle)
        layout = h.layout
        if layout.exit.exists():
            return
        if not layout.cancel.exists():
            request = {"grace_s": max(float(grace_s), 0.0), "requested_at": time.time()}
            write_json_atomic(layout.cancel, request)
        if self._shim_alive(h):
            # Before shim.json exists its signal handlers may not be installed yet; it reads
            # cancel.json before starting the workload and on every tick, so the file suffices.
            if layout.shim.exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(h.shim_pid, signal.SIGTERM)
        elif not layout.exit.exists():
            kill_all(marked_processes(h.attempt_key))  # nobody supervises them any more


def _is_rank_wrapper(proc: psutil.Process) -> bool:
    """A process running RANK_WRAPPER: the first argument after the interpreter's options."""
    try:
        args = proc.cmdline()[1:]
    except (psutil.Error, OSError):
        return False
    first = next((a for a in args if not a.startswith("-")), None)
    return first == str(RANK_WRAPPER)


def shim_processes(attempt_dir: Path) -> list[psutil.Process]:
    """Live shims supervising `attempt_dir` (found by command line: a shim that is still
    starting up has not written shim.json yet)."""
    want = [_SHIM_MODULE, str(attempt_dir)]
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = proc.info["cmdline"] or []
            if cmd[-2:] == want and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, TypeError):
            continue
    return found


def _key_of(request: LaunchRequest) -> str:
    """The request's attempt key; a random one for callers that do not record keys."""
    return request.attempt_key or f"{request.job_id}-{request.attempt}-{uuid.uuid4().hex[:12]}"


def _make_attempt_dir(layout: AttemptLayout) -> None:
    if layout.dir.exists() and any(layout.dir.iterdir()):
        raise ExecutorError(
            f"attempt directory {layout.dir} already holds an attempt "
            "(fix: launch with a new attempt number)"
        )
    try:
        layout.dir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        layout.dir.mkdir(exist_ok=True, mode=0o700)  # logs and launch.json are the job's own
        os.chmod(layout.dir, 0o700)
    except OSError as exc:
        raise ExecutorError(f"cannot create {layout.dir}: {exc.strerror or exc}") from exc


def _create_time_or_fail(pid: int, layout: AttemptLayout) -> float:
    try:
        return create_time(pid)
    except psutil.Error as exc:
        raise ExecutorError(
            f"the job supervisor exited at once; see {layout.launcher_log}:\n"
            f"{_tail_text(layout.launcher_log)}"
        ) from exc


def _as_list(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid)]
    except psutil.Error:
        return []


def _tail_text(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-limit:]
    except OSError:
        return "(no output)"
