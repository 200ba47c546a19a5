"""compute_goodput: which step rows count as kept, and the live GoodputTracker."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tensoryard.runtime.goodput import GoodputTracker, StepTime, compute_goodput


def rows(attempt: int, first: int, last: int, seconds: float = 1.0) -> list[StepTime]:
    return [StepTime(attempt, step, seconds) for step in range(first, last + 1)]


CASES = [
    # (rows, resumed_from, wall_s, kept, lost, productive_s, goodput)
    (rows(1, 1, 10), {1: None}, 20.0, 10, 0, 10.0, 0.5),
    (rows(1, 1, 13) + rows(2, 11, 20), {1: None, 2: 10}, 40.0, 20, 3, 20.0, 0.5),
    (rows(1, 1, 10) + rows(2, 11, 20), {1: None, 2: 10}, 20.0, 20, 0, 20.0, 1.0),
    (rows(1, 1, 7) + rows(2, 1, 10), {1: None, 2: None}, 17.0, 10, 7, 10.0, 10 / 17),
    (
        rows(1, 1, 25) + rows(2, 21, 28) + rows(3, 11, 30),
        {1: None, 2: 20, 3: 10},
        100.0,
        30,
        15 + 8,
        30.0,
        0.3,
    ),
    (rows(1, 1, 13) + rows(2, 11, 20), {}, 23.0, 20, 3, 20.0, 20 / 23),
    (rows(1, 1, 5, seconds=0.5), {1: None}, 0.0, 5, 0, 2.5, 0.0),
    ([StepTime(1, 1, None), StepTime(1, 2, 2.0)], {1: None}, 4.0, 2, 0, 2.0, 0.5),
    (rows(1, 1, 13), {1: None, 2: 10}, 20.0, 10, 3, 10.0, 0.5),
]
IDS = [
    "a single uninterrupted attempt keeps every step",
    "steps after the checkpoint a restart resumed from are lost",
    "a restart exactly at the checkpoint loses nothing",
    "a fresh restart without a checkpoint loses every earlier step",
    "a later restart from an older checkpoint also discards the middle attempt's steps",
    "a missing resume record is inferred from the attempt's first step",
    "zero wall time gives zero goodput instead of dividing by zero",
    "a row without a step time counts as kept with zero seconds",
    "a restarted attempt that reported nothing yet still cuts the earlier steps",
]


@pytest.mark.parametrize(
    ("steps", "resumed", "wall", "kept", "lost", "productive", "goodput"), CASES, ids=IDS
)
def test_goodput_counts_kept_and_lost_steps(
    steps: list[StepTime],
    resumed: dict[int, int | None],
    wall: float,
    kept: int,
    lost: int,
    productive: float,
    goodput: float,
) -> None:
    result = compute_goodput(steps, resumed, wall)
    assert (result.steps_kept, result.steps_lost) == (kept, lost)
    assert result.productive_s == pytest.approx(productive)
    assert result.lost_s == pytest.approx(sum(r.step_time_s or 0.0 for r in steps) - productive)
    assert result.goodput == pytest.approx(goodput)
    assert result.as_dict()["steps_lost"] == lost


def test_any_object_with_attempt_step_and_step_time_works_as_a_row() -> None:
    class Row:
        def __init__(self, attempt: int, step: int) -> None:
            self.attempt, self.step, self.step_time_s = attempt, step, 2.0

    result = compute_goodput([Row(1, 1), Row(1, 2), Row(2, 2)], {2: 1}, 8.0)
    assert (result.steps_kept, result.steps_lost, result.goodput) == (2, 1, 0.5)


def test_the_tracker_counts_steps_after_the_last_checkpoint_as_at_risk() -> None:
    now = [100.0]
    tracker = GoodputTracker(clock=lambda: now[0])
    for step in range(1, 6):
        tracker.step(step, 1.0)
    tracker.checkpointed(3)
    now[0] = 110.0
    estimate = tracker.estimate()
    assert estimate.steps == 5
    assert estimate.at_risk_s == pytest.approx(2.0)
    assert estimate.goodput == pytest.approx(0.5)
    assert estimate.goodput_if_failed == pytest.approx(0.3)
    assert estimate.last_checkpoint_step == 3


def imported_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    code = f"import sys; {statement}; print(','.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_importing_goodput_does_not_import_torch_or_the_web_framework() -> None:
    statement = "import tensoryard.runtime.goodput, tensoryard.runtime.report, tensoryard.runtime"
    assert imported_after(statement, ("torch", "fastapi", "uvicorn", "kubernetes")) == []


def test_the_whole_runtime_imports_torch_but_never_the_web_framework() -> None:
    statement = "from tensoryard.runtime import session, Checkpointer, init"
    assert imported_after(statement, ("torch", "fastapi", "uvicorn", "kubernetes")) == ["torch"]
