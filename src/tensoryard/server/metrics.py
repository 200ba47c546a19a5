"""Platform metrics for Prometheus: `GET /metrics` on the control plane.

Two kinds, in one registry of the control plane's own (never prometheus_client's global one):

- events the loop counts as they happen (`LoopMetrics`): scheduler cycle latency, admissions,
  the time jobs waited before admission, preemptions and their GPU-hours cost, restarts by
  reason;
- state read at scrape time (`StateCollector`): jobs by state and team, queue lengths, GPUs
  nominal / used / borrowed / lent per team, and per running job its step time, tokens/s,
  loss, goodput, checkpoint age, last step age and heartbeat age.

Label cardinality is bounded by construction: `state` and `reason` take values from fixed
enums (`JobState`, `RESTART_REASONS`); `team` is one of the teams a platform admin created;
`job` appears only on series of *running* jobs, at most one per GPU (or CPU slot) of the
cluster, and a series disappears when its job ends (scrape-time collection keeps no history).
No series is labelled with a user, a job name or free text.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tensoryard.spec.states import JobState
from tensoryard.store import JobRecord, Store, TeamRecord
from tensoryard.store.models import NODE_STATES

__all__ = ["RESTART_REASONS", "LoopMetrics", "StateCollector", "restart_reason"]

RESTART_REASONS = (
    "failed",
    "hung",
    "not-started",
    "lost",
    "launch-failed",
    "preempted",
    "node-drained",
    "in-place",
)

_PENDING_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
_CYCLE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def restart_reason(text: str) -> str:
    """The fixed label for why an attempt ended and its job restarts or requeues."""
    lowered = text.lower()
    if lowered == "in-place":
        return "in-place"  # torchrun restarted the workers itself (restart.in_place)
    if "preempted" in lowered:
        return "preempted"
    if lowered.startswith("node ") and " drained: " in lowered:
        return "node-drained"
    if "hung" in lowered:
        return "hung"
    if "did not start" in lowered:
        return "not-started"
    if "launch of attempt" in lowered:
        return "launch-failed"
    if "lost" in lowered or "could not be polled" in lowered or "is gone" in lowered:
        return "lost"
    return "failed"


BADPUT_KINDS = (
    "startup",
    "checkpoint_save",
    "checkpoint_restore",
    "lost",
    "hang",
    "other",
    "queueing",
    "restart_wait",
)


class LoopMetrics:
    """What the control loop counts as it goes (one instance per control plane)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.cycle_seconds = PromHistogram(
            "tyard_scheduler_cycle_seconds",
            "Wall time of one scheduling pass (snapshot, core, decisions written).",
            buckets=_CYCLE_BUCKETS,
            registry=registry,
        )
        self.pending_seconds = PromHistogram(
            "tyard_pending_seconds",
            "Time from submission (or requeue) to admission, by team.",
            ["team"],
            buckets=_PENDING_BUCKETS,
            registry=registry,
        )
        self.admissions = PromCounter(
            "tyard_admissions", "Jobs admitted, by team.", ["team"], registry=registry
        )
        self.preemptions = PromCounter(
            "tyard_preemptions", "Running jobs preempted, by team.", ["team"], registry=registry
        )
        self.preemption_gpu_hours = PromCounter(
            "tyard_preemption_gpu_hours",
            "GPU-hours of work since the victims' last checkpoints (lost to preemption).",
            ["team"],
            registry=registry,
        )
        self.restarts = PromCounter(
            "tyard_restarts",
            "Attempts that ended and were followed by a restart or a requeue, by reason.",
            ["team", "reason"],
            registry=registry,
        )

        self.leader_changes = PromCounter(
            "tyard_leader_changes",
            "Changes of this replica's leadership of the control loop (took, stepped_down).",
            ["replica", "change"],
            registry=registry,
        )
        self.leader_epoch = PromGauge(
            "tyard_leader_epoch",
            "The leader epoch this replica leads with (its fencing token); 0 while it follows.",
            ["replica"],
            registry=registry,
        )

    def leader_change(self, replica: str, *, leading: bool, epoch: int | None = None) -> None:
        self.leader_changes.labels(replica, "took" if leading else "stepped_down").inc()
        self.leader_epoch.labels(replica).set(epoch or 0 if leading else 0)

    def admitted(self, job: JobRecord, now: float) -> None:
        """`job` as it was while PENDING: `updated_at` is when it entered that state."""
        self._declare(job.team)
        self.admissions.labels(job.team).inc()
        self.pending_seconds.labels(job.team).observe(max(now - job.updated_at.timestamp(), 0.0))

    def _declare(self, team: str) -> None:
        """Start a team's event counters at 0 once it runs something, so that the dashboards'
        and rules' increase() sees the first preemption or restart, not only the second."""
        self.preemptions.labels(team)
        self.preemption_gpu_hours.labels(team)
        for reason in RESTART_REASONS:
            self.restarts.labels(team, reason)

    def preempted(self, job: JobRecord, gpus: int, since_checkpoint_s: float) -> None:
        self.preemptions.labels(job.team).inc()
        self.preemption_gpu_hours.labels(job.team).inc(gpus * max(since_checkpoint_s, 0) / 3600)

    def restarted(self, job: JobRecord, reason: str) -> None:
        self.restarts.labels(job.team, restart_reason(reason)).inc()


