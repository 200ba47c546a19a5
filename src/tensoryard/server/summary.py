"""A job's end-of-run numbers: losses, steps, restarts, goodput.

Computed with aggregate queries (a GROUP BY per attempt, a sum per cut attempt, the first and
last loss), so the answer is exact and cheap for a run of any length.
"""

from __future__ import annotations

from datetime import datetime

from tensoryard.runtime.goodput import resume_cuts
from tensoryard.server.schemas import SummaryOut
from tensoryard.store import Store

__all__ = ["summarize"]


def summarize(store: Store, job_id: int, *, now: datetime) -> SummaryOut:
    """Summarise a job from what the store holds (works while it runs, too)."""
    job = store.get_job(job_id)
    attempts = store.list_attempts(job_id)
    stats = store.metric_stats(job_id)
    start = attempts[0].started_at if attempts else None
    end = job.finished_at or now
    wall = (end - start).total_seconds() if start else None
    goodput = None
    steps_lost = 0
    if wall and wall > 0 and stats:
        resumed = {a.number: a.resumed_from_step for a in attempts}
        cuts = resume_cuts({a: st[0] for a, st in stats.items()}, resumed)
        productive = 0.0
        for attempt, (_first, last, rows, seconds) in stats.items():
            cut = cuts[attempt]
            if cut >= last:
                productive += seconds
                continue
            kept_rows, kept_s = store.metric_totals(job_id, attempt, max_step=cut)
            productive += kept_s
            steps_lost += rows - kept_rows
        goodput = productive / wall
    latest = store.latest_checkpoint(job_id)
    return SummaryOut(
        job_id=job.id,
        name=job.name,
        state=job.state.value,
        restarts=job.restarts,
        attempts=job.attempts,
        steps=max((st[1] for st in stats.values()), default=0),
        initial_loss=store.metric_value(job_id, "loss", newest=False),
        final_loss=store.metric_value(job_id, "loss", newest=True),
        wall_s=wall,
        goodput=goodput,
        steps_lost=steps_lost,
        last_checkpoint_step=latest.step if latest else None,
    )
