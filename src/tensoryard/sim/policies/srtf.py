"""Shortest remaining time first with the true durations: the bound, not a real scheduler.

Preemptive SRTF on true remaining run time (an oracle no real scheduler has): the jobs with
the least remaining time run, a newcomer shorter than a runner preempts it, and preempted
jobs pay the same grace period and lost work since their last checkpoint as under every
other policy. Preemption only for jobs that can then be placed (see ``preemptive``).
"""

from __future__ import annotations

from tensoryard.sim.engine import SimContext
from tensoryard.sim.policies.preemptive import run_in_order

__all__ = ["SrtfOraclePolicy"]


class SrtfOraclePolicy:
    """Preemptive SRTF on true remaining times (declared an oracle)."""

    name = "srtf-oracle"
    oracle = True

    def cycle(self, ctx: SimContext) -> float | None:
        pending = ctx.pending()
        if not pending:
            return None
        jobs = ctx.running() + pending
        ordered = sorted(jobs, key=lambda j: (ctx.true_remaining_s(j), j.submit_time_s, j.index))
        run_in_order(ctx, ordered)
        return None
