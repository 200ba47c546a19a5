"""What a policy may see of a simulated job: everything observed, never its true duration.

The simulator hands policies :class:`JobView` objects, not its own records. A view shows what
a real control plane knows (size, team, submit time, attempts, service so far, where it
runs), and raises :class:`OracleAccessError` on the fields that only the replay knows: the
trace's ``duration_s``, the ``remaining_s`` of the current attempt and its ``expected_end``.
Oracle baselines (SJF, SRTF) declare ``oracle = True`` and ask the context for true times
(``SimContext.true_duration_s`` / ``true_remaining_s``); a policy that does not declare it
is refused there too. So a policy that runs to the end of a replay has not read them.
"""

from __future__ import annotations

from typing import NoReturn

from tensoryard.sim.cluster import Placement
from tensoryard.sim.errors import OracleAccessError
from tensoryard.sim.jobs import JobState, SimJob
from tensoryard.sim.trace import TraceJob

__all__ = ["JobView", "OracleAccessError", "TraceView"]


def _hidden(what: str) -> NoReturn:
    raise OracleAccessError(
        f"{what} is the job's true duration, which a real scheduler does not know (fix: use "
        "observed service and history, or declare the policy an oracle: oracle = True and "
        "ctx.true_duration_s(job))"
    )


class TraceView:
    """A trace row without its duration."""

    __slots__ = ("_trace",)

    def __init__(self, trace: TraceJob) -> None:
        self._trace = trace

    @property
    def job_id(self) -> str:
        return self._trace.job_id

    @property
    def submit_time_s(self) -> float:
        return self._trace.submit_time_s

    @property
    def num_gpus(self) -> int:
        return self._trace.num_gpus

    @property
    def team(self) -> str:
        return self._trace.team

    @property
    def priority(self) -> int:
        return self._trace.priority

    @property
    def gpu_model(self) -> str | None:
        return self._trace.gpu_model

    @property
    def duration_s(self) -> float:
        _hidden("trace.duration_s")


class JobView:
    """A simulated job as a policy sees it (see the module docstring)."""

    __slots__ = ("_job", "trace")

    def __init__(self, job: SimJob) -> None:
        self._job = job
        self.trace = TraceView(job.trace)

    # hidden -------------------------------------------------------------------------------

    @property
    def remaining_s(self) -> float:
        _hidden("remaining_s")

    def expected_end(self) -> float:
        _hidden("expected_end()")

    # observed -----------------------------------------------------------------------------

    @property
    def index(self) -> int:
        return self._job.index

    @property
    def nodes(self) -> int:
        return self._job.nodes

    @property
    def gpus_per_node(self) -> int:
        return self._job.gpus_per_node

    @property
    def gpus(self) -> int:
        return self._job.gpus

    @property
    def team(self) -> str:
        return self._job.trace.team

    @property
    def submit_time_s(self) -> float:
        return self._job.trace.submit_time_s

    @property
    def state(self) -> JobState:
        return self._job.state

    @property
    def placement(self) -> Placement | None:
        return self._job.placement

    @property
    def attempt(self) -> int:
        return self._job.attempt

    @property
    def attempt_start(self) -> float:
        return self._job.attempt_start

    @property
    def first_start(self) -> float | None:
        return self._job.first_start

    @property
    def finish_time(self) -> float | None:
        return self._job.finish_time

    @property
    def attained_gpu_s(self) -> float:
        return self._job.attained_gpu_s

    @property
    def last_exec_s(self) -> float:
        return self._job.last_exec_s

    @property
    def last_stop(self) -> float | None:
        return self._job.last_stop

    @last_stop.setter
    def last_stop(self, value: float | None) -> None:
        self._job.last_stop = value  # Tiresias' starvation guard resets it

    @property
    def preemptions(self) -> int:
        return self._job.preemptions

    @property
    def extra(self) -> dict[str, float]:
        return self._job.extra

    def executed_s(self, now: float) -> float:
        return self._job.executed_s(now)

    def attained_gpu_s_at(self, now: float) -> float:
        return self._job.attained_gpu_s_at(now)

    def last_checkpoint_at(self, now: float, interval_s: float) -> float | None:
        return self._job.last_checkpoint_at(now, interval_s)
