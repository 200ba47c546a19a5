"""A job's end-of-run numbers: losses, steps, restarts, goodput and where the time went.

Computed with aggregate queries (a GROUP BY per attempt, a sum per cut attempt, the first and
last loss), so the answer is exact and cheap for a run of any length.
"""

from __future__ import annotations

from datetime import datetime

from tensoryard.runtime.goodput import (
    AttemptTimes,
    GoodputBreakdown,
    combine_breakdowns,
    goodput_breakdown,
    resume_cuts,
    young_daly_interval,
)
from tensoryard.runtime.megatron import recognise
from tensoryard.server.schemas import (
    CheckpointAdviceOut,
    GoodputBreakdownOut,
    SummaryOut,
    TeamGoodputOut,
)
from tensoryard.spec.job import JobSpec
from tensoryard.store import Store
from tensoryard.store.records import AttemptRecord

__all__ = ["ASSUMED_MTBF_S", "summarize", "team_goodput"]

ASSUMED_MTBF_S = 24 * 3600.0
"""Mean time between failures assumed for the checkpoint advice before any failure is seen."""

_HUNG = "hung"  # the reason prefix of an attempt the controller stopped as hung


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
    productive = lost_s = 0.0
    if stats:
        resumed = {a.number: a.resumed_from_step for a in attempts}
        cuts = resume_cuts({a: st[0] for a, st in stats.items()}, resumed)
        for attempt, (_first, last, rows, seconds) in stats.items():
            cut = cuts[attempt]
            if cut >= last:
                productive += seconds
                continue
            kept_rows, kept_s = store.metric_totals(job_id, attempt, max_step=cut)
            productive += kept_s
            lost_s += seconds - kept_s
            steps_lost += rows - kept_rows
    if wall and wall > 0 and stats:
        goodput = productive / wall
    breakdown = _breakdown(store, job_id, job.created_at, attempts, productive, lost_s, now)
    steps_kept = sum(st[2] for st in stats.values()) - steps_lost
    spec = JobSpec.model_validate(job.spec)
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
        breakdown=GoodputBreakdownOut(**breakdown.as_dict()),
        checkpoint_advice=_advice(store, job_id, spec, attempts, breakdown, steps_kept),
    )


def _breakdown(
    store: Store,
    job_id: int,
    submitted: datetime,
    attempts: list[AttemptRecord],
    productive: float,
    lost_s: float,
    now: datetime,
) -> GoodputBreakdown:
    steps = store.step_times(job_id)
    times = []
    for a in attempts:
        first, last = steps.get(a.number, (None, None))
        times.append(
            AttemptTimes(
                started=a.started_at.timestamp(),
                finished=a.finished_at.timestamp() if a.finished_at else None,
                first_step_start=first,
                last_step_end=last,
                checkpoint_save_s=a.checkpoint_save_s or 0.0,
                checkpoint_restore_s=a.checkpoint_restore_s or 0.0,
                hung=a.reason.startswith(_HUNG),
                admitted=a.admitted_at.timestamp() if a.admitted_at else None,
            )
        )
    return goodput_breakdown(
        submitted.timestamp(), times, productive_s=productive, lost_s=lost_s, now=now.timestamp()
    )


def _advice(
    store: Store,
    job_id: int,
    spec: JobSpec,
    attempts: list[AttemptRecord],
    breakdown: GoodputBreakdown,
    steps_kept: int,
) -> CheckpointAdviceOut | None:
    """Young/Daly from this job's failures and measured save cost; None before any save."""
    reported = {a.number for a in attempts if a.checkpoint_save_s is not None}
    saves = sum(1 for c in store.list_checkpoints(job_id) if c.attempt in reported)
    save_total = sum(a.checkpoint_save_s or 0.0 for a in attempts)
    if saves == 0 or save_total <= 0:
        return None
    failures = sum(1 for a in attempts if _failed(a))
    hours = breakdown.allocated_s / 3600
    if failures:
        mtbf = breakdown.allocated_s / failures
        source = f"{failures} failure(s) in {hours:.2f}h allocated"
    else:
        mtbf = max(ASSUMED_MTBF_S, breakdown.allocated_s)
        source = f"no failure in {hours:.2f}h allocated: assumed MTBF {mtbf / 3600:.0f}h"
    step_s = breakdown.productive_s / steps_kept if steps_kept > 0 else None
    advice = young_daly_interval(save_total / saves, mtbf, step_s=step_s, source=source)
    return CheckpointAdviceOut(
        current_interval_steps=_interval_steps(spec),
        auto=spec.checkpoint.auto_interval,
        interval_s=advice.interval_s,
        interval_steps=advice.interval_steps,
        save_s=advice.save_s,
        mtbf_s=advice.mtbf_s,
        source=advice.source,
    )


def _interval_steps(spec: JobSpec) -> int:
    """The checkpoint interval the job runs with: a Megatron job's --save-interval."""
    megatron = recognise(spec.command, spec.framework)
    if megatron is not None and megatron.save_interval:
        return megatron.save_interval
    return spec.checkpoint.interval


def _failed(attempt: AttemptRecord) -> bool:
    """Ended by a fault (crash, lost, hang), not by the user, a limit or preemption."""
    if attempt.finished_at is None:
        return False
    return attempt.state in ("failed", "lost") or attempt.reason.startswith(_HUNG)


def team_goodput(store: Store, team: str, *, now: datetime) -> TeamGoodputOut:
    """The sum of the breakdowns of a team's jobs (one summary per job)."""
    parts = []
    cursor: str | None = None
    while True:
        page = store.list_jobs(team=team, limit=500, cursor=cursor, newest_first=False)
        for job in page.items:
            summary = summarize(store, job.id, now=now)
            if summary.breakdown is not None:
                parts.append(GoodputBreakdown(**summary.breakdown.model_dump()))
        cursor = page.next_cursor
        if cursor is None:
            break
    total = combine_breakdowns(parts)
    return TeamGoodputOut(
        team=team, jobs=len(parts), breakdown=GoodputBreakdownOut(**total.as_dict())
    )