@dataclass(frozen=True)
class TeamGpus:
    nominal: float
    used: float
    borrowed: float
    lent: float


def team_gpus(nominal: dict[str, float], used: dict[str, float]) -> dict[str, TeamGpus]:
    """Per team: nominal quota, GPUs in use, GPUs used beyond the quota (borrowed) and idle
    quota that others are using (lent: the borrowed GPUs shared out over the teams with idle
    quota, in proportion to it)."""
    borrowed = {t: max(used.get(t, 0.0) - n, 0.0) for t, n in nominal.items()}
    idle = {t: max(n - used.get(t, 0.0), 0.0) for t, n in nominal.items()}
    total_borrowed, total_idle = sum(borrowed.values()), sum(idle.values())
    out = {}
    for team, n in nominal.items():
        lent = total_borrowed * idle[team] / total_idle if total_idle else 0.0
        out[team] = TeamGpus(n, used.get(team, 0.0), borrowed[team], min(lent, idle[team]))
    return out


class StateCollector(Collector):
    """Reads the store at scrape time (a few aggregate queries, plus a few per running job)."""

    def __init__(
        self,
        store: Store,
        *,
        total_gpus: Callable[[], float],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.total_gpus = total_gpus
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        counts = self.store.job_counts()
        jobs = GaugeMetricFamily("tyard_jobs", "Jobs by state and team.", labels=["state", "team"])
        queue = GaugeMetricFamily("tyard_queue_length", "PENDING jobs by team.", labels=["team"])
        records = self.store.list_teams()
        teams = [t.name for t in records]
        for team in teams:
            for state in JobState:
                jobs.add_metric([state.value, team], counts.get((team, state), 0))
            queue.add_metric([team], counts.get((team, JobState.PENDING), 0))
        yield jobs
        yield queue
        overdue = GaugeMetricFamily(
            "tyard_pending_eta_overdue_seconds",
            "How long past its estimated start the team's most overdue PENDING job is.",
            labels=["team"],
        )
        late = self.store.oldest_overdue_eta(datetime.fromtimestamp(now, UTC))
        for team in teams:
            overdue.add_metric(
                [team], max(now - late[team].timestamp(), 0.0) if team in late else 0.0
            )
        yield overdue
        active = self.store.active_jobs()
        yield from self._gpus(records, active)
        yield from self._running(active, now)
        nodes = GaugeMetricFamily(
            "tyard_node_state",
            "1 for the node's cordon state (ready, cordoned, draining), 0 for the others.",
            labels=["node", "state"],
        )
        for node in self.store.list_nodes():
            for name in NODE_STATES:
                nodes.add_metric([node.name, name], 1.0 if node.state == name else 0.0)
        yield nodes

    def _gpus(self, teams: list[TeamRecord], active: list[JobRecord]) -> Iterable[Metric]:
        total = float(self.total_gpus())
        nominal = {
            t.name: float(total if t.gpu_quota is None else min(t.gpu_quota, total)) for t in teams
        }
        used: Counter[str] = Counter()
        for job in active:
            used[job.team] += sum(len(g) for g in job.placement.values())
        families = {
            key: GaugeMetricFamily(f"tyard_team_gpus_{key}", text, labels=["team"])
            for key, text in (
                ("nominal", "GPUs of the team's nominal quota."),
                ("used", "GPUs held by the team's jobs."),
                ("borrowed", "GPUs the team uses beyond its quota (lent by others)."),
                ("lent", "The team's idle quota in use by other teams."),
            )
        }
        for team, g in team_gpus(nominal, dict(used)).items():
            for key, value in (
                ("nominal", g.nominal),
                ("used", g.used),
                ("borrowed", g.borrowed),
                ("lent", g.lent),
            ):
                families[key].add_metric([team], value)
        yield from families.values()

    def _running(self, active: list[JobRecord], now: float) -> Iterable[Metric]:
        labels = ["job", "team"]
        fam = {
            name: GaugeMetricFamily(name, text, labels=labels)
            for name, text in (
                ("tyard_job_step_time_seconds", "Median step time of the current attempt."),
                ("tyard_job_tokens_per_second", "Tokens per second at the last reported step."),
                ("tyard_job_loss", "Loss at the last reported step."),
                ("tyard_job_goodput", "Share of wall time in kept training steps so far."),
                ("tyard_job_last_checkpoint_age_seconds", "Time since the last checkpoint."),
                ("tyard_job_last_step_age_seconds", "Time since the last reported step."),
                ("tyard_job_heartbeat_age_seconds", "Time since the last heartbeat."),
                ("tyard_job_allocated_seconds", "Time the job's attempts held resources."),
                ("tyard_job_productive_seconds", "Time in training steps that were kept."),
                ("tyard_job_allocated_goodput", "Productive time / allocated time."),
            )
        }
        badput = GaugeMetricFamily(
            "tyard_job_badput_seconds",
            "Time lost, by kind (allocated: startup, checkpoint_save, checkpoint_restore, lost, "
            "hang, other; not allocated: queueing, restart_wait).",
            labels=[*labels, "kind"],
        )
        for job in active:
            if job.state is not JobState.RUNNING or job.attempts == 0:
                continue
            key = [str(job.id), job.team]
            progress = self.store.step_progress(job.id, job.attempts)
            if progress.median_step_s is not None:
                fam["tyard_job_step_time_seconds"].add_metric(key, progress.median_step_s)
            if progress.last_ts is not None:
                fam["tyard_job_last_step_age_seconds"].add_metric(key, now - progress.last_ts)
            latest = self.store.latest_metric(job.id, job.attempts)
            if latest is not None:
                if "loss" in latest.values:
                    fam["tyard_job_loss"].add_metric(key, latest.values["loss"])
                tokens = latest.values.get("tokens")
                if tokens is not None and latest.step_time_s:
                    fam["tyard_job_tokens_per_second"].add_metric(key, tokens / latest.step_time_s)
            checkpoint = self.store.latest_checkpoint(job.id)
            if checkpoint is not None:
                fam["tyard_job_last_checkpoint_age_seconds"].add_metric(key, now - checkpoint.ts)
            if job.last_heartbeat is not None:
                age = now - job.last_heartbeat.timestamp()
                fam["tyard_job_heartbeat_age_seconds"].add_metric(key, age)
            self._add_goodput(fam, badput, key, job, now)
        yield from fam.values()
        yield badput

    def _add_goodput(
        self,
        fam: dict[str, GaugeMetricFamily],
        badput: GaugeMetricFamily,
        key: list[str],
        job: JobRecord,
        now: float,
    ) -> None:
        from tensoryard.server.summary import summarize  # the one goodput computation

        summary = summarize(self.store, job.id, now=datetime.fromtimestamp(now, UTC))
        if summary.goodput is not None:
            fam["tyard_job_goodput"].add_metric(key, summary.goodput)
        b = summary.breakdown
        if b is None or b.allocated_s <= 0:
            return
        fam["tyard_job_allocated_seconds"].add_metric(key, b.allocated_s)
        fam["tyard_job_productive_seconds"].add_metric(key, b.productive_s)
        fam["tyard_job_allocated_goodput"].add_metric(key, b.goodput)
        for kind in BADPUT_KINDS:
            badput.add_metric([*key, kind], getattr(b, f"{kind}_s"))
