"""What a replay measures, integrated exactly between events (state is constant in between).

Definitions (all times in simulated seconds):

- JCT: finish - submit. Wait (queueing delay): all time spent pending, requeues included.
- makespan: last finish - first submit.
- allocation: allocated GPU-seconds / available GPU-seconds while demand exists, where the
  available capacity at a moment is ``min(cluster GPUs, GPUs of running + pending jobs)``. 1.0
  means no GPU was ever idle while a job wanted it.
- utilization: allocated GPU-seconds / (cluster GPUs x makespan).
- fragmentation: of all the job-seconds spent pending, the fraction during which the job's k
  GPUs were free in total (so only placement or ordering held it back).
- entitlement: a team is held below its entitlement while one of its pending jobs would fit in
  its nominal quota next to what it already holds; the longest such stretch is reported.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensoryard.sim.jobs import SimJob

__all__ = ["MetricsRecorder", "SimResult", "TeamStats", "TimeSeries"]


@dataclass
class TeamStats:
    """Per-team share against its nominal quota."""

    nominal_gpus: int
    gpu_s: float = 0.0  # GPU-seconds held
    demand_s: float = 0.0  # seconds with jobs running or pending
    below_s: float = 0.0  # seconds held below entitlement
    max_below_s: float = 0.0  # longest continuous stretch held below entitlement
    below_since: float | None = None

    def as_dict(self, total_gpus: int) -> dict[str, float]:
        avg = self.gpu_s / self.demand_s if self.demand_s else 0.0
        return {
            "nominal_gpus": self.nominal_gpus,
            "entitlement": self.nominal_gpus / total_gpus if total_gpus else 0.0,
            "avg_gpus_while_demand": avg,
            "share_while_demand": avg / total_gpus if total_gpus else 0.0,
            "demand_hours": self.demand_s / 3600,
            "below_entitlement_s": self.below_s,
            "max_below_entitlement_s": self.max_below_s,
        }


@dataclass
class TimeSeries:
    """Samples after each event batch, for plots."""

    time_s: list[float] = field(default_factory=list)
    pending_jobs: list[int] = field(default_factory=list)
    allocated_gpus: list[int] = field(default_factory=list)
    demand_gpus: list[int] = field(default_factory=list)


class MetricsRecorder:
    """Keeps the counters the integrals need; the simulator calls it on every transition."""

    def __init__(self, total_gpus: int, nominal: dict[str, int]) -> None:
        self.total_gpus = total_gpus
        self.allocated = 0
        self.pending_gpus = 0
        self.pending_jobs = 0
        self._pending_sizes: Counter[int] = Counter()
        self._team_pending: dict[str, Counter[int]] = {t: Counter() for t in nominal}
        self._team_used: dict[str, int] = dict.fromkeys(nominal, 0)
        self.teams = {t: TeamStats(n) for t, n in nominal.items()}
        self.allocated_gpu_s = 0.0
        self.available_gpu_s = 0.0
        self.pending_job_s = 0.0
        self.fragmented_job_s = 0.0
        self.series = TimeSeries()
        self._last: float | None = None

    # transitions ---------------------------------------------------------------------------

    def pending_added(self, job: SimJob) -> None:
        self.pending_jobs += 1
        self.pending_gpus += job.gpus
        self._pending_sizes[job.gpus] += 1
        self._team_pending[job.team][job.gpus] += 1

    def pending_removed(self, job: SimJob) -> None:
        self.pending_jobs -= 1
        self.pending_gpus -= job.gpus
        self._drop(self._pending_sizes, job.gpus)
        self._drop(self._team_pending[job.team], job.gpus)

    def gpus_taken(self, job: SimJob) -> None:
        self.allocated += job.gpus
        self._team_used[job.team] += job.gpus

    def gpus_freed(self, job: SimJob) -> None:
        self.allocated -= job.gpus
        self._team_used[job.team] -= job.gpus

    @staticmethod
    def _drop(counter: Counter[int], key: int) -> None:
        counter[key] -= 1
        if counter[key] <= 0:
            del counter[key]

    # integration ---------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Integrate the state held since the previous call up to ``now``."""
        last, self._last = self._last, now
        if last is None or now <= last:
            return
        dt = now - last
        free = self.total_gpus - self.allocated
        self.allocated_gpu_s += self.allocated * dt
        demand = self.allocated + self.pending_gpus
        self.available_gpu_s += min(self.total_gpus, demand) * dt
        self.pending_job_s += self.pending_jobs * dt
        fits = sum(n for size, n in self._pending_sizes.items() if size <= free)
        self.fragmented_job_s += fits * dt
        for team, stats in self.teams.items():
            self._advance_team(team, stats, last, now)

    def _advance_team(self, team: str, stats: TeamStats, last: float, now: float) -> None:
        used = self._team_used[team]
        pending = self._team_pending[team]
        if used or pending:
            stats.demand_s += now - last
            stats.gpu_s += used * (now - last)
        if pending and used + min(pending) <= stats.nominal_gpus:
            if stats.below_since is None:
                stats.below_since = last
            stats.below_s += now - last
            stats.max_below_s = max(stats.max_below_s, now - stats.below_since)
        else:
            stats.below_since = None

    def sample(self, now: float) -> None:
        series = self.series
        series.time_s.append(now)
        series.pending_jobs.append(self.pending_jobs)
        series.allocated_gpus.append(self.allocated)
        series.demand_gpus.append(self.allocated + self.pending_gpus)


