"""The loop's view of every unfinished job: loaded once, then only the rows that changed since
the last look (so an idle cycle costs one small query however many jobs wait), and kept
current by every job write the loop makes (`try_transition`, `put`). The phases read jobs by
state from here; the scheduling trigger (`Triggers`) records what changed since its last pass.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import ValidationError

from tensoryard.errors import Conflict
from tensoryard.server.control.rules import BadJobData
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import ACTIVE_STATES, TERMINAL_STATES, JobState
from tensoryard.store import JobRecord, Store

__all__ = ["JobIndex", "Triggers"]

log = logging.getLogger("tensoryard.controller")

_CHANGE_OVERLAP = timedelta(seconds=5)  # commits may land a little after their changed_at
_FULL_CHECK_EVERY_S = 30.0  # compare every unfinished job's stamp, in case a change was missed


@dataclass
class Triggers:
    """Why the scheduler should run before its next periodic pass: ``dirty`` (a job came,
    went or changed state: rescheduled at a bounded rate) and ``urgent`` (capacity came free
    or a node changed: rescheduled at once). The scheduling phase clears both."""

    dirty: bool = True
    urgent: bool = False


class JobIndex:
    """Every unfinished job, by id and by state (phases look at a few states each cycle;
    walking 20k pending jobs for the handful that are running would be the idle cost), and
    each one's validated spec."""

    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock
        self.jobs: dict[int, JobRecord] = {}
        self._by_state: dict[JobState, dict[int, JobRecord]] = {s: {} for s in JobState}
        self.cancel_requested: set[int] = set()
        self.specs: dict[int, JobSpec] = {}
        self.triggers = Triggers()
        # Called with a job's id when it leaves the index finished (per-job memory elsewhere).
        self.on_finished: list[Callable[[int], None]] = []
        self._since: datetime | None = None
        self._last_full_check = 0.0
        # stamps of the pending reasons this loop wrote (and holds), within the overlap: the
        # refresh does not read those rows back (a deep backlog rewrites hundreds a cycle); a
        # change by another writer stamped at the very same microsecond is read at the next
        # full check (_FULL_CHECK_EVERY_S), which does not skip
        self._own_stamps: set[datetime] = set()

    # ---- reading -------------------------------------------------------------------------

    def get(self, job_id: int) -> JobRecord | None:
        return self.jobs.get(job_id)

    def in_states(self, *states: JobState) -> list[JobRecord]:
        return [j for state in states for j in self._by_state[state].values()]

    def __len__(self) -> int:
        return len(self.jobs)

    def spec(self, job: JobRecord) -> JobSpec:
        """The job's spec, validated once per control plane (at submission it was, too)."""
        spec = self.specs.get(job.id)
        if spec is None:
            try:
                spec = JobSpec.model_validate(job.spec)
            except ValidationError as exc:
                raise BadJobData(f"its stored spec is invalid: {exc.errors()[0]['msg']}") from exc
            self.specs[job.id] = spec
        return spec

    # ---- keeping it current --------------------------------------------------------------

    def reset(self) -> None:
        """Forget every job (recovery reloads them all at the next refresh)."""
        self.jobs.clear()
        for by_id in self._by_state.values():
            by_id.clear()
        self.cancel_requested.clear()
        self._since = None
        self._own_stamps = set()
        self.triggers.dirty = True

    def refresh(self) -> bool:
        """Read what changed since the last look; True when anything did."""
        since = None if self._since is None else self._since - _CHANGE_OVERLAP
        full = since is not None and self._clock() - self._last_full_check >= _FULL_CHECK_EVERY_S
        if full:
            self._last_full_check = self._clock()
        if since is not None:
            self._own_stamps = {t for t in self._own_stamps if t >= since}
        changed, now = self._store.jobs_changed_since(
            since, known=self.jobs, unfinished=full, skip_stamps=self._own_stamps
        )
        for job in changed:
            old = self.get(job.id)
            if (
                old is None
                or old.state != job.state
                or old.cancel_requested != job.cancel_requested
            ):
                self.triggers.dirty = True
            self.put(job)
        self._since = now
        return bool(changed)

    def put(self, job: JobRecord) -> None:
        """Take a job row just read or written (an older read than the one held is ignored)."""
        old = self.get(job.id)
        if (
            old is not None
            and old.changed_at
            and job.changed_at
            and job.changed_at < old.changed_at
        ):
            return  # an older read than what we hold
        if old is not None and old.state in ACTIVE_STATES and job.state not in ACTIVE_STATES:
            self.triggers.urgent = True  # capacity came free: refill it now
        if job.state in TERMINAL_STATES:
            if self._pop(job.id) is not None:
                self.triggers.dirty = True
            self.specs.pop(job.id, None)
            for forget in self.on_finished:
                forget(job.id)
            return
        if old is not None and old.state != job.state:
            self.triggers.dirty = True
        self._insert(job)

    def note_pending_info(
        self, job_id: int, reason: str, eta: datetime | None, stamp: datetime
    ) -> None:
        """A pending job's reason and estimate as just written (no state change)."""
        job = self.get(job_id)
        if job is not None and job.state is JobState.PENDING:
            self._insert(
                dataclasses.replace(job, pending_reason=reason, pending_eta=eta, changed_at=stamp)
            )
            self._own_stamps.add(stamp)

    def try_transition(self, job: JobRecord, to: JobState, reason: str, **fields: object) -> bool:
        """Move a job (compare-and-set on its state); False when it moved meanwhile."""
        try:
            record = self._store.transition(
                job.id, to, reason=reason, expected=[job.state], **fields
            )
        except Conflict as exc:
            log.info("job %s: skipped %s -> %s (%s)", job.id, job.state, to, exc)
            self.triggers.dirty = True
            return False
        self.put(record)
        return True

    def _insert(self, job: JobRecord) -> None:
        self._pop(job.id)
        self.jobs[job.id] = job
        self._by_state[job.state][job.id] = job
        if job.cancel_requested:
            self.cancel_requested.add(job.id)

    def _pop(self, job_id: int) -> JobRecord | None:
        old = self.jobs.pop(job_id, None)
        if old is not None:
            del self._by_state[old.state][job_id]
            self.cancel_requested.discard(job_id)
        return old
