"""A job's end-of-run numbers: losses, steps, restarts, goodput."""

from __future__ import annotations

from datetime import datetime

from tensoryard.runtime.goodput import compute_goodput
from tensoryard.server.schemas import SummaryOut
from tensoryard.store import Store

__all__ = ["summarize"]


def summarize(store: Store, job_id: int, *, now: datetime) -> SummaryOut:
    """Summarise a job from what the store holds (works while it runs, too)."""
    job = store.get_job(job_id)
    attempts = store.list_attempts(job_id)
    rows = store.list_metrics(job_id)
    losses = [(m.attempt, m.step, m.values["loss"]) for m in rows if "loss" in m.values]
    initial = min(losses, key=lambda r: (r[0], r[1]))[2] if losses else None
    final = max(losses, key=lambda r: (r[0], r[1]))[2] if losses else None
    start = attempts[0].started_at if attempts else None
    end = job.finished_at or now
    wall = (end - start).total_seconds() if start else None
    goodput = None
    steps_lost = 0
    if wall and wall > 0 and rows:
        resumed = {a.number: a.resumed_from_step for a in attempts}
        result = compute_goodput(rows, resumed, wall)
        goodput, steps_lost = result.goodput, result.steps_lost
    latest = store.latest_checkpoint(job_id)
    return SummaryOut(
        job_id=job.id,
        name=job.name,
        state=job.state.value,
        restarts=job.restarts,
        attempts=job.attempts,
        steps=max((m.step for m in rows), default=0),
        initial_loss=initial,
        final_loss=final,
        wall_s=wall,
        goodput=goodput,
        steps_lost=steps_lost,
        last_checkpoint_step=latest.step if latest else None,
    )
