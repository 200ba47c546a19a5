"""Per-rank wrapper that torchrun starts instead of the script: ``rank.py ATTEMPT_DIR CMD...``.

It sends the rank's stdout and stderr, live, to ``ATTEMPT_DIR/rank-R.log``, runs
``python CMD...`` as its child, records how the child ended in ``rank-R.exit.json`` and then
ends the same way (same exit code or same signal), so torchrun sees what it would have seen.

The wrapper and its child share a process group; torchrun and the shim signal whole groups,
so the wrapper does not forward signals (the child already got them), it only notes when a
SIGTERM arrived: a rank told to stop after another rank failed was stopped, not failed.

A child that dies of SIGABRT or SIGSEGV after the runtime wrote ``rank-R.done`` (training ended
cleanly, everything reported and saved) died in torch's C++ teardown at interpreter exit; the
wrapper records that as a success, with a line in the log saying so.

When torchrun restarts the workers in place (``--max-restarts``, granted by the control
plane), TORCHELASTIC_RESTART_COUNT is k > 0: the child then runs as attempt launch + k
(TYARD_ATTEMPT, with TYARD_LAUNCH_ATTEMPT the launch's number), so what it reports lands on a
new attempt of the job, and its log gets a line that marks the restart. On a multi-node gang
(TYARD_GANG=1) k is the restart round, counted from this rank's starts (see _spawn_round).

Run by file path with the job's Python, so it works whatever the job's environment is: it
imports the standard library and ``tensoryard.envvars`` only (itself standard library only),
the latter from the tensoryard tree it sits in when run as a script.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

if not __package__:  # run by file path (torchrun, srun): the contract of this very tree
    _src = str(Path(__file__).resolve().parents[3])
    sys.path.insert(0, _src)
    try:
        from tensoryard import envvars
    finally:
        sys.path.remove(_src)  # only for this import: the rest resolves as the job's would
else:
    from tensoryard import envvars

_sigterm_at: float | None = None


def _note_signal(signum: int, frame: FrameType | None) -> None:
    global _sigterm_at
    if signum == signal.SIGTERM and _sigterm_at is None:
        _sigterm_at = time.time()


def _redirect_output(log: Path) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _error_message() -> str:
    """First line of the rank's torch elastic error file (written by @record), if any."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return ""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        message = data.get("message", {})
        text = message.get("message", "") if isinstance(message, dict) else str(message)
    except (OSError, ValueError, AttributeError):
        return ""
    return str(text).strip().splitlines()[0][:300] if text else ""


_WATCHDOG = "Watchdog caught collective operation timeout:"
_TRACE_DUMP = "dumping nccl trace to "
_LOG_TAIL_BYTES = 256 * 1024


