"""Summaries are exact for runs of any length (aggregate queries, not the first N rows)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from tensoryard.runtime.goodput import StepTime, compute_goodput
from tensoryard.server.summary import summarize
from tensoryard.spec.job import JobSpec
from tensoryard.store import Store


def test_a_summary_of_a_run_longer_than_any_page_matches_the_row_by_row_goodput(
    sqlite_store: Store, tmp_path: Path
) -> None:
    sqlite_store.ensure_team("default")
    spec = JobSpec(name="long", launcher="python", command=["x.py"])
    job = sqlite_store.create_job(spec, run_dir_root=tmp_path)
    sqlite_store.start_attempt(job.id, handle={})
    # Attempt 1 reaches step 70,000; attempt 2 resumes from the checkpoint at 60,000.
    first = [
        {"step": s, "ts": float(s), "step_time_s": 0.5, "values": {"loss": 10.0 - s / 1e4}}
        for s in range(1, 70_001)
    ]
    sqlite_store.add_metrics(job.id, 1, first)
    sqlite_store.start_attempt(job.id, handle={}, resumed_from_step=60_000)
    second = [
        {"step": s, "ts": float(s), "step_time_s": 0.25, "values": {"loss": 3.0 - s / 1e5}}
        for s in range(60_001, 110_001)
    ]
    sqlite_store.add_metrics(job.id, 2, second)

    summary = summarize(sqlite_store, job.id, now=datetime.now(UTC))

    rows = [StepTime(1, r["step"], 0.5) for r in first] + [
        StepTime(2, r["step"], 0.25) for r in second
    ]
    wall = summary.wall_s
    assert wall is not None
    expected = compute_goodput(rows, {1: None, 2: 60_000}, wall)
    assert summary.steps == 110_000
    assert summary.steps_lost == 10_000 == expected.steps_lost
    assert summary.goodput is not None
    assert abs(summary.goodput - expected.goodput) < 1e-9
    assert summary.initial_loss == 10.0 - 1 / 1e4
    assert summary.final_loss == 3.0 - 110_000 / 1e5
