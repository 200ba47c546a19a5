"""Checkpoint retention's rows: retire checkpoints (row out, intent in, event) in one
transaction, then mark each removal done once its files are gone.

A mixin of :class:`tensoryard.store.Store` (same transactions, clock and error translation).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tensoryard.store._rows import RowReader
from tensoryard.store.models import Checkpoint, CheckpointRemoval, Job, Metric

if TYPE_CHECKING:
    from tensoryard.store.models import Event

__all__ = ["CheckpointRemovalRecord", "RetentionMixin", "Retirement"]


@dataclass(frozen=True)
class Retirement:
    """One checkpoint to retire: its (step, path) and whether its files may be deleted."""

    step: int
    path: str
    delete_files: bool


@dataclass(frozen=True)
class CheckpointRemovalRecord:
    """A checkpoint retention removed; ``removed_at`` is None until its files are gone."""

    id: int
    job_id: int
    step: int
    path: str
    size_bytes: int | None
    delete_files: bool
    retired_at: datetime
    removed_at: datetime | None


_record = RowReader(CheckpointRemovalRecord, CheckpointRemoval)


class RetentionMixin:
    """Retire checkpoints and track their removal. Needs ``_tx``, ``_now`` and ``_event``."""

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

        def _event(
            self, s: Session, job_id: int, kind: str, message: str, *, attempt: int | None = None
        ) -> Event: ...

    def retire_checkpoints(
        self, job_id: int, retire: Sequence[Retirement], *, message: str
    ) -> list[CheckpointRemovalRecord]:
        """Delete the rows of ``retire`` and record their removal intents and the event
        ``message``, all in one transaction. Rows already gone (another report retired them)
        are skipped; returns the removals this call recorded (none: no event either)."""
        now = self._now()
        out: list[CheckpointRemovalRecord] = []
        with self._tx(f"retire checkpoints of job {job_id}", write=True) as s:
            s.scalars(select(Job).where(Job.id == job_id).with_for_update()).first()
            for item in retire:
                row = s.scalars(
                    select(Checkpoint).where(
                        Checkpoint.job_id == job_id,
                        Checkpoint.step == item.step,
                        Checkpoint.path == item.path,
                    )
                ).first()
                if row is None:
                    continue
                removal = CheckpointRemoval(
                    job_id=job_id,
                    step=item.step,
                    path=item.path,
                    size_bytes=row.size_bytes,
                    delete_files=item.delete_files,
                    retired_at=now,
                    removed_at=None if item.delete_files else now,
                )
                s.delete(row)
                s.add(removal)
                s.flush()
                out.append(_record(removal))
            if out:
                self._event(s, job_id, "retention", message)
        return out

    def metrics_at_steps(self, job_id: int, steps: Sequence[int]) -> dict[int, dict[str, float]]:
        """The values reported at ``steps`` (all attempts, a later attempt's win), without
        reading the job's other metric rows."""
        out: dict[int, dict[str, float]] = {}
        wanted = sorted(set(steps))
        with self._tx(f"read metrics of job {job_id} at checkpoint steps", write=False) as s:
            for start in range(0, len(wanted), 500):
                query = (
                    select(Metric)
                    .where(Metric.job_id == job_id, Metric.step.in_(wanted[start : start + 500]))
                    .order_by(Metric.attempt)
                )
                for row in s.scalars(query):
                    out.setdefault(row.step, {}).update(row.values)
        return out

    def pending_checkpoint_removals(
        self, job_id: int | None = None, *, limit: int = 1000
    ) -> list[CheckpointRemovalRecord]:
        """Removals whose files are not known to be gone yet, oldest first."""
        query = select(CheckpointRemoval).where(CheckpointRemoval.removed_at.is_(None))
        if job_id is not None:
            query = query.where(CheckpointRemoval.job_id == job_id)
        query = query.order_by(CheckpointRemoval.id).limit(limit)
        with self._tx("list pending checkpoint removals", write=False) as s:
            return [_record(r) for r in s.scalars(query)]

    def finish_checkpoint_removals(self, ids: Sequence[int]) -> None:
        """Mark removals done (their files are gone); idempotent."""
        if not ids:
            return
        with self._tx("finish checkpoint removals", write=True) as s:
            s.execute(
                update(CheckpointRemoval)
                .where(CheckpointRemoval.id.in_(list(ids)), CheckpointRemoval.removed_at.is_(None))
                .values(removed_at=self._now())
            )

    def removed_checkpoint_keys(self, job_id: int, steps: Sequence[int]) -> set[tuple[int, str]]:
        """(step, path) of the job's removed checkpoints at ``steps``: a re-sent report's
        checkpoints that must not be stored again."""
        query = select(CheckpointRemoval.step, CheckpointRemoval.path).where(
            CheckpointRemoval.job_id == job_id, CheckpointRemoval.step.in_(sorted(set(steps)))
        )
        with self._tx(f"read checkpoint removals of job {job_id}", write=False) as s:
            return {(int(step), str(path)) for step, path in s.execute(query)}

    def checkpoint_removals(self, job_id: int) -> list[CheckpointRemovalRecord]:
        """Every checkpoint of a job that retention removed, by step."""
        query = (
            select(CheckpointRemoval)
            .where(CheckpointRemoval.job_id == job_id)
            .order_by(CheckpointRemoval.step, CheckpointRemoval.id)
        )
        with self._tx(f"list checkpoint removals of job {job_id}", write=False) as s:
            return [_record(r) for r in s.scalars(query)]
