"""Shared by the preemptive baselines (Tiresias-LAS, SRTF): run the jobs first in an order,
preempting others only for a job that the freed GPUs can actually place.

Given every running and pending job in the policy's order, the jobs that should hold GPUs
are the first ones that fit the cluster's GPU count (a job too big for what is left is
skipped, the next one may still fit). Pending jobs among them start at once where they fit.
For each one that does not, the running jobs that lost their turn are taken away in a what-if
copy of the cluster, last in the order first, until it can be placed; only then are those
victims preempted. GPUs of jobs already in their grace period count as free in the what-if
(they are about to be released), so a job waiting for its victims preempts no more.
"""

from __future__ import annotations

from tensoryard.sim.engine import SimContext
from tensoryard.sim.jobs import JobState
from tensoryard.sim.view import JobView

__all__ = ["run_in_order"]


def run_in_order(ctx: SimContext, ordered: list[JobView]) -> None:
    """Admit and preempt so that the first jobs of `ordered` that fit are the ones running."""
    budget = ctx.shape.total_gpus
    chosen: set[int] = set()
    for job in ordered:
        if job.gpus <= budget:
            chosen.add(job.index)
            budget -= job.gpus
    waiting: list[JobView] = []
    for job in ordered:
        if job.index in chosen and job.state is JobState.PENDING:
            placement = ctx.cluster.find(job.nodes, job.gpus_per_node)
            if placement is not None:
                ctx.admit(job, placement)
            else:
                waiting.append(job)
    if not waiting:
        return
    victims = [j for j in reversed(ordered) if j.state is JobState.RUNNING]
    victims = [j for j in victims if j.index not in chosen]
    what_if = ctx.cluster.clone()
    for job in ctx.stopping():
        assert job.placement is not None
        what_if.release(job.placement)
    for job in waiting:
        placement = what_if.find(job.nodes, job.gpus_per_node)
        taken: list[JobView] = []
        while placement is None and len(taken) < len(victims):
            victim = victims[len(taken)]
            assert victim.placement is not None
            what_if.release(victim.placement)
            taken.append(victim)
            placement = what_if.find(job.nodes, job.gpus_per_node)
        if placement is None:
            for victim in taken:  # it cannot be placed even so: preempt nobody for it
                assert victim.placement is not None
                what_if.allocate(victim.placement)
            continue
        what_if.allocate(placement)
        for victim in taken:
            ctx.preempt(victim)
        victims = victims[len(taken) :]
