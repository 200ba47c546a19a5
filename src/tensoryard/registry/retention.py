"""Checkpoint retention: which of a job's checkpoints to keep (keep last N, best by a metric,
every K steps) and which to delete. The plan is pure; `ModelRegistry.apply_retention` does the
deleting.

The newest checkpoint is always kept (it is where a restart resumes), and so is every step that
was promoted to a model version (``pinned``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tensoryard.errors import FieldIssue, SpecError
from tensoryard.store import CheckpointRecord

__all__ = ["RetentionPlan", "RetentionPolicy", "plan_retention"]


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """What to keep; a checkpoint kept by any rule stays. No rule at all keeps everything."""

    keep_last: int | None = None
    """Keep the newest N checkpoints (by step)."""
    keep_best: int | None = None
    """Keep the N best checkpoints by `metric` (steps without the metric never count)."""
    metric: str | None = None
    """The metric `keep_best` ranks by, as reported at the checkpoint's step (e.g. eval_loss)."""
    mode: Literal["min", "max"] = "min"
    """Whether lower (`min`, a loss) or higher (`max`, an accuracy) is better."""
    keep_every: int | None = None
    """Keep checkpoints whose step is a multiple of K."""

    def __post_init__(self) -> None:
        issues = [
            FieldIssue(name, f"must be at least 1, not {value}", f"set {name} >= 1 or leave it out")
            for name, value in (
                ("keep_last", self.keep_last),
                ("keep_best", self.keep_best),
                ("keep_every", self.keep_every),
            )
            if value is not None and value < 1
        ]
        if self.keep_best is not None and not self.metric:
            issues.append(FieldIssue("metric", "keep_best needs a metric", "e.g. metric=eval_loss"))
        if self.mode not in ("min", "max"):
            issues.append(FieldIssue("mode", f"{self.mode!r} is not min or max", "use min or max"))
        if issues:
            raise SpecError(issues, source="retention policy")


@dataclass(frozen=True)
class RetentionPlan:
    keep: tuple[CheckpointRecord, ...]
    delete: tuple[CheckpointRecord, ...]
    reasons: dict[int, list[str]] = field(default_factory=dict)
    """Why each kept step is kept: "newest", "last 3", "best 2 by eval_loss", "every 100",
    "registered"."""


def plan_retention(
    checkpoints: Sequence[CheckpointRecord],
    metrics: Mapping[int, Mapping[str, float]],
    policy: RetentionPolicy,
    *,
    pinned: Iterable[int] = (),
) -> RetentionPlan:
    """Split ``checkpoints`` into kept and deleted; ``metrics`` maps step -> reported values."""
    if not checkpoints:
        return RetentionPlan((), ())
    by_step = sorted(checkpoints, key=lambda c: (c.step, c.ts))
    reasons: dict[int, list[str]] = {}

    def keep(step: int, why: str) -> None:
        reasons.setdefault(step, []).append(why)

    keep(by_step[-1].step, "newest")
    for step in set(pinned):
        keep(step, "registered")
    steps = sorted({c.step for c in by_step})
    no_rule = policy.keep_last is None and policy.keep_best is None and policy.keep_every is None
    for step in steps:
        if no_rule:
            keep(step, "no retention rule")
        if policy.keep_every is not None and step % policy.keep_every == 0:
            keep(step, f"every {policy.keep_every}")
    if policy.keep_last is not None:
        for step in steps[-policy.keep_last :]:
            keep(step, f"last {policy.keep_last}")
    if policy.keep_best is not None and policy.metric:
        scored = [
            (metrics[s][policy.metric], s) for s in steps if policy.metric in metrics.get(s, {})
        ]
        scored.sort(reverse=policy.mode == "max")
        for _, step in scored[: policy.keep_best]:
            keep(step, f"best {policy.keep_best} by {policy.metric}")
    kept = tuple(c for c in by_step if c.step in reasons)
    dropped = tuple(c for c in by_step if c.step not in reasons)
    return RetentionPlan(kept, dropped, reasons)
