"""Per-rank step time and data-loader wait of the jobs on this node, from the files the
runtime leaves in each job's run directory (``tensoryard.runtime.rank_stats``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.metrics_core import Metric

from tensoryard.observability import metrics as m
from tensoryard.observability.base import CollectorErrors, family
from tensoryard.observability.storage import JobProcess
from tensoryard.runtime.rank_stats import process_start_ticks

__all__ = ["RankStatsCollector", "RankStatsSource", "rank_processes"]


@dataclass(frozen=True)
class RankStatsSource:
    """Where a job's rank files lie on this node (`<run_dir>/ranks`)."""

    directory: Path
    job: str
    team: str


class RankStatsCollector:
    """`tyard_job_rank_step_time_seconds` and `tyard_job_data_wait_seconds` per rank. A file
    older than `max_age_s` (a rank of an earlier attempt, or one that stopped) is left out, so
    a hung rank's series goes stale and the hang rules see it."""

    NAME = "ranks"

    def __init__(
        self,
        sources: Callable[[], Iterable[RankStatsSource]],
        *,
        max_age_s: float = 300.0,
        wall: Callable[[], float] = time.time,
        errors: CollectorErrors | None = None,
    ) -> None:
        self.sources = sources
        self.max_age_s = max_age_s
        self.wall = wall
        self.errors = errors if errors is not None else CollectorErrors()

    def collect(self) -> Iterable[Metric]:
        step_time = family(m.JOB_RANK_STEP_TIME)
        data_wait = family(m.JOB_DATA_WAIT)
        busbw = family(m.JOB_COLLECTIVE_BUSBW)
        now = self.wall()
        for source in self.sources():
            try:
                files = sorted(source.directory.glob("rank-*.json"))
            except OSError as exc:
                self.errors.record(self.NAME, str(source.directory), exc)
                continue
            for path in files:
                try:
                    record = json.loads(path.read_text(encoding="utf-8"))
                    rank, ts = int(record["rank"]), float(record["ts"])
                    step_s, wait_s = float(record["step_time_s"]), float(record["data_wait_s"])
                except FileNotFoundError:
                    continue  # replaced or removed between the listing and the read
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    self.errors.record(self.NAME, str(path), exc)
                    continue
                if now - ts > self.max_age_s:
                    continue
                labels = [source.job, source.team, str(rank)]
                step_time.add_metric(labels, step_s)
                data_wait.add_metric(labels, wait_s)
                probe = record.get("probe_busbw_gbps")
                if isinstance(probe, int | float) and now - float(record.get("probe_ts", 0)) <= (
                    self.max_age_s
                ):
                    busbw.add_metric(labels, float(probe))
        yield step_time
        yield data_wait
        yield busbw


def rank_processes(
    sources: Iterable[RankStatsSource],
    proc: str | Path = "/proc",
    *,
    max_age_s: float = 300.0,
    wall: Callable[[], float] = time.time,
    errors: CollectorErrors | None = None,
) -> list[JobProcess]:
    """The live processes of the ranks whose files are fresh: each rank's own process (the pid
    its file names, if it still has the start time the file recorded: a reused pid is not the
    rank) and its descendants (DataLoader workers), for the per-rank /proc/<pid>/io metrics."""
    root = Path(proc)
    out: list[JobProcess] = []
    now = wall()
    for source in sources:
        try:
            files = sorted(source.directory.glob("rank-*.json"))
        except OSError:
            continue  # RankStatsCollector reports it
        for path in files:
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                if "pid" not in record:
                    continue  # written by a runtime from before ranks recorded their pid
                rank, ts, pid = int(record["rank"]), float(record["ts"]), int(record["pid"])
                started = record.get("pid_start")
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as exc:
                if errors is not None:
                    errors.record("process_io", str(path), exc)
                continue
            if now - ts > max_age_s:
                continue
            if started is None or process_start_ticks(pid, root) != int(started):
                continue  # exited (or the pid was reused)
            for member in (pid, *_descendants(root, pid)):
                out.append(JobProcess(member, source.job, source.team, str(rank)))
    return out


def _descendants(proc: Path, pid: int, depth: int = 3) -> list[int]:
    """Children (and theirs, ``depth`` levels) from /proc/<pid>/task/*/children."""
    if depth == 0:
        return []
    children: list[int] = []
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    found = list(children)
    for child in children:
        found += _descendants(proc, child, depth - 1)
    return found
