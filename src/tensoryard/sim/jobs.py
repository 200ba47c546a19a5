"""A trace job as the simulator tracks it: state, attempts, attained service, lost work."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from tensoryard.sim.cluster import Placement
from tensoryard.sim.trace import TraceJob

__all__ = ["JobState", "SimJob"]


class JobState(Enum):
    """Where a simulated job is: waiting, holding GPUs, in its preemption grace, or done."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"  # preempted, still holding its GPUs during the grace period
    DONE = "done"


@dataclass(eq=False)
class SimJob:
    """One job during a replay. ``index`` is its position in the trace (submit order)."""

    trace: TraceJob
    index: int
    nodes: int
    gpus_per_node: int
    remaining_s: float
    state: JobState = JobState.PENDING
    placement: Placement | None = None
    attempt: int = 0
    attempt_start: float = 0.0
    first_start: float | None = None
    finish_time: float | None = None
    pending_since: float | None = None
    wait_s: float = 0.0
    attained_gpu_s: float = 0.0  # GPU-seconds executed in finished attempts (incl. lost work)
    last_exec_s: float = 0.0  # length of the last attempt (Tiresias' starvation guard uses it)
    last_stop: float | None = None
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)  # per-policy bookkeeping
    gpus: int = field(init=False)  # nodes x GPUs per node (a field: policies read it often)

    def __post_init__(self) -> None:
        self.gpus = self.nodes * self.gpus_per_node

    @property
    def team(self) -> str:
        return self.trace.team

    @property
    def submit_time_s(self) -> float:
        return self.trace.submit_time_s

    def executed_s(self, now: float) -> float:
        """Seconds the current attempt has run (0 when not holding GPUs)."""
        if self.state in (JobState.RUNNING, JobState.STOPPING):
            return max(0.0, now - self.attempt_start)
        return 0.0

    def attained_gpu_s_at(self, now: float) -> float:
        """Attained service in GPU-seconds, the current attempt included."""
        return self.attained_gpu_s + self.gpus * self.executed_s(now)

    def last_checkpoint_at(self, now: float, interval_s: float) -> float | None:
        """Time of the current attempt's latest periodic checkpoint, or None before the first."""
        if self.state not in (JobState.RUNNING, JobState.STOPPING) or interval_s <= 0:
            return None
        done = math.floor(self.executed_s(now) / interval_s)
        return self.attempt_start + done * interval_s if done else None

    def expected_end(self) -> float:
        """When the current attempt ends if nothing stops it."""
        return self.attempt_start + self.remaining_s