def _watchdog_message(log: Path) -> str:
    """ProcessGroupNCCL's watchdog verdict from the end of the rank's log, if it timed a
    collective out ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=.., OpType=
    ALLREDUCE, ..) ran for 600012 milliseconds before timing out."), with the path of the flight
    recorder's trace when it dumped one ("ProcessGroupNCCL dumping nccl trace to PATH")."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - _LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    verdict, dump = "", ""
    for line in tail.splitlines():
        if _WATCHDOG in line:
            verdict = "NCCL watchdog: collective operation timeout: "
            verdict += line.split(_WATCHDOG, 1)[1].strip()
        elif _TRACE_DUMP in line:
            dump = line.split(_TRACE_DUMP, 1)[1].strip()
    if not verdict:
        return ""
    verdict = verdict[:300]
    return f"{verdict} (flight recorder trace: {dump})" if dump else verdict


def _write_record(path: Path, record: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, path)


def _record(code: int, log: Path | None = None) -> dict[str, object]:
    # Entering a function runs pending Python signal handlers first, so a SIGTERM that
    # reached the group together with the child is noted before it is read here.
    error = ""
    if code != 0:
        error = _error_message() or (_watchdog_message(log) if log is not None else "")
    return {
        "exit_code": code,
        "ended_at": time.time(),
        "sigterm_at": _sigterm_at,
        "error": error,
        "node": os.environ.get(envvars.NODE.name, ""),  # network-namespace nodes (gang.py)
    }


def _end_like(code: int) -> None:
    """Exit with `code`, or die of the same signal when `code` < 0."""
    if code < 0:
        sig = -code
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their disposition cannot be set
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # the signal is delivered before this returns; belt and braces
        os._exit(128 + sig)
    sys.stdout.flush()
    os._exit(code)


DONE_ENV = envvars.RANK_DONE_FILE.name
# Signals a process may die of in torch's C++ teardown after Python finished its work (torch
# 2.13, gloo: "terminate called without an active exception" -> SIGABRT, seen once in CI).
_TEARDOWN_SIGNALS = (signal.SIGABRT, signal.SIGSEGV)


def _spawn_round(attempt_dir: Path, env: dict[str, str]) -> int:
    """How many times this node's torchrun started this local rank before, in this launch.

    On a multi-node gang torchrun's TORCHELASTIC_RESTART_COUNT counts the restarts of the
    node whose worker failed only (the others restart their workers for the new rendezvous
    round without counting), so it differs between nodes. Every round starts every local rank
    of every node once, so the number of earlier starts is the round on every node alike. Each
    start claims the next free marker file (O_EXCL: exactly one start gets each number)."""
    node = "".join(
        c if c.isalnum() or c in "-_." else "_" for c in env.get(envvars.NODE.name, "node")
    )
    folder = attempt_dir / "rounds" / f"{node}-{env.get('LOCAL_RANK', '0')}"
    folder.mkdir(parents=True, exist_ok=True)
    for round_ in range(100_000):
        try:
            os.close(os.open(folder / str(round_), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        return round_
    return 0


def _child_env(env: dict[str, str], attempt_dir: Path | None = None) -> dict[str, str]:
    """The child's environment: numbered as the next attempt after an in-place restart."""
    try:
        restarts = int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)
        launch = int(env.get(envvars.ATTEMPT.name) or 0)
    except ValueError:
        return env
    if env.get(envvars.GANG.name) == "1" and attempt_dir is not None:
        restarts = _spawn_round(attempt_dir, env)
        env = {**env, envvars.RESTART_ROUND.name: str(restarts)}  # the runtime's store prefix
    if restarts <= 0 or launch <= 0:
        return env
    return {
        **env,
        envvars.ATTEMPT.name: str(launch + restarts),
        envvars.LAUNCH_ATTEMPT.name: str(launch),
    }


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        print("usage: rank.py ATTEMPT_DIR COMMAND [ARGS...]", file=sys.stderr)
        os._exit(2)
    attempt_dir, command = Path(argv[0]), argv[1:]
    rank = int(os.environ.get("RANK", "0"))
    log = attempt_dir / f"rank-{rank}.log"
    _redirect_output(log)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _note_signal)
    env = _child_env(dict(os.environ), attempt_dir)
    done = attempt_dir / f"rank-{rank}.done"
    done.unlink(missing_ok=True)  # an in-place restart reuses the directory
    env[DONE_ENV] = str(done)  # the runtime writes it once training ended cleanly
    if envvars.LAUNCH_ATTEMPT.name in env:
        print(
            f"tensoryard: workers restarted in place by torchrun (restart "
            f"{env.get(envvars.RESTART_ROUND.name) or env.get('TORCHELASTIC_RESTART_COUNT')}): "
            f"rank {rank} runs as attempt "
            f"{env[envvars.ATTEMPT.name]}",
            flush=True,
        )
    try:
        child = subprocess.Popen([sys.executable, *command], env=env)
    except OSError as exc:
        print(f"tensoryard: cannot start rank {rank}: {exc}", file=sys.stderr, flush=True)
        code = 127
    else:
        code = child.wait()  # PEP 475: retried across our signal handlers
    if -code in _TEARDOWN_SIGNALS and done.exists():
        print(
            f"tensoryard: rank {rank} finished cleanly (its runtime said so), then died of "
            f"{signal.Signals(-code).name} while the interpreter tore torch down; recorded as "
            "a success",
            flush=True,
        )
        code = 0
    _write_record(attempt_dir / f"rank-{rank}.exit.json", _record(code, log))
    _end_like(code)


if __name__ == "__main__":
    main(sys.argv[1:])
