"""Strict FIFO: jobs start in submit order; a head that does not fit blocks everything."""

from __future__ import annotations

from tensoryard.sim.engine import SimContext

__all__ = ["FifoPolicy"]


class FifoPolicy:
    """Strict first-in first-out, non-preemptive (YARN-CS style, no backfill)."""

    name = "fifo"

    def cycle(self, ctx: SimContext) -> float | None:
        cluster = ctx.cluster
        for job in ctx.pending():  # pending order is submit order: FIFO never requeues
            placement = cluster.find(job.nodes, job.gpus_per_node)
            if placement is None:
                break  # the head blocks every job behind it
            ctx.admit(job, placement)
        return None
