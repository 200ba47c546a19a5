"""Limits and health of a running attempt: the starting timeout (counted from when an external
queue admitted it), max_runtime over all attempts, and hangs (no heartbeat for the timeout, or
no step for stall_factor x the median step time): a hung attempt's stacks are dumped once, then
it is warned about, restarted in place by torchrun, or stopped and restarted."""

from __future__ import annotations

import logging

from tensoryard.errors import TensoryardError
from tensoryard.executors.base import Executor
from tensoryard.runtime.stacks import summarize as summarize_stacks
from tensoryard.server.config import ServerConfig
from tensoryard.server.control.index import JobIndex
from tensoryard.server.control.rules import HUNG, MAX_RUNTIME, NOT_STARTED, in_place_restarts
from tensoryard.server.control.stopping import AttemptKey, AttemptStopper
from tensoryard.spec.job import JobSpec
from tensoryard.store import AttemptRecord, JobRecord, Store

__all__ = ["HealthCheck"]

log = logging.getLogger("tensoryard.controller")

_HEALTH_CHECK_EVERY_S = 5.0
# After killing a hung attempt's workers for an in-place restart: how long the restarted
# workers have to report before the attempt is stopped the ordinary way.
_IN_PLACE_WAIT_S = 120.0


class HealthCheck:
    """Per running attempt: when it was last checked, what was warned, whether its workers
    were restarted in place or its stacks dumped, and when a poll last saw it queued."""

    def __init__(
        self,
        *,
        store: Store,
        executor: Executor,
        config: ServerConfig,
        index: JobIndex,
        stopper: AttemptStopper,
    ) -> None:
        self._store = store
        self._executor = executor
        self._config = config
        self._index = index
        self._stopper = stopper
        self._checked: dict[AttemptKey, float] = {}
        self._warned: set[tuple[int, int, str]] = set()
        # External admission (Kueue): when a poll last saw the attempt waiting in its queue;
        # the starting timeout counts from there (absent: not polled since this process
        # started).
        self._queued_seen: dict[AttemptKey, float] = {}
        # A hung attempt whose workers were killed for torchrun to restart them in place: when.
        self._in_place_kills: dict[AttemptKey, float] = {}
        self._stacks_dumped: set[AttemptKey] = set()  # hung attempts asked

    def reset(self) -> None:
        self._checked.clear()
        self._warned.clear()
        self._queued_seen.clear()
        self._in_place_kills.clear()
        self._stacks_dumped.clear()

    def forget(self, key: AttemptKey) -> None:
        """The attempt ended."""
        self._queued_seen.pop(key, None)
        self._in_place_kills.pop(key, None)
        self._stacks_dumped.discard(key)

    def note_polled(self, key: AttemptKey, *, queued: bool, now: float) -> None:
        """A poll answered (external admission: the starting timeout counts from the last
        poll that saw the attempt queued, or the first poll of this process)."""
        if getattr(self._executor, "external_admission", False) and (
            queued or key not in self._queued_seen
        ):
            self._queued_seen[key] = now

    def enforce_limits(self, job: JobRecord, attempt: AttemptRecord, now: float) -> None:
        spec = self._index.spec(job)
        grace = self._config.cancel_grace_s
        if attempt.state == "starting":
            since = attempt.started_at.timestamp()
            if getattr(self._executor, "external_admission", False):
                seen = self._queued_seen.get((job.id, attempt.number))
                if seen is None:
                    return  # not polled since this process started: the next cycle decides
                since = max(since, seen)
            waited = now - since
            if waited > self._config.starting_timeout_s:
                why = f"{NOT_STARTED} within {self._config.starting_timeout_s:g}s"
                self._stopper.stop(job, attempt, why, why, grace)
            return
        limit = spec.max_runtime
        if limit is not None and attempt.running_at is not None:
            ran = job.run_time_s + now - attempt.running_at.timestamp()
            if ran > limit:
                why = f"{MAX_RUNTIME} of {limit:g}s (ran {ran:.0f}s over all attempts)"
                self._stopper.stop(job, attempt, why, why, grace)
                return
        self._check_health(job, attempt, spec, now)

    def _check_health(
        self, job: JobRecord, attempt: AttemptRecord, spec: JobSpec, now: float
    ) -> None:
        """Hung: no heartbeat for the timeout, or no step for stall_factor x the median step
        time (at least min_stall). Then stop (SIGTERM, SIGKILL after the hang grace) and
        restart."""
        key = (job.id, attempt.number)
        if now - self._checked.get(key, 0.0) < _HEALTH_CHECK_EVERY_S:
            return
        self._checked[key] = now
        killed_at = self._in_place_kills.get(key)
        if killed_at is not None and now - killed_at < _IN_PLACE_WAIT_S:
            return  # its workers are being restarted in place; they report as a new attempt
        why = self._hung(job, attempt, spec, now)
        if not why:
            return
        self._dump_stacks(job, attempt)
        health = spec.health
        if health.on_hang == "warn":
            if (job.id, attempt.number, why[:20]) not in self._warned:
                self._warned.add((job.id, attempt.number, why[:20]))
                self._store.add_event(job.id, "warning", why, attempt=attempt.number)
            return
        if self._restart_hung_in_place(job, attempt, spec, why, now):
            return
        # A hung gang cannot checkpoint (its ranks wait in a collective): the short hang grace,
        # not the cancel grace, before SIGKILL; the restart resumes from the last checkpoint.
        grace = min(health.hang_grace, self._config.cancel_grace_s)
        self._stopper.stop(job, attempt, why, f"{why}; restarting", grace)

    def _hung(self, job: JobRecord, attempt: AttemptRecord, spec: JobSpec, now: float) -> str:
        """Why the attempt is hung, or "" when it is not."""
        health = spec.health
        beat_limit = health.heartbeat_timeout or self._config.heartbeat_timeout_s
        # Only jobs that use the runtime send heartbeats: silence counts once one arrived.
        beat = self._store.get_attempt(job.id, attempt.number).last_heartbeat
        if beat is not None and now - beat.timestamp() > beat_limit:
            return f"{HUNG}: no heartbeat for {now - beat.timestamp():.0f}s (limit {beat_limit:g}s)"
        progress = self._store.step_progress(job.id, attempt.number)
        if progress.steps >= 3 and progress.median_step_s and progress.last_ts is not None:
            limit = max(health.stall_factor * progress.median_step_s, health.min_stall)
            silent = now - progress.last_ts
            if silent > limit:
                return (
                    f"{HUNG}: no step for {silent:.0f}s after step {progress.last_step} "
                    f"({health.stall_factor:g}x the median step time of "
                    f"{progress.median_step_s:.2f}s, at least {health.min_stall:g}s)"
                )
        return ""

    def _dump_stacks(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Once per hung attempt, before anything is killed: where each rank waits (the
        executor signals the ranks that enabled dumps; tensoryard.runtime.stacks), as an
        event. Executors without the means (a pod's processes) skip it."""
        dump = getattr(self._executor, "dump_stacks", None)
        key = (job.id, attempt.number)
        if dump is None or key in self._stacks_dumped:
            return
        self._stacks_dumped.add(key)
        try:
            texts: dict[int, str | None] = dump(attempt.handle)
        except (TensoryardError, OSError) as exc:
            log.warning("job %s: stack dump of attempt %s failed: %s", job.id, attempt.number, exc)
            return
        if not texts:
            return
        where = "; ".join(summarize_stacks(rank, text) for rank, text in sorted(texts.items()))
        self._store.add_event(
            job.id,
            "warning",
            f"hung attempt {attempt.number}, where the ranks are: {where} (full stacks: "
            f"rank-R.stacks.txt in the attempt's directory)",
            attempt=attempt.number,
        )

    def _in_place_left(self, job: JobRecord, attempt: AttemptRecord, spec: JobSpec) -> int:
        """In-place restarts still granted to this attempt's launch. Its in-place attempts
        are numbered right after it, so it has used ``number - launch`` of them."""
        used = attempt.number - (attempt.launch_attempt or attempt.number)
        granted = in_place_restarts(spec, restarts=job.restarts - used)  # as at its launch
        return max(0, granted - used)

    def _restart_hung_in_place(
        self, job: JobRecord, attempt: AttemptRecord, spec: JobSpec, why: str, now: float
    ) -> bool:
        """Kill a hung attempt's workers (not its launcher) when its launch has in-place
        restarts left: torchrun starts them again from the last checkpoint on the same
        allocation, much sooner than a new launch. False: stop it the ordinary way."""
        key = (job.id, attempt.number)
        restart = getattr(self._executor, "restart_workers", None)
        if restart is None or key in self._in_place_kills:
            return False
        if self._in_place_left(job, attempt, spec) <= 0:
            return False
        self._in_place_kills[key] = now
        self._store.update_attempt(job.id, attempt.number, reason=why)  # the reason, first
        try:
            killed = int(restart(attempt.handle))
        except TensoryardError as exc:
            self._store.add_event(
                job.id, "error", f"in-place restart failed: {exc}", attempt=attempt.number
            )
            return False
        if killed == 0:
            return False  # no worker to kill: the launcher itself is stuck
        self._store.add_event(
            job.id,
            "restart",
            f"{why}; killed its {killed} worker(s) for torchrun to restart them in place "
            "from the last checkpoint",
            attempt=attempt.number,
        )
        return True
