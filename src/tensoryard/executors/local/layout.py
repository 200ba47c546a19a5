"""The files of one attempt directory, and atomic JSON I/O on them.

Everything the executor and its supervisor (the shim) tell each other goes through files in
``run_dir/attempt-N/``, so the control plane can die and come back at any moment:

    launch.json        what to run (argv, env overrides, cwd); written by the executor, mode 0600
    shim.json          supervisor pid/pgid/create time, workload pid/pgid; written by the shim
    cancel.json        a cancel request (grace, time); written by the executor
    exit.json          the exit record; written once by the shim when everything has stopped
    launcher.log       output of the shim and of torchrun itself
    rank-R.log         stdout+stderr of rank R, written live
    rank-R.exit.json   exit code of rank R (torchrun jobs), written by the rank wrapper
    torchrun/          torchrun's own log dir (per-rank error files)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensoryard.errors import ExecutorError

__all__ = ["AttemptLayout", "read_json", "write_json_atomic"]

_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")


@dataclass(frozen=True)
class AttemptLayout:
    """Paths inside one attempt directory."""

    dir: Path

    @classmethod
    def for_attempt(cls, run_dir: Path, attempt: int) -> AttemptLayout:
        return cls(Path(run_dir) / f"attempt-{attempt}")

    @property
    def launch(self) -> Path:
        return self.dir / "launch.json"

    @property
    def shim(self) -> Path:
        return self.dir / "shim.json"

    @property
    def cancel(self) -> Path:
        return self.dir / "cancel.json"

    @property
    def exit(self) -> Path:
        return self.dir / "exit.json"

    @property
    def launcher_log(self) -> Path:
        return self.dir / "launcher.log"

    @property
    def torchrun_dir(self) -> Path:
        return self.dir / "torchrun"

    def rank_log(self, rank: int) -> Path:
        return self.dir / f"rank-{rank}.log"

    def rank_exit(self, rank: int) -> Path:
        return self.dir / f"rank-{rank}.exit.json"

    def existing_rank_logs(self) -> set[int]:
        """Ranks whose log file exists (a rank creates it first thing when it starts)."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return set()
        return {int(m.group(1)) for n in names if (m := _RANK_LOG.match(n))}


def write_json_atomic(path: Path, data: dict[str, Any], *, mode: int = 0o644) -> None:
    """Write `data` so a reader sees the old file or the whole new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ExecutorError(f"cannot write {path}: {exc.strerror or exc}") from exc


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when the file does not exist (yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ExecutorError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExecutorError(
            f"{path} is not valid JSON ({exc.msg}); it was not written by "
            "tensoryard or the disk is damaged"
        ) from exc
    if not isinstance(data, dict):
        raise ExecutorError(f"{path} holds {type(data).__name__}, expected an object")
    return data
