"""Goodput: the share of wall time spent in training steps whose results were kept.

Pure Python (no torch): the control plane imports this module to compute a job's goodput from
the step rows it stored, and the in-job runtime uses `GoodputTracker` for a live estimate.

The rule (docs/contracts.md, section 3): a step row of attempt *a* is **kept** unless a later
attempt resumed from a step below it. Resuming from step ``r`` means the checkpoint holds the
state after step ``r``, so rows with ``step > r`` written by earlier attempts are recomputed and
count as lost. A later attempt that started fresh (``resumed_from_step`` is ``None``) discards
every row of the attempts before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

__all__ = [
    "GoodputEstimate",
    "GoodputResult",
    "GoodputTracker",
    "StepRow",
    "StepTime",
    "compute_goodput",
    "resume_cuts",
]


class StepRow(Protocol):
    """What `compute_goodput` needs from a stored step row (any object with these fields)."""

    @property
    def attempt(self) -> int: ...

    @property
    def step(self) -> int: ...

    @property
    def step_time_s(self) -> float | None: ...


class StepTime(NamedTuple):
    """A minimal `StepRow`: which attempt ran which step, and how long it took."""

    attempt: int
    step: int
    step_time_s: float | None


@dataclass(frozen=True)
class GoodputResult:
    """Goodput of a job (or of the part of it seen so far)."""

    goodput: float  # productive_s / wall_s; 0.0 when wall_s is not positive
    productive_s: float  # time in kept steps
    steps_kept: int
    steps_lost: int  # rows recomputed by a later attempt
    lost_s: float  # time in lost steps
    wall_s: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "goodput": self.goodput,
            "productive_s": self.productive_s,
            "steps_kept": self.steps_kept,
            "steps_lost": self.steps_lost,
            "lost_s": self.lost_s,
            "wall_s": self.wall_s,
        }


_FRESH = float("-inf")  # "resumed from nothing": below every step


def resume_cuts(
    first_step: Mapping[int, int], resumed_from: Mapping[int, int | None]
) -> dict[int, float]:
    """Attempt -> its cut: rows of that attempt with ``step > cut`` were recomputed later.

    The cut is the lowest resume point of any later attempt. ``first_step`` is each attempt's
    first reported step (it stands in for a resume point that was never recorded)."""
    points = _resume_points(first_step, resumed_from)
    cut: dict[int, float] = {}
    lowest_later = float("inf")
    for attempt in sorted(points, reverse=True):
        cut[attempt] = lowest_later
        lowest_later = min(lowest_later, points[attempt])
    return cut


def _resume_points(
    first_step: Mapping[int, int], resumed_from: Mapping[int, int | None]
) -> dict[int, float]:
    """Step each attempt resumed from; inferred from its first row when not recorded."""
    points: dict[int, float] = {}
    for attempt in set(first_step) | set(resumed_from):
        if attempt in resumed_from:
            value = resumed_from[attempt]
            points[attempt] = _FRESH if value is None else float(value)
        else:
            # No record (e.g. the report was lost): the attempt evidently restarted just
            # before the first step it ran.
            points[attempt] = float(first_step[attempt] - 1)
    return points


def compute_goodput(
    steps: Iterable[StepRow], resumed_from: Mapping[int, int | None], wall_s: float
) -> GoodputResult:
    """Goodput of a job from its step rows.

    Args:
        steps: one row per (attempt, step) the job reported; ``step_time_s`` None counts as 0.
        resumed_from: attempt -> the step it resumed from (None: started fresh). Attempts
            missing here are assumed to have resumed just before their first reported step.
        wall_s: wall time of the job (first attempt start to end, restarts included).
    """
    rows = list(steps)
    first_step: dict[int, int] = {}
    for row in rows:
        first_step[row.attempt] = min(first_step.get(row.attempt, row.step), row.step)
    cut = resume_cuts(first_step, resumed_from)
    kept = lost = 0
    productive = lost_s = 0.0
    for row in rows:
        seconds = float(row.step_time_s or 0.0)
        if row.step > cut[row.attempt]:
            lost += 1
            lost_s += seconds
        else:
            kept += 1
            productive += seconds
    goodput = productive / wall_s if wall_s > 0 else 0.0
    return GoodputResult(goodput, productive, kept, lost, lost_s, float(wall_s))


@dataclass(frozen=True)
class GoodputEstimate:
    """Live view of the current attempt."""

    elapsed_s: float  # since the attempt started
    productive_s: float  # time in steps of this attempt
    at_risk_s: float  # time in steps after the last checkpoint (lost if we die now)
    steps: int
    last_checkpoint_step: int | None

    @property
    def goodput(self) -> float:
        """Goodput of this attempt if it finished now (steps at risk still count)."""
        return self.productive_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def goodput_if_failed(self) -> float:
        """Goodput of this attempt if it died now and a restart resumed from the checkpoint."""
        kept = self.productive_s - self.at_risk_s
        return kept / self.elapsed_s if self.elapsed_s > 0 else 0.0


class GoodputTracker:
    """Accumulates step times of the running attempt for a live goodput estimate."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self._productive = 0.0
        self._since_checkpoint: dict[int, float] = {}
        self._steps = 0
        self._last_checkpoint: int | None = None

    def step(self, step: int, step_time_s: float) -> None:
        """Record one finished step."""
        self._steps += 1
        self._productive += step_time_s
        self._since_checkpoint[step] = step_time_s

    def checkpointed(self, step: int) -> None:
        """Steps up to `step` are now safe in a checkpoint."""
        self._last_checkpoint = step
        self._since_checkpoint = {s: t for s, t in self._since_checkpoint.items() if s > step}

    def estimate(self) -> GoodputEstimate:
        return GoodputEstimate(
            elapsed_s=self._clock() - self._started,
            productive_s=self._productive,
            at_risk_s=sum(self._since_checkpoint.values()),
            steps=self._steps,
            last_checkpoint_step=self._last_checkpoint,
        )
