"""GPU-hours of training jobs per team, user and UTC day, accounted from their attempts.

A mixin of :class:`tensoryard.store.Store`. Nothing new is stored: every attempt row already
says when its GPUs were allocated (``started_at``), when its workers ran (``running_at``) and
when it ended and why (``finished_at``, ``state``, ``reason``), so the hours are summed from
those rows at read time and can never drift from them. An attempt holds the job's GPUs
(``resources.nodes * resources.gpus_per_node`` of its spec) from launch to end; that time is
split into four kinds:

- ``useful``: running, in an attempt that was not cut short (it succeeded, is still running,
  or was cancelled by a person);
- ``restarts``: running, in an attempt that ended by a failure (crash, lost node, hang) and
  was restarted: the whole attempt counts, including work its last checkpoint kept (the
  goodput breakdown of a job says how much of it was redone);
- ``preemption``: running, in an attempt the scheduler preempted;
- ``idle``: allocated but not yet running (launch, image pull, rendezvous).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from tensoryard.errors import FieldIssue, SpecError
from tensoryard.store._inputs import as_utc
from tensoryard.store.models import Attempt, Job

__all__ = ["GPU_HOUR_KINDS", "GpuHoursMixin", "GpuHoursRow", "attempt_kind", "job_gpus"]

GPU_HOUR_KINDS = ("useful", "restarts", "preemption", "idle")
MAX_DAYS = 400
_FAILED = ("failed", "lost", "hung", "error")


@dataclass(frozen=True)
class GpuHoursRow:
    """GPU-hours of one team's user on one UTC day, by kind."""

    day: str  # YYYY-MM-DD (UTC)
    team: str
    user: str
    useful: float
    restarts: float
    preemption: float
    idle: float

    @property
    def total(self) -> float:
        return self.useful + self.restarts + self.preemption + self.idle


def job_gpus(spec: dict[str, Any]) -> int:
    """GPUs a job holds while an attempt runs: nodes x GPUs per node of its spec."""
    res = spec.get("resources") or {}
    try:
        return max(0, int(res.get("nodes") or 1) * int(res.get("gpus_per_node") or 0))
    except (TypeError, ValueError):
        return 0


def attempt_kind(state: str, reason: str, finished: bool) -> str:
    """The kind of an attempt's running time (see the module docstring)."""
    if reason.startswith("preempted"):
        return "preemption"
    if finished and (state in _FAILED or "hang" in reason or "hung" in reason):
        return "restarts"
    return "useful"


def _split_by_day(start: datetime, end: datetime) -> Iterable[tuple[str, float]]:
    """(UTC day, hours) pieces of [start, end)."""
    while start < end:
        midnight = datetime(start.year, start.month, start.day, tzinfo=UTC) + timedelta(days=1)
        stop = min(end, midnight)
        yield start.strftime("%Y-%m-%d"), (stop - start).total_seconds() / 3600.0
        start = stop


class GpuHoursMixin:
    """GPU-hours accounting. Needs ``_tx`` and ``_now``."""

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

    def gpu_hours(
        self,
        *,
        since: datetime,
        until: datetime | None = None,
        team: str | None = None,
        user: str | None = None,
        teams: Iterable[str] | None = None,
    ) -> list[GpuHoursRow]:
        """GPU-hours per (day, team, user) of attempts overlapping [since, until) (until: now),
        clipped to that window; ``teams`` limits the answer to what a caller may see. Sorted by
        day, team, user; only rows with hours in them."""
        now = self._now()
        since, until = as_utc(since), as_utc(until or now)
        if until <= since:
            raise SpecError([FieldIssue("since", "is not before until", "pass an earlier since")])
        if until - since > timedelta(days=MAX_DAYS):
            raise SpecError(
                [FieldIssue("since", f"window over {MAX_DAYS} days", "ask for a shorter window")]
            )
        query = (
            select(
                Attempt.state,
                Attempt.reason,
                Attempt.started_at,
                Attempt.running_at,
                Attempt.finished_at,
                Job.team,
                Job.user,
                Job.spec,
            )
            .join(Job, Job.id == Attempt.job_id)
            .where(
                Attempt.started_at < until,
                or_(Attempt.finished_at.is_(None), Attempt.finished_at > since),
            )
        )
        if team is not None:
            query = query.where(Job.team == team)
        if user is not None:
            query = query.where(Job.user == user)
        if teams is not None:
            query = query.where(Job.team.in_(sorted(set(teams))))
        sums: dict[tuple[str, str, str], dict[str, float]] = {}
        with self._tx("sum GPU-hours", write=False) as s:
            for row in s.execute(query):
                gpus = job_gpus(row.spec)
                if gpus == 0:
                    continue
                start = max(as_utc(row.started_at), since)
                end = min(as_utc(row.finished_at) if row.finished_at else now, until)
                running = as_utc(row.running_at) if row.running_at else end
                running = min(max(running, start), end)
                kind = attempt_kind(row.state, row.reason or "", row.finished_at is not None)
                for piece_start, piece_end, what in (
                    (start, running, "idle"),
                    (running, end, kind),
                ):
                    for day, hours in _split_by_day(piece_start, piece_end):
                        cell = sums.setdefault((day, row.team, row.user), {})
                        cell[what] = cell.get(what, 0.0) + hours * gpus
        return [
            GpuHoursRow(day, t, u, **{k: round(v.get(k, 0.0), 6) for k in GPU_HOUR_KINDS})
            for (day, t, u), v in sorted(sums.items())
        ]
