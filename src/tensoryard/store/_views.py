"""Read-only queries behind the web console's pages, one transaction each.

A mixin of :class:`tensoryard.store.Store`. The queue is read in the order the scheduler
expects to start the jobs (estimated start first, then priority, then age), a page at a time,
so a page costs the same with ten jobs as with ten thousand.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session

from tensoryard.spec.states import JobState
from tensoryard.store import _rows
from tensoryard.store._inputs import as_utc
from tensoryard.store.models import Job
from tensoryard.store.records import JobRecord

__all__ = ["ConsoleViewsMixin"]

ACTIVE = (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING)


class ConsoleViewsMixin:
    """Queue pages and active jobs for the console. Needs ``_tx``."""

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

    def queue_page(
        self,
        *,
        pending: bool,
        offset: int = 0,
        limit: int = 50,
        team: str | None = None,
        user: str | None = None,
        teams: Iterable[str] | None = None,
    ) -> tuple[list[JobRecord], int]:
        """One page of the pending jobs in expected start order (estimated start, unknown
        estimates last, then higher priority, then older), or of the active jobs (longest
        running first); and how many there are in all."""
        states = [JobState.PENDING] if pending else list(ACTIVE)
        where: list[ColumnElement[bool]] = [Job.state.in_([s.value for s in states])]
        if team is not None:
            where.append(Job.team == team)
        if user is not None:
            where.append(Job.user == user)
        if teams is not None:
            where.append(Job.team.in_(sorted(set(teams))))
        if pending:
            order = [
                case((Job.pending_eta.is_(None), 1), else_=0),
                Job.pending_eta,
                Job.priority.desc(),
                Job.id,
            ]
        else:
            order = [Job.started_at, Job.id]
        with self._tx("read a queue page", write=False) as s:
            total = s.scalar(select(func.count()).select_from(Job).where(*where)) or 0
            # Sort ids only, then read the page's rows: sorting whole rows (specs included)
            # of a 10,000-job backlog costs tens of times more.
            ids = list(
                s.scalars(select(Job.id).where(*where).order_by(*order).offset(offset).limit(limit))
            )
            rows = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(ids)))} if ids else {}
            return [_rows.job_record(rows[i]) for i in ids if i in rows], int(total)

    def active_placements(self) -> list[tuple[int, str, str, dict[str, list[int]]]]:
        """(id, team, user, placement) of every job holding capacity; no specs are read."""
        query = select(Job.id, Job.team, Job.user, Job.placement).where(
            Job.state.in_([s.value for s in ACTIVE])
        )
        with self._tx("read placements", write=False) as s:
            return [(i, t, u, dict(p or {})) for i, t, u, p in s.execute(query)]

    def job_changes(
        self, since: datetime
    ) -> tuple[list[tuple[int, str, str, datetime | None]], datetime]:
        """(id, team, state, changed_at) of the jobs written at or after ``since`` (no specs
        are read: a deep backlog whose estimates move every cycle stays cheap), and the
        store's now at the start of the read."""
        with self._tx("read job changes", write=False) as s:
            now = self._now()
            query = select(Job.id, Job.team, Job.state, Job.changed_at).where(
                Job.changed_at >= as_utc(since)
            )
            return [(i, t, st, c) for i, t, st, c in s.execute(query)], now

    def newest_change(self) -> datetime | None:
        """The newest ``changed_at`` of any job (the live views start from it)."""
        with self._tx("read the newest job change", write=False) as s:
            return s.scalar(select(func.max(Job.changed_at)))
