"""A Kueue-like baseline: one BestEffortFIFO ClusterQueue per team, borrowing in a cohort.

Modelled on Kueue's defaults: quota is checked per queue (nominal, plus what the cohort can
lend within the borrowing and lending limits); each round takes the head of every queue, puts
heads that need no borrowing first, then higher priority, then older; a head that does not
fit is set aside and the next workload of its queue becomes the head (BestEffortFIFO). Rounds
repeat until no queue has a head left. A workload whose quota fits but that cannot be placed
on a node waits like one that does not fit (Kueue without topology-aware scheduling would hold
the quota while kube-scheduler waits). Nested cohorts are flattened: queues sharing a cohort
name lend to each other.

Preemption follows the ClusterQueue settings ``reclaimWithinCohort: Any`` and
``withinClusterQueue: LowerPriority`` (Kueue's preemption algorithm, quota only): for the
first workload of each queue that does not fit its quota, the candidates are lower-priority
workloads of its own queue and, when it would fit within its queue's nominal quota, workloads
of cohort queues that borrow; other queues' first, then lower priority, then the most
recently started. Candidates are removed until it fits (a queue that stopped borrowing gives
no more), then the fewest are kept. Workloads already preempted and in their grace period
count as gone, so a preemptor waiting for its victims preempts no more.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tensoryard.sim.engine import SimContext
from tensoryard.sim.jobs import JobState
from tensoryard.sim.view import JobView

__all__ = ["KueueLikePolicy"]


@dataclass
class _Queue:
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    cohort: str | None
    usage: int = 0

    def unlent(self) -> int:
        """Unused nominal quota that this queue keeps back from its cohort."""
        if self.lending_limit is None:
            return 0
        return max(0, self.nominal - self.lending_limit - self.usage)


class KueueLikePolicy:
    """BestEffortFIFO per team queue with cohort borrowing; Kueue-style preemption
    (``reclaimWithinCohort: Any``, ``withinClusterQueue: LowerPriority``) unless disabled."""

    name = "kueue-like"

    def __init__(self, *, preemption: bool = True) -> None:
        self.preemption = preemption

    def cycle(self, ctx: SimContext) -> float | None:
        queues = self._queues(ctx)
        by_queue: dict[str, list[JobView]] = defaultdict(list)
        for job in ctx.pending():
            by_queue[job.team].append(job)
        for jobs in by_queue.values():
            jobs.sort(key=lambda j: (-j.trace.priority, j.submit_time_s, j.index))
        cursors = dict.fromkeys(by_queue, 0)
        while cursors and ctx.cluster.free_gpus > 0:
            heads = [by_queue[name][at] for name, at in cursors.items()]
            heads.sort(key=lambda j: (self._borrows(queues, j), -j.trace.priority, j.submit_time_s))
            for job in heads:
                if self._quota_fits(queues, job):
                    placement = ctx.cluster.find(job.nodes, job.gpus_per_node)
                    if placement is not None:
                        ctx.admit(job, placement)
                        queues[job.team].usage += job.gpus
                cursors[job.team] += 1
                if cursors[job.team] >= len(by_queue[job.team]):
                    del cursors[job.team]
        if self.preemption:
            self._preempt(ctx, by_queue)
        return None

    def _preempt(self, ctx: SimContext, by_queue: dict[str, list[JobView]]) -> None:
        """One preemption search per queue: for its first workload that does not fit quota."""
        live = self._queues(ctx, leaving_gone=True)
        running = ctx.running()
        for name in sorted(by_queue):
            for job in by_queue[name]:
                if job.state is not JobState.PENDING:
                    continue
                if not self._quota_fits(live, job):
                    victims = self._targets(live, job, running)
                    for victim in victims:
                        ctx.preempt(victim)
                        live[victim.team].usage -= victim.gpus
                    running = [j for j in running if j not in victims]
                    break

    def _targets(
        self, live: dict[str, _Queue], job: JobView, running: list[JobView]
    ) -> list[JobView]:
        """The fewest candidates whose removal lets `job` fit its quota, or []."""
        queue = live[job.team]
        reclaim = queue.cohort is not None and queue.usage + job.gpus <= queue.nominal
        candidates = [
            r
            for r in running
            if (r.team == job.team and r.trace.priority < job.trace.priority)
            or (
                reclaim
                and r.team != job.team
                and live[r.team].cohort == queue.cohort
                and live[r.team].usage > live[r.team].nominal
            )
        ]
        candidates.sort(key=lambda r: (r.team == job.team, r.trace.priority, -r.attempt_start))
        removed: list[JobView] = []
        fits = False
        for r in candidates:
            owner = live[r.team]
            if r.team != job.team and owner.usage <= owner.nominal:
                continue  # that queue no longer borrows
            owner.usage -= r.gpus
            removed.append(r)
            if self._quota_fits(live, job):
                fits = True
                break
        if fits:
            for r in reversed(removed[:-1]):  # keep the fewest
                live[r.team].usage += r.gpus
                if self._quota_fits(live, job):
                    removed.remove(r)
                else:
                    live[r.team].usage -= r.gpus
        for r in removed:
            live[r.team].usage += r.gpus
        return removed if fits else []

    @staticmethod
    def _queues(ctx: SimContext, *, leaving_gone: bool = False) -> dict[str, _Queue]:
        model = ctx.shape.gpu_model
        queues = {
            q.name: _Queue(
                q.nominal.get(model, 0),
                q.borrowing_limit_for(model),
                q.lending_limit_for(model),
                q.cohort,
            )
            for q in ctx.quotas.queues
        }
        holding = ctx.running() if leaving_gone else ctx.running() + ctx.stopping()
        for job in holding:
            queues[job.team].usage += job.gpus
        return queues

    @staticmethod
    def _borrows(queues: dict[str, _Queue], job: JobView) -> bool:
        queue = queues[job.team]
        return queue.usage + job.gpus > queue.nominal

    @staticmethod
    def _quota_fits(queues: dict[str, _Queue], job: JobView) -> bool:
        """Fits the queue's nominal quota or what it may borrow, and the cohort has the GPUs
        (a queue's unused nominal quota may be lent out: then it must be reclaimed first)."""
        queue = queues[job.team]
        after = queue.usage + job.gpus
        if queue.cohort is None:
            return after <= queue.nominal
        if queue.borrowing_limit is not None and after - queue.nominal > queue.borrowing_limit:
            return False
        members = [q for q in queues.values() if q.cohort == queue.cohort]
        capacity = sum(q.nominal for q in members) - sum(
            q.unlent() for q in members if q is not queue
        )
        used = sum(q.usage for q in members)
        return used + job.gpus <= capacity
