"""Where a job's time went (goodput_breakdown, combine_breakdowns) and the Young/Daly interval."""

from __future__ import annotations

import math

import pytest

from tensoryard.runtime.goodput import (
    AttemptTimes,
    combine_breakdowns,
    goodput_breakdown,
    young_daly_interval,
)


def test_a_crash_and_a_resume_split_the_allocated_time_exactly() -> None:
    attempts = [
        AttemptTimes(
            started=10, finished=30, first_step_start=15, last_step_end=23,
            checkpoint_save_s=0.5,
        ),
        AttemptTimes(
            started=33, finished=45, first_step_start=36, last_step_end=40,
            checkpoint_save_s=0.25, checkpoint_restore_s=1.0,
        ),
    ]  # fmt: skip
    b = goodput_breakdown(0.0, attempts, productive_s=10.0, lost_s=3.0, now=100.0)
    assert b.allocated_s == 32.0 and b.productive_s == 10.0
    assert b.goodput == pytest.approx(10 / 32)
    assert (b.startup_s, b.checkpoint_save_s, b.checkpoint_restore_s) == (7.0, 0.75, 1.0)
    assert (b.lost_s, b.hang_s) == (3.0, 0.0)
    assert b.other_s == pytest.approx(32 - 10 - 7 - 0.75 - 1 - 3)
    assert (b.queueing_s, b.restart_wait_s) == (10.0, 3.0)


def test_an_attempt_stopped_as_hung_counts_from_its_last_step_to_its_end_as_hang() -> None:
    hung = AttemptTimes(started=0, finished=100, first_step_start=1, last_step_end=40, hung=True)
    b = goodput_breakdown(0.0, [hung], productive_s=39.0, lost_s=0.0, now=200.0)
    assert b.hang_s == 60.0 and b.startup_s == 1.0 and b.other_s == 0.0


def test_a_running_attempt_is_counted_up_to_now_and_one_without_steps_is_all_startup() -> None:
    running = AttemptTimes(started=50, finished=None, first_step_start=None, last_step_end=None)
    b = goodput_breakdown(20.0, [running], productive_s=0.0, lost_s=0.0, now=80.0)
    assert (b.allocated_s, b.startup_s, b.queueing_s, b.goodput) == (30.0, 30.0, 30.0, 0.0)


def test_the_wait_in_kueues_queue_is_queueing_not_startup() -> None:
    """Under --admission kueue an attempt is launched suspended and waits for Kueue: from its
    launch to Kueue's admission it holds nothing (the second attempt waited after an eviction)."""
    attempts = [
        AttemptTimes(started=10, finished=60, first_step_start=45, last_step_end=60, admitted=40),
        AttemptTimes(started=62, finished=None, first_step_start=None, last_step_end=None,
                     admitted=90),
    ]  # fmt: skip
    b = goodput_breakdown(0.0, attempts, productive_s=15.0, lost_s=0.0, now=100.0)
    assert b.allocated_s == 20.0 + 10.0  # 40..60 and 90..100
    assert b.startup_s == 5.0 + 10.0  # admission to the first step; the second has no step
    assert b.queueing_s == 10.0 + 30.0 + 28.0  # before the launch, then Kueue twice
    assert b.restart_wait_s == 2.0
    assert b.goodput == pytest.approx(15 / 30)
    early = AttemptTimes(started=10, finished=20, first_step_start=None, last_step_end=None,
                         admitted=5)  # fmt: skip
    assert goodput_breakdown(0.0, [early], productive_s=0, lost_s=0, now=30).allocated_s == 10.0


def test_a_job_still_queued_has_only_queueing() -> None:
    b = goodput_breakdown(20.0, [], productive_s=0.0, lost_s=0.0, now=80.0)
    assert (b.allocated_s, b.queueing_s, b.goodput) == (0.0, 60.0, 0.0)


def test_a_team_total_recomputes_goodput_from_the_sums() -> None:
    one = AttemptTimes(started=0, finished=10, first_step_start=0, last_step_end=10)
    a = goodput_breakdown(0.0, [one], productive_s=10.0, lost_s=0.0, now=10.0)
    two = AttemptTimes(started=0, finished=30, first_step_start=0, last_step_end=30)
    b = goodput_breakdown(0.0, [two], productive_s=0.0, lost_s=30.0, now=30.0)
    total = combine_breakdowns([a, b])
    assert total.allocated_s == 40.0 and total.lost_s == 30.0
    assert total.goodput == pytest.approx(10 / 40)  # not the mean of 1.0 and 0.0


def test_young_daly_is_close_to_youngs_rule_when_saves_are_cheap() -> None:
    advice = young_daly_interval(10.0, 86_400.0, step_s=2.0, source="test")
    young = math.sqrt(2 * 10.0 * 86_400.0)
    assert advice.interval_s == pytest.approx(young, rel=0.01)
    assert advice.interval_s != young  # Daly's correction terms are applied
    assert advice.interval_steps == round(advice.interval_s / 2.0)
    assert advice.source == "test"


def test_young_daly_matches_dalys_formula() -> None:
    delta, mtbf = 60.0, 3600.0
    r = delta / (2 * mtbf)
    expected = math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(r) / 3 + r / 9) - delta
    assert young_daly_interval(delta, mtbf).interval_s == pytest.approx(expected)


def test_a_save_longer_than_twice_the_mtbf_checkpoints_every_mtbf() -> None:
    advice = young_daly_interval(100.0, 40.0, step_s=1000.0)
    assert advice.interval_s == 40.0 and advice.interval_steps == 1  # at least one step


@pytest.mark.parametrize(
    ("save_s", "mtbf_s"), [(0.0, 10.0), (1.0, 0.0), (-1.0, 5.0), (math.nan, 5.0)],
    ids=["free save", "no mtbf", "negative save", "nan save"],
)  # fmt: skip
def test_non_positive_inputs_are_refused(save_s: float, mtbf_s: float) -> None:
    with pytest.raises(ValueError, match="must both be positive"):
        young_daly_interval(save_s, mtbf_s)
