"""Per-rank step time and data-loader wait of one attempt, with its stragglers, for the job
page's per-rank plots (`GET /api/v1/jobs/{id}/ranks`).

The numbers are the runtime's own history files in the job's run directory
(:func:`tensoryard.runtime.rank_stats.read_rank_history`), so the control plane must see that
directory (the local executor, or a filesystem it shares with the nodes). Stragglers are the
runtime's (:mod:`tensoryard.runtime.stragglers`): the ranks its detector named in the job's
events and has not yet seen recover, not a second judgement made here.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from tensoryard.api.node_telemetry import GpuTelemetry
from tensoryard.runtime.rank_stats import read_rank_history
from tensoryard.runtime.stragglers import flagged_ranks
from tensoryard.store import EventRecord, JobRecord

__all__ = ["RankGpuOut", "RankSeriesOut", "RanksOut", "gpu_now", "rank_view", "thin"]


class RankSeriesOut(BaseModel):
    rank: int
    points: list[tuple[int, float, float]]
    """``[step, step_time_s, data_wait_s]``, oldest first, at most one a second."""
    straggler: bool
    straggler_message: str | None = None
    """The runtime's event that named it (forward time against the other ranks' median)."""


class RankGpuOut(BaseModel):
    rank: str
    """'' when the agent cannot tell (not one process per GPU)."""
    node: str
    gpu: int
    util_pct: float | None


class RanksOut(BaseModel):
    job: int
    attempt: int
    """The attempt shown (the latest when none was asked for); 0 before any."""
    ranks: list[RankSeriesOut]
    stragglers: list[int]
    note: str
    """Why there is nothing to show, or "" when there is."""
    gpus: list[RankGpuOut] = []
    """The running attempt's GPUs, their utilisation now (from the agents' heartbeats)."""


def thin(rows: list[tuple[int, float, float, float]], limit: int) -> list[tuple[int, float, float]]:
    """At most `limit` rows, evenly spread and always keeping the newest, without their ts."""
    if len(rows) > limit:
        stride = len(rows) / limit
        rows = [rows[int(i * stride)] for i in range(limit - 1)] + [rows[-1]]
    return [(step, step_s, wait_s) for step, step_s, wait_s, _ in rows]


def rank_view(
    job: JobRecord, attempt: int, events: Iterable[EventRecord], *, limit: int
) -> RanksOut:
    """Every rank's series of `attempt` and the ranks still flagged as stragglers by the
    runtime's events of that attempt (`events` oldest first)."""
    if attempt < 1:
        return RanksOut(job=job.id, attempt=0, ranks=[], stragglers=[], note="no attempt yet")
    flagged = flagged_ranks(e.message for e in events if e.attempt == attempt)
    history = read_rank_history(job.run_dir, attempt) if job.run_dir else {}
    ranks = [
        RankSeriesOut(
            rank=rank,
            points=thin(rows, limit),
            straggler=rank in flagged,
            straggler_message=flagged.get(rank),
        )
        for rank, rows in history.items()
    ]
    note = (
        ""
        if ranks
        else (
            f"no per-rank numbers for attempt {attempt}: its ranks have not finished a step, "
            "the job does not use the runtime's training loop, or this control plane cannot "
            "read its run directory"
        )
    )
    return RanksOut(job=job.id, attempt=attempt, ranks=ranks, stragglers=sorted(flagged), note=note)


def gpu_now(gpus: Iterable[tuple[str, GpuTelemetry]]) -> list[RankGpuOut]:
    """A job's GPUs as the agents last reported them, by rank (unknown ranks last), then node."""
    out = [RankGpuOut(rank=g.rank or "", node=n, gpu=g.gpu, util_pct=g.util_pct) for n, g in gpus]
    return sorted(out, key=lambda r: (r.rank == "", int(r.rank or 0), r.node, r.gpu))
