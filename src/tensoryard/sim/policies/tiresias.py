"""Tiresias' discretised two-dimensional least-attained-service (2D-LAS), preemptive.

After Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning" (NSDI'19):
a job's attained service is GPUs x time it has run; thresholds on it split jobs into K
queues; a lower queue always goes first and preempts higher ones; inside a queue jobs go in
FIFO order. The starvation guard moves a waiting job back to the first queue once it has
waited ``promote_knob`` times as long as it last ran. A running job is preempted only for a
job that its GPUs (with the others freed for it) can actually place
(:func:`~tensoryard.sim.policies.preemptive.run_in_order`): a gang that cannot be placed
does not stop anyone.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from tensoryard.sim.engine import SimContext
from tensoryard.sim.jobs import JobState
from tensoryard.sim.policies.preemptive import run_in_order
from tensoryard.sim.view import JobView

__all__ = ["LasConfig", "TiresiasLasPolicy"]

_BASE = "las_base_gpu_s"  # attained service at the last promotion (the guard resets it)
_LEVEL, _UNTIL, _ATTEMPT = "las_level", "las_until", "las_attempt"  # cached level
_EPS = 1e-6


@dataclass(frozen=True, kw_only=True)
class LasConfig:
    """Knobs of discretised 2D-LAS."""

    thresholds_gpu_s: tuple[float, ...] = (3600.0, 36_000.0)
    """Queue limits in attained GPU-seconds (1 and 10 GPU-hours: three queues)."""
    promote_knob: float = 8.0
    """Promote a waiting job after it waited this many times its last run; 0 disables."""


class TiresiasLasPolicy:
    """Discretised 2D-LAS with preemption and a starvation guard."""

    name = "tiresias-las"

    def __init__(self, config: LasConfig | None = None) -> None:
        self.config = config or LasConfig()

    def _service(self, job: JobView, now: float) -> float:
        """Attained GPU-seconds since the last promotion."""
        return job.attained_gpu_s_at(now) - job.extra.get(_BASE, 0.0)

    def _level(self, job: JobView, now: float) -> tuple[int, float]:
        """(queue level, time the level next changes); cached until that time."""
        extra = job.extra
        if extra.get(_ATTEMPT) == job.attempt and now < extra[_UNTIL]:
            return int(extra[_LEVEL]), extra[_UNTIL]
        limits = self.config.thresholds_gpu_s
        service = self._service(job, now)
        level = bisect.bisect_right(limits, service + _EPS)
        until = math.inf
        if job.state is JobState.RUNNING and level < len(limits):
            until = now + max((limits[level] - service) / job.gpus, 1e-3)
        extra[_LEVEL], extra[_UNTIL], extra[_ATTEMPT] = level, until, job.attempt
        return level, until

    def _promote_starving(self, pending: list[JobView], now: float) -> None:
        knob = self.config.promote_knob
        if knob <= 0:
            return
        for job in pending:
            waited = now - job.last_stop if job.last_stop is not None else -math.inf
            if job.last_exec_s > 0 and waited >= knob * job.last_exec_s - _EPS:
                job.extra[_BASE] = job.attained_gpu_s
                job.extra.pop(_ATTEMPT, None)  # its level changed
                job.last_stop = None  # promoted once per wait

    def cycle(self, ctx: SimContext) -> float | None:
        now = ctx.now
        pending = ctx.pending()
        if not pending:
            return None
        self._promote_starving(pending, now)
        running = ctx.running()
        keyed = [(self._level(j, now)[0], j.submit_time_s, j.index, j) for j in running + pending]
        keyed.sort(key=lambda k: k[:3])
        # run the LAS order; preempt only for jobs the freed GPUs can place
        run_in_order(ctx, [job for *_, job in keyed])
        return self._next_change(ctx, now)

    def _next_change(self, ctx: SimContext, now: float) -> float | None:
        """When a running job changes level or a waiting one is due for promotion."""
        still_pending = [j for j in ctx.pending() if j.state is JobState.PENDING]
        if not still_pending:
            return None
        wake = min((self._level(j, now)[1] for j in ctx.running()), default=math.inf)
        knob = self.config.promote_knob
        if knob > 0:
            for job in still_pending:
                if job.last_stop is not None and job.last_exec_s > 0:
                    wake = min(wake, max(job.last_stop + knob * job.last_exec_s, now + 1e-3))
        return wake if wake < math.inf else None
