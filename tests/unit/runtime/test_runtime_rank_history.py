"""A rank's numbers over steps: appended by RankStats at each write, per attempt, and read back
by `read_rank_history` (the console's per-rank plots), torn lines skipped."""

from __future__ import annotations

from pathlib import Path

from tensoryard.runtime.rank_stats import RankStats, rank_history_path, read_rank_history


def test_every_write_appends_to_its_attempts_history_and_reads_back_by_rank(
    tmp_path: Path,
) -> None:
    now = [0.0]
    for rank in (1, 0):
        stats = RankStats(tmp_path, rank, 2, every_s=1.0, clock=lambda: now[0], wall=lambda: 7.0)
        for step in range(1, 5):
            now[0] += 0.5  # written every other step
            stats.step(step, 0.5 + rank, 0.1)
    RankStats(tmp_path, 0, 3, clock=lambda: 99.0).step(1, 9.0, 9.0)  # another attempt
    assert read_rank_history(tmp_path, 2) == {
        0: [(1, 0.5, 0.1, 7.0), (3, 0.5, 0.1, 7.0)],
        1: [(1, 1.5, 0.1, 7.0), (3, 1.5, 0.1, 7.0)],
    }
    assert list(read_rank_history(tmp_path, 3)) == [0]
    assert read_rank_history(tmp_path, 4) == {}
    assert read_rank_history(tmp_path / "nowhere", 1) == {}


def test_a_torn_line_and_a_cut_tail_are_skipped(tmp_path: Path) -> None:
    path = rank_history_path(tmp_path, 1, 0)
    path.parent.mkdir(parents=True)
    path.write_text("[1, 0.5, 0.1, 1.0]\n[2, 0.5, 0.1, 2.0]\n[3, 0.5, 0.1, 3.0]\n[4, 0.5")
    assert [row[0] for row in read_rank_history(tmp_path, 1)[0]] == [1, 2, 3]
    # the last 30 bytes start inside line 2: only line 3 is whole
    assert [row[0] for row in read_rank_history(tmp_path, 1, tail_bytes=30)[0]] == [3]
