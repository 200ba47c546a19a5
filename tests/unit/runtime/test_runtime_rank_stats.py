"""Per-rank step time and data-loader wait: measured by `Session.batches`, written by
RankStats for the node agent, read back by its RankStatsCollector."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from test_runtime_session import build, job_env

from tensoryard.observability import CollectorErrors
from tensoryard.observability.ranks import RankStatsCollector, RankStatsSource
from tensoryard.runtime import session
from tensoryard.runtime.rank_stats import RankStats, rank_stats_path


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


def test_the_collector_exports_fresh_ranks_and_counts_broken_files(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    for rank, ts in ((0, 1000.0), (1, 990.0), (2, 100.0)):  # rank 2: an earlier attempt
        RankStats(tmp_path, rank, 1, wall=lambda ts=ts: ts).step(7, 1.5 + rank, 0.25 * rank)
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
