"""Shortest job first with the true durations (an oracle no real scheduler has)."""

from __future__ import annotations

from tensoryard.sim.engine import SimContext

__all__ = ["SjfOraclePolicy"]


class SjfOraclePolicy:
    """Non-preemptive SJF on true durations; a job that does not fit is skipped, not waited for."""

    name = "sjf-oracle"
    oracle = True

    def cycle(self, ctx: SimContext) -> float | None:
        cluster = ctx.cluster
        ordered = sorted(ctx.pending(), key=lambda j: (ctx.true_duration_s(j), j.index))
        for job in ordered:
            if cluster.free_gpus == 0:
                break
            placement = cluster.find(job.nodes, job.gpus_per_node)
            if placement is not None:
                ctx.admit(job, placement)
        return None
