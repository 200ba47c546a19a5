"""Phase 5: why each pending job waits and when it should start, as status fields (written
in bounded batches after the launches, so a deep backlog's reasons never delay the job that
just got a slot). A requeued job's reason first says what is happening: "restarting attempt 3
from step 1200 after attempt 2 ended (node n2 deleted ...)"."""

from __future__ import annotations

import itertools
import re
from datetime import datetime

from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.rules import utc
from tensoryard.store import JobRecord, Store, reason_gist

__all__ = ["PendingReasons"]

_ETA_SLACK_S = 60.0
_COUNTS_REFRESH_S = 15.0
"""A reason whose counts alone moved ("24 more held" -> "40 more held", "140 jobs ahead" ->
"139") is rewritten at most this often per job: a deep backlog's counts move at every pass,
and rewriting them all each pass was a fifth of the loop's time at 2,000 pending. A reason
that goes back to what it said before its last change ("queue default uses 256 of its 256"
-> "only 0 GPUs are free" -> "queue default uses ..." as slots free and fill within a
second) waits as long: a full queue flipped its waiting jobs' reasons at every pass, an
UPDATE and an event per job each time (16,000 events for 200 jobs in benchmarks/k8s_launch)."""
_PENDING_WRITES_PER_CYCLE = 500


def _eta_moved(old: datetime | None, new: datetime | None) -> bool:
    """Whether a new start estimate is worth a write: known/unknown changed, or it moved by
    more than a minute (estimates drift with the clock; 20k rewrites a cycle would not do)."""
    if old is None or new is None:
        return old is not new
    return abs((new - old).total_seconds()) > _ETA_SLACK_S


class PendingReasons:
    """The reasons and estimates still to write (oldest first), and per requeue its note."""

    def __init__(self, *, store: Store, index: JobIndex) -> None:
        self._store = store
        self._index = index
        self._to_write: dict[int, tuple[str, datetime | None]] = {}
        self._queued_at: dict[int, float] = {}  # job -> when its reason was last queued
        self._before: dict[int, str] = {}  # job -> the gist its reason had before that
        self._pruned_at = 0.0
        self._restart_notes: dict[tuple[int, int], str] = {}  # (job, attempts) -> note

    def reset(self) -> None:
        self._to_write = {}

    def decided(self, job: JobRecord, reason: str, eta_s: float | None, now: float) -> None:
        """The scheduler's reason and estimated start for a pending job; queued for writing
        when they changed (a requeued job's reason is prefixed with what is happening). A
        reason that says the same with other counts, or goes back to what it said before its
        last change, is queued at most once per `_COUNTS_REFRESH_S` per job."""
        eta = utc(round(eta_s)) if eta_s is not None else None
        if job.attempts:  # requeued: say what happened and where it resumes, then why
            reason = f"{self._restarting_note(job)}; {reason}"
        old_gist, new_gist = reason_gist(job.pending_reason), reason_gist(reason)
        recent = now - self._queued_at.get(job.id, -_COUNTS_REFRESH_S) < _COUNTS_REFRESH_S
        says_more = job.pending_reason != reason and (
            (old_gist != new_gist and new_gist != self._before.get(job.id)) or not recent
        )
        queued = job.id in self._to_write and job.pending_reason != reason
        if says_more or queued or _eta_moved(job.pending_eta, eta):
            self._to_write[job.id] = (reason, eta)
            self._queued_at[job.id] = now
            if old_gist != new_gist:
                self._before[job.id] = old_gist
            if now - self._pruned_at >= _COUNTS_REFRESH_S:
                # jobs gone or written long ago: forgetting one costs one early rewrite at most
                self._pruned_at = now
                self._queued_at = {
                    k: t for k, t in self._queued_at.items() if now - t < _COUNTS_REFRESH_S
                }
                self._before = {k: g for k, g in self._before.items() if k in self._queued_at}
        else:
            self._to_write.pop(job.id, None)  # an older change not yet written

    def put(self, job_id: int, reason: str, eta: datetime | None) -> None:
        """Queue a reason and estimate to write (as `decided` does when they changed)."""
        self._to_write[job_id] = (reason, eta)

    def write(self) -> None:
        """Write at most `_PENDING_WRITES_PER_CYCLE` changed reasons, oldest first: when a
        freed slot changes the reasons of a deep backlog, the loop goes on reconciling and
        launching while the rest are written over the next cycles."""
        batch = list(itertools.islice(self._to_write.items(), _PENDING_WRITES_PER_CYCLE))
        for job_id, _ in batch:
            del self._to_write[job_id]
        if not batch:
            return
        # in transactions of 100 rows: an API write (a submit) waits for one of them at most
        written, stamp = self._store.set_pending_info(
            [(i, r, eta) for i, (r, eta) in batch], chunk=100
        )
        info = dict(batch)
        for job_id in written:
            reason, eta = info[job_id]
            self._index.note_pending_info(job_id, reason, eta, stamp)

    def _restarting_note(self, job: JobRecord) -> str:
        """What a requeued job is doing, before the scheduler's why-pending: "restarting
        attempt 3 from step 1200 after attempt 2 ended (node n2 deleted ...)". Read once per
        requeue (the checkpoint does not move while no attempt runs)."""
        key = (job.id, job.attempts)
        note = self._restart_notes.get(key)
        if note is None:
            cause = re.sub(r"^attempt \d+: ", "", job.reason)
            cause = re.split(r"; (?:requeued|restarting from)", cause)[0]
            waiting = job.reason.partition("; requeued: ")[2]  # "waiting for a node to ..."
            latest = self._store.latest_checkpoint(job.id)
            start = f"from step {latest.step}" if latest is not None else "from the start"
            note = (
                f"restarting attempt {job.attempts + 1} {start} after attempt {job.attempts} "
                f"ended ({cause})" + (f", {waiting}" if waiting else "")
            )
            if len(self._restart_notes) > 10_000:  # jobs long gone; cheap to read again
                self._restart_notes.clear()
            self._restart_notes[key] = note
        return note
