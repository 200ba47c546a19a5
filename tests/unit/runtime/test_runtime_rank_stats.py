"""Per-rank step time and data-loader wait: measured by `Session.batches`, written by
RankStats for the node agent, read back by its RankStatsCollector."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from test_runtime_session import build, job_env

from tensoryard.observability import CollectorErrors
from tensoryard.observability.ranks import RankStatsCollector, RankStatsSource, rank_processes
from tensoryard.observability.storage import ProcessIoCollector
from tensoryard.runtime import session
from tensoryard.runtime.rank_stats import RankStats, rank_stats_path, read_rank_history


def slow_loader(n: int, wait_s: float) -> Iterator[torch.Tensor]:
    for _ in range(n):
        time.sleep(wait_s)
        yield torch.ones(2, 4)


def test_a_session_writes_each_ranks_step_time_and_data_wait_to_the_run_dir(
    tmp_path: Path,
) -> None:
    with session(env=job_env(tmp_path, attempt=2)) as sess:
        model, opt = build()
        batches = sess.batches(slow_loader(3, 0.05))
        for step in sess.loop(3, model, opt):
            loss = (model(next(batches)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sess.report(step, loss=loss.item())
    record = json.loads(rank_stats_path(tmp_path / "run", 0).read_text())
    assert record["rank"] == 0 and record["attempt"] == 2
    assert record["step"] == 1  # written at most once a second: the first step
    assert 0.05 <= record["data_wait_s"] <= record["step_time_s"]


def test_the_job_env_sets_how_often_ranks_write_and_each_write_joins_the_history(
    tmp_path: Path,
) -> None:
    env = job_env(tmp_path, attempt=3, TYARD_RANK_STATS_EVERY_MS="10")
    with session(env=env) as sess:
        model, opt = build()
        batches = sess.batches(slow_loader(4, 0.02))  # every step longer than 10 ms
        for step in sess.loop(4, model, opt):
            loss = (model(next(batches)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sess.report(step, loss=loss.item())
    [(rank, rows)] = read_rank_history(tmp_path / "run", 3).items()
    assert rank == 0 and [row[0] for row in rows] == [1, 2, 3, 4]
    assert all(0.02 <= wait <= step_s for _, step_s, wait, _ in rows)


def test_rank_stats_are_written_at_most_once_per_interval_and_never_fail_the_step(
    tmp_path: Path,
) -> None:
    now = [100.0]
    stats = RankStats(tmp_path, 3, 1, every_s=1.0, clock=lambda: now[0], wall=lambda: 5.0)
    stats.step(1, 0.5, 0.1)
    stats.step(2, 0.5, 0.2)
    assert json.loads(rank_stats_path(tmp_path, 3).read_text())["step"] == 1
    now[0] += 1.0
    stats.step(3, 0.7, 0.3)
    assert json.loads(rank_stats_path(tmp_path, 3).read_text())["data_wait_s"] == 0.3
    blocked = tmp_path / "file"
    blocked.write_text("")
    RankStats(blocked, 0, 1).step(1, 1.0, 0.0)  # run dir is a file: silently off


def _at(ts: float) -> Callable[[], float]:
    return lambda: ts


def test_the_collector_exports_fresh_ranks_and_counts_broken_files(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    for rank, ts in ((0, 1000.0), (1, 990.0), (2, 100.0)):  # rank 2: an earlier attempt
        RankStats(tmp_path, rank, 1, wall=_at(ts)).step(7, 1.5 + rank, 0.25 * rank)
    (ranks / "rank-9.json").write_text("{not json")
    errors = CollectorErrors()
    collector = RankStatsCollector(
        lambda: [
            RankStatsSource(ranks, "12", "nlp"),
            RankStatsSource(tmp_path / "missing", "13", "nlp"),
        ],
        wall=lambda: 1000.0,
        max_age_s=300,
        errors=errors,
    )
    got = {
        (f.name, s.labels["rank"]): s.value
        for f in collector.collect()
        for s in f.samples
        if s.labels["job"] == "12"
    }
    assert got == {
        ("tyard_job_rank_step_time_seconds", "0"): 1.5,
        ("tyard_job_rank_step_time_seconds", "1"): 2.5,
        ("tyard_job_data_wait_seconds", "0"): 0.0,
        ("tyard_job_data_wait_seconds", "1"): 0.25,
    }
    assert errors.count("ranks") == 1


def _rank_file(directory: Path, rank: int, **fields: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "attempt": 1, "step": 1, "step_time_s": 1.0, "data_wait_s": 0.0}
    (directory / f"rank-{rank}.json").write_text(json.dumps({**record, **fields}))


def test_the_agent_counts_each_ranks_process_io_with_its_workers_from_the_real_proc(
    tmp_path: Path,
) -> None:
    """A rank (a real process that starts a worker, as a DataLoader does) writes its pid with
    RankStats; the agent's ProcessIoCollector sums /proc/<pid>/io of it and its worker."""
    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * 3_000_000)
    ready = tmp_path / "ready"
    script = (
        "import os, subprocess, sys, time\n"
        "from tensoryard.runtime.rank_stats import RankStats\n"
        f"worker = subprocess.Popen([sys.executable, '-c', "
        f"\"open({str(data)!r}, 'rb').read(); import time; time.sleep(60)\"])\n"
        f"RankStats({str(tmp_path)!r}, 1, 1).step(5, 0.5, 0.0)\n"
        f"open({str(data)!r}, 'rb').read()\n"
        "time.sleep(1)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert rank.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        source = RankStatsSource(tmp_path / "ranks", "12", "nlp")
        # a rank file from an older runtime (no pid), one whose pid was reused, a stale one
        _rank_file(tmp_path / "ranks", 2)
        _rank_file(tmp_path / "ranks", 3, pid=rank.pid, pid_start=1, ts=time.time())
        _rank_file(tmp_path / "ranks", 4, pid=rank.pid, pid_start=None, ts=time.time())
        processes = rank_processes([source])
        assert {p.pid for p in processes if p.rank == "1"} >= {rank.pid}
        assert len(processes) == 2 and {p.rank for p in processes} == {"1"}  # rank + worker
        errors = CollectorErrors()
        io = {
            (s.name, s.labels["rank"]): s.value
            for f in ProcessIoCollector(lambda: processes, errors=errors).collect()
            for s in f.samples
            if s.labels["job"] == "12"
        }
        assert io[("tyard_job_io_read_chars_total", "1")] >= 2 * 3_000_000  # both read it
        assert errors.count("process_io") == 0
        stale = rank_processes([source], wall=lambda: time.time() + 3600)
        assert stale == []  # the file is an hour old: an earlier attempt's
    finally:
        for child in _children(rank.pid):
            os.kill(child, signal.SIGKILL)
        rank.kill()
        rank.wait()


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out
