"""Per-rank step time and data-loader wait, left in the run directory for the node agent.

Each rank rewrites ``<run_dir>/ranks/rank-<R>.json`` (atomically, at most once a second) with
its last step, that step's duration and how long it waited for its batch. The node agent
exports them as ``tyard_job_rank_step_time_seconds`` and ``tyard_job_data_wait_seconds``
(labels job, team, rank), which the straggler and data-loader-stall rules read. A file, not a
request: every rank has one, it costs no network and no control-plane load, and it survives
the control plane being down. No torch here.

Each write also appends a line to ``<run_dir>/ranks/steps-a<A>-r<R>.jsonl`` (attempt A, rank
R): the same numbers over steps, one line a second at most (about 8 MB a day per rank), which
the console's per-rank plots read (:func:`read_rank_history`, the last 1 MiB of each file).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "RankStats",
    "process_start_ticks",
    "rank_history_path",
    "rank_stats_path",
    "read_rank_history",
    "read_rank_stats",
]

HISTORY_TAIL_BYTES = 1024 * 1024
"""How much of the end of a rank's history file `read_rank_history` reads."""


def process_start_ticks(pid: int, proc: str | Path = "/proc") -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); None
    when it does not exist or /proc is not Linux's. With the pid it names one process for good:
    a pid reused later has another start time."""
    try:
        stat = (Path(proc) / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def rank_stats_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "ranks" / f"rank-{rank}.json"


def rank_history_path(run_dir: str | Path, attempt: int, rank: int) -> Path:
    return Path(run_dir) / "ranks" / f"steps-a{attempt}-r{rank}.jsonl"


class RankStats:
    """Keeps one rank's last step's numbers and writes them at most every `every_s` seconds."""

    def __init__(
        self,
        run_dir: str | Path | None,
        rank: int,
        attempt: int,
        *,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = None if run_dir is None else rank_stats_path(run_dir, rank)
        self.history = None if run_dir is None else rank_history_path(run_dir, attempt, rank)
        self.rank, self.attempt = rank, attempt
        self.every_s = every_s
        self.clock, self.wall = clock, wall
        self._last_write = float("-inf")
        self._failed = False
        self._pid_start = process_start_ticks(os.getpid())
        self._probe: dict[str, float] = {}

    def probed(self, seconds: float, busbw_gbps: float, size_bytes: int) -> None:
        """The last collective-bandwidth probe (an all-reduce timed by the session), written
        with the next step's record; the agent exports it per rank."""
        self._probe = {
            "probe_busbw_gbps": round(busbw_gbps, 4),
            "probe_seconds": round(seconds, 6),
            "probe_bytes": size_bytes,
            "probe_ts": self.wall(),
        }
        self._last_write = float("-inf")  # written with the next step, whatever its age

    def step(self, step: int, step_time_s: float, data_wait_s: float) -> None:
        """Record a finished step; written now if the last write is `every_s` old."""
        if self.path is None or self._failed:
            return
        now = self.clock()
        if now - self._last_write < self.every_s:
            return
        self._last_write = now
        now_wall = self.wall()
        record = {
            "rank": self.rank,
            "attempt": self.attempt,
            # which process this is, for the agent's per-rank /proc/<pid>/io (the start time
            # tells a reused pid from this rank)
            "pid": os.getpid(),
            "pid_start": self._pid_start,
            "step": step,
            "step_time_s": round(step_time_s, 6),
            "data_wait_s": round(data_wait_s, 6),
            **self._probe,
            "ts": now_wall,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record), encoding="utf-8")
            os.replace(tmp, self.path)
            if self.history is not None:
                line = [step, round(step_time_s, 6), round(data_wait_s, 6), round(now_wall, 3)]
                with self.history.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(line) + "\n")
        except OSError:
            self._failed = True  # a read-only or full disk must not cost the job a step


def read_rank_stats(run_dir: str | Path) -> list[dict[str, float]]:
    """The last record of every rank of a job (sorted by rank): ``rank``, ``step``,
    ``step_time_s``, ``data_wait_s`` and ``data_wait_share`` (wait / step time). Files that
    are unreadable or half-written are left out; a run directory without ranks gives []."""
    out: list[dict[str, float]] = []
    try:
        paths = sorted((Path(run_dir) / "ranks").glob("rank-*.json"))
    except OSError:
        return out
    for path in paths:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            step_s, wait_s = float(record["step_time_s"]), float(record["data_wait_s"])
            row = {"rank": int(record["rank"]), "step": int(record["step"])}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        share = wait_s / step_s if step_s > 0 else 0.0
        out.append(row | {"step_time_s": step_s, "data_wait_s": wait_s, "data_wait_share": share})
    return sorted(out, key=lambda r: r["rank"])


def read_rank_history(
    run_dir: str | Path, attempt: int, *, tail_bytes: int = HISTORY_TAIL_BYTES
) -> dict[int, list[tuple[int, float, float, float]]]:
    """Rank -> ``(step, step_time_s, data_wait_s, ts)`` rows of one attempt, oldest first, from
    the last `tail_bytes` of each rank's history file. A torn or malformed line (a write cut
    short, the first line of a tail) is skipped; an attempt without files gives {}."""
    out: dict[int, list[tuple[int, float, float, float]]] = {}
    try:
        paths = list((Path(run_dir) / "ranks").glob(f"steps-a{attempt}-r*.jsonl"))
    except OSError:
        return out
    for path in paths:
        try:
            rank = int(path.name.removesuffix(".jsonl").rsplit("-r", 1)[1])
            with path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - tail_bytes))
                text = f.read().decode("utf-8", "replace")
        except (OSError, ValueError, IndexError):
            continue
        rows = []
        for line in text.splitlines():
            try:
                step, step_s, wait_s, ts = json.loads(line)
                rows.append((int(step), float(step_s), float(wait_s), float(ts)))
            except (ValueError, TypeError):
                continue
        out[rank] = rows
    return dict(sorted(out.items()))
