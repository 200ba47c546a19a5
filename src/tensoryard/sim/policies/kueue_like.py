"""A Kueue-like baseline: one BestEffortFIFO ClusterQueue per team, borrowing in a cohort.

Modelled on Kueue's defaults: quota is checked per queue (nominal, plus what the cohort can
lend within the borrowing and lending limits); each round takes the head of every queue, puts
heads that need no borrowing first, then higher priority, then older; a head that does not
fit is set aside and the next workload of its queue becomes the head (BestEffortFIFO). Rounds
repeat until no queue has a head left. No preemption (Kueue's default ``Never`` policies), and
a workload whose quota fits but that cannot be placed on a node waits like one that does not
fit (Kueue without topology-aware scheduling would hold the quota while kube-scheduler waits).
Nested cohorts are flattened: queues sharing a cohort name lend to each other.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tensoryard.sim.engine import SimContext
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
    """BestEffortFIFO per team queue with cohort borrowing, no preemption."""

    name = "kueue-like"

    def cycle(self, ctx: SimContext) -> float | None:
        queues = self._queues(ctx)
        by_queue: dict[str, list[JobView]] = defaultdict(list)
        for job in ctx.pending():
            by_queue[job.team].append(job)
        for jobs in by_queue.values():
            jobs.sort(key=lambda j: (j.submit_time_s, j.index))
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
        return None

    @staticmethod
    def _queues(ctx: SimContext) -> dict[str, _Queue]:
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
        for job in ctx.running() + ctx.stopping():
            queues[job.team].usage += job.gpus
        return queues

    @staticmethod
    def _borrows(queues: dict[str, _Queue], job: JobView) -> bool:
        queue = queues[job.team]
        return queue.usage + job.gpus > queue.nominal

    @staticmethod
    def _quota_fits(queues: dict[str, _Queue], job: JobView) -> bool:
        queue = queues[job.team]
        after = queue.usage + job.gpus
        if after <= queue.nominal:
            return True
        if queue.cohort is None:
            return False
        if queue.borrowing_limit is not None and after - queue.nominal > queue.borrowing_limit:
            return False
        members = [q for q in queues.values() if q.cohort == queue.cohort]
        capacity = sum(q.nominal for q in members) - sum(
            q.unlent() for q in members if q is not queue
        )
        used = sum(q.usage for q in members)
        return used + job.gpus <= capacity
