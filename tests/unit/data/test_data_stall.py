"""The per-rank data-loader wait as `tyard describe` shows it, from the files the runtime
writes (`RankStats`) in the job's run directory."""

from __future__ import annotations

import json
from pathlib import Path

from tensoryard.cli.jobs import _rank_data_wait, data_wait_line
from tensoryard.runtime.rank_stats import RankStats, read_rank_stats


def _write_ranks(run_dir: Path, waits: list[tuple[float, float]]) -> None:
    for rank, (step_s, wait_s) in enumerate(waits):
        RankStats(run_dir, rank, attempt=1).step(7, step_s, wait_s)


def test_each_ranks_last_step_is_read_back_with_its_share_of_waiting(tmp_path: Path) -> None:
    _write_ranks(tmp_path, [(0.5, 0.05), (0.5, 0.25)])
    rows = read_rank_stats(tmp_path)
    assert [r["rank"] for r in rows] == [0, 1]
    assert [r["step"] for r in rows] == [7, 7]
    assert [round(r["data_wait_share"], 3) for r in rows] == [0.1, 0.5]


def test_the_describe_line_names_the_stalled_rank_first_and_the_alert(tmp_path: Path) -> None:
    _write_ranks(tmp_path, [(0.5, 0.05), (0.5, 0.25), (0.4, 0.0)])
    line = data_wait_line(_rank_data_wait({"run_dir": str(tmp_path)}))
    assert line.startswith("data loader wait in the last step: rank 1 0.250s of 0.500s (50%)")
    assert "1 rank(s) stalled on data (over 30% of the step: JobDataLoaderStall)" in line


def test_ranks_that_keep_up_are_reported_as_such(tmp_path: Path) -> None:
    _write_ranks(tmp_path, [(0.5, 0.01)] * 6)
    line = data_wait_line(read_rank_stats(tmp_path), shown=4)
    assert line.endswith("(2%) and 2 more; no rank over 30%")


def test_a_half_written_rank_file_is_skipped_and_a_missing_run_dir_shows_nothing(
    tmp_path: Path,
) -> None:
    _write_ranks(tmp_path, [(0.5, 0.1)])
    (tmp_path / "ranks" / "rank-1.json").write_text('{"rank": 1, "step_ti')
    (tmp_path / "ranks" / "rank-2.json").write_text(json.dumps({"rank": 2}))
    assert [r["rank"] for r in read_rank_stats(tmp_path)] == [0]
    assert _rank_data_wait({"run_dir": str(tmp_path / "elsewhere")}) is None
    assert data_wait_line(None) == ""