@dataclass
class SimResult:
    """The outcome of one replay: per-job outcomes, integrals and time series."""

    policy: str
    total_gpus: int
    jobs: list[SimJob]
    recorder: MetricsRecorder
    cycles: int
    wall_s: float

    def metrics(self) -> dict[str, Any]:
        """The flat metrics dictionary written to JSON (times in seconds)."""
        rec = self.recorder
        jct = np.array([j.finish_time - j.submit_time_s for j in self.jobs if j.finish_time])
        wait = np.array([j.wait_s for j in self.jobs])
        first = min(j.submit_time_s for j in self.jobs)
        makespan = max((j.finish_time or 0.0) for j in self.jobs) - first
        lost = sum(j.lost_gpu_s for j in self.jobs)
        teams = {t: s.as_dict(self.total_gpus) for t, s in sorted(rec.teams.items())}
        worst = max((s.max_below_s for s in rec.teams.values()), default=0.0)
        return {
            "jobs": len(self.jobs),
            "avg_jct_s": _stat(jct, "mean"),
            "median_jct_s": _stat(jct, "median"),
            "p99_jct_s": _stat(jct, 99),
            "avg_wait_s": _stat(wait, "mean"),
            "median_wait_s": _stat(wait, "median"),
            "p99_wait_s": _stat(wait, 99),
            "makespan_s": makespan,
            "allocation": rec.allocated_gpu_s / rec.available_gpu_s if rec.available_gpu_s else 0,
            "utilization": rec.allocated_gpu_s / (self.total_gpus * makespan) if makespan else 0,
            "fragmentation": rec.fragmented_job_s / rec.pending_job_s if rec.pending_job_s else 0,
            "fragmented_job_hours": rec.fragmented_job_s / 3600,
            "allocated_gpu_hours": rec.allocated_gpu_s / 3600,
            "preemptions": sum(j.preemptions for j in self.jobs),
            "lost_gpu_hours": lost / 3600,
            "max_below_entitlement_s": worst,
            "teams": teams,
            "cycles": self.cycles,
            "wall_s": self.wall_s,
        }


def _stat(values: np.ndarray[Any, Any], kind: str | int) -> float:
    if values.size == 0:
        return 0.0
    if kind == "mean":
        return float(values.mean())
    if kind == "median":
        return float(np.median(values))
    return float(np.percentile(values, float(kind)))
