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

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple, Protocol

__all__ = [
    "AttemptTimes",
    "CheckpointAdvice",
    "GoodputBreakdown",
    "GoodputEstimate",
    "GoodputResult",
    "GoodputTracker",
    "StepRow",
    "StepTime",
    "combine_breakdowns",
    "compute_goodput",
    "goodput_breakdown",
    "resume_cuts",
    "young_daly_interval",
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


# -- where the allocated time went ------------------------------------------------------------


@dataclass(frozen=True)
class AttemptTimes:
    """What the control plane knows of one attempt's time (Unix seconds)."""

    started: float  # resources allocated (the attempt was launched)
    finished: float | None  # None: still running
    first_step_start: float | None  # when its first reported step began; None: no step
    last_step_end: float | None
    checkpoint_save_s: float = 0.0  # reported by the runtime: saves blocking training
    checkpoint_restore_s: float = 0.0  # reported by the runtime: loading the checkpoint
    hung: bool = False  # stopped by the control plane's hang detection
    admitted: float | None = None  # an external queue (Kueue) granted the resources; None:
    # at launch. From `started` to `admitted` it waited in that queue holding nothing.


@dataclass(frozen=True)
class GoodputBreakdown:
    """A job's (or a team's) time: productive steps kept, and every kind of badput.

    ``allocated_s`` is the time attempts held their resources; it is split exactly into
    ``productive_s + startup_s + checkpoint_save_s + checkpoint_restore_s + lost_s + hang_s +
    other_s`` (other: between steps, data waits, shutdown). Queueing and waiting for a restart
    hold no resources and are reported next to it, not inside it.
    """

    allocated_s: float
    productive_s: float
    goodput: float  # productive_s / allocated_s (0.0 when nothing was allocated yet)
    startup_s: float
    checkpoint_save_s: float
    checkpoint_restore_s: float
    lost_s: float  # steps redone after a restart from an older checkpoint
    hang_s: float  # from the last step to the end of an attempt stopped as hung
    other_s: float
    queueing_s: float  # submitted -> first attempt, plus each attempt's wait in Kueue's queue
    restart_wait_s: float  # between the end of an attempt and the start of the next

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def goodput_breakdown(
    submitted: float,
    attempts: Sequence[AttemptTimes],
    *,
    productive_s: float,
    lost_s: float,
    now: float,
) -> GoodputBreakdown:
    """Break a job's time down; `productive_s` and `lost_s` come from `compute_goodput`."""
    allocated = startup = save = restore = hang = wait = queued = 0.0
    previous_end: float | None = None
    for attempt in attempts:
        end = attempt.finished if attempt.finished is not None else now
        granted = attempt.started
        if attempt.admitted is not None:  # Kueue's wait: queueing, not the allocation's
            granted = min(max(attempt.admitted, attempt.started), end)
            queued += granted - attempt.started
        held = max(0.0, end - granted)
        allocated += held
        save += attempt.checkpoint_save_s
        restore += attempt.checkpoint_restore_s
        if attempt.first_step_start is None:
            startup += max(0.0, held - attempt.checkpoint_restore_s)
        else:
            before = attempt.first_step_start - granted - attempt.checkpoint_restore_s
            startup += min(held, max(0.0, before))
        if attempt.hung and attempt.last_step_end is not None:
            hang += max(0.0, end - attempt.last_step_end)
        if previous_end is not None:
            wait += max(0.0, attempt.started - previous_end)
        previous_end = end
    queueing = (attempts[0].started if attempts else now) - submitted + queued
    accounted = productive_s + startup + save + restore + lost_s + hang
    return GoodputBreakdown(
        allocated_s=allocated,
        productive_s=productive_s,
        goodput=productive_s / allocated if allocated > 0 else 0.0,
        startup_s=startup,
        checkpoint_save_s=save,
        checkpoint_restore_s=restore,
        lost_s=lost_s,
        hang_s=hang,
        other_s=max(0.0, allocated - accounted),
        queueing_s=max(0.0, queueing),
        restart_wait_s=wait,
    )


def combine_breakdowns(parts: Iterable[GoodputBreakdown]) -> GoodputBreakdown:
    """The sum of several jobs' breakdowns (a team's), goodput recomputed from the sums."""
    totals = dict.fromkeys(GoodputBreakdown.__dataclass_fields__, 0.0)
    for part in parts:
        for key, value in part.as_dict().items():
            totals[key] += value
    allocated = totals["allocated_s"]
    totals["goodput"] = totals["productive_s"] / allocated if allocated > 0 else 0.0
    return GoodputBreakdown(**totals)


# -- how often to checkpoint ------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointAdvice:
    """The checkpoint interval that maximises expected goodput for a failure rate."""

    interval_s: float  # time between saves
    interval_steps: int | None  # the same in steps (None without a step time)
    save_s: float  # cost of one save (training blocked)
    mtbf_s: float  # mean time between failures used
    source: str  # how mtbf_s was obtained, for people


def young_daly_interval(
    save_s: float, mtbf_s: float, *, step_s: float | None = None, source: str = ""
) -> CheckpointAdvice:
    """Daly's higher-order estimate of the optimal interval (Young's sqrt(2 delta M) plus
    corrections); M when the save costs more than 2M. Raises ValueError on non-positive input."""
    if save_s <= 0 or mtbf_s <= 0 or math.isnan(save_s) or math.isnan(mtbf_s):
        raise ValueError(f"save_s={save_s} and mtbf_s={mtbf_s} must both be positive")
    if save_s < 2 * mtbf_s:
        ratio = save_s / (2 * mtbf_s)
        interval = math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_s
    else:
        interval = mtbf_s
    steps = None
    if step_s is not None and step_s > 0:
        steps = max(1, round(interval / step_s))
    return CheckpointAdvice(interval, steps, save_s, mtbf_s, source)
