"""StragglerDetector (pure) and ForwardTimer (real module hooks on the CPU)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from tensoryard.runtime.stragglers import ForwardTimer, StragglerDetector, flagged_ranks


def test_a_rank_persistently_above_the_factor_is_named_once_then_its_recovery() -> None:
    detector = StragglerDetector(factor=1.3, windows=3)
    slow = [0.10, 0.10, 0.15, 0.10]  # rank 2 at 1.5x the others' median
    assert detector.observe(slow) == []
    assert detector.observe(slow) == []
    (event,) = detector.observe(slow)
    assert (event.rank, event.started) == (2, True) and event.ratio == pytest.approx(1.5)
    assert "straggler: rank 2" in event.message and "1.50x" in event.message
    assert detector.observe(slow) == []  # named once
    assert detector.stragglers == {2}
    (back,) = detector.observe([0.10, 0.10, 0.11, 0.10])
    assert (back.rank, back.started) == (2, False) and "recovered" in back.message
    assert detector.stragglers == frozenset()


def test_a_blip_below_the_window_is_not_a_straggler() -> None:
    detector = StragglerDetector(factor=1.3, windows=3)
    for times in ([1.0, 2.0], [1.0, 2.0], [1.0, 1.0], [1.0, 2.0], [1.0, 2.0]):
        assert detector.observe(times) == []


def test_within_the_factor_is_fine_and_one_rank_has_no_peers() -> None:
    detector = StragglerDetector(factor=1.3, windows=1)
    assert detector.observe([1.0, 1.29]) == []
    assert detector.observe([5.0]) == []
    assert [e.rank for e in detector.observe([1.0, 1.31])] == [1]


@pytest.mark.parametrize(("factor", "windows"), [(1.0, 3), (1.3, 0)], ids=["factor 1", "0 windows"])
def test_a_detector_that_could_never_be_right_is_refused(factor: float, windows: int) -> None:
    with pytest.raises(ValueError, match="must be > 1"):
        StragglerDetector(factor=factor, windows=windows)


class Sleepy(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.linear(x)


def test_the_forward_timer_measures_the_mean_forward_time_and_resets() -> None:
    model = Sleepy(0.02)
    timer = ForwardTimer(model)
    assert timer.take() is None
    for _ in range(3):
        model(torch.zeros(1, 4))
    mean = timer.take()
    assert mean is not None and 0.02 <= mean < 0.2
    assert timer.take() is None
    timer.close()
    model(torch.zeros(1, 4))
    assert timer.take() is None  # hooks removed


def test_the_ranks_still_flagged_are_read_back_from_the_detectors_own_event_messages() -> None:
    detector = StragglerDetector(factor=1.3, windows=1)
    named = detector.observe([0.10, 0.20, 0.30])  # ranks 1 and 2 above 1.3x the others
    back = detector.observe([0.10, 0.10, 0.30])  # rank 1 recovers
    messages = [e.message for e in named + back]
    assert flagged_ranks(["checkpoint at step 5", *messages]) == {2: named[-1].message}
    assert flagged_ranks(["a straggler: rank 9 said this in the middle"]) == {}
