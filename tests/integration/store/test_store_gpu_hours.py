"""GPU-hours accounted from attempts (SQLite and PostgreSQL): the kinds, day boundaries, the
window and the team filter, against hours worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from tensoryard.errors import SpecError
from tensoryard.spec.job import JobSpec
from tensoryard.store import Store
from tensoryard.store.models import Attempt

T0 = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)


def _job(store: Store, tmp_path: Path, team: str, user: str, gpus: int, nodes: int = 1) -> int:
    store.ensure_team(team)
    spec = JobSpec.model_validate(
        {
            "name": "j",
            "team": team,
            "user": user,
            "command": ["train.py"],
            "resources": {"nodes": nodes, "gpus_per_node": gpus, "processes_per_node": 1},
        }
    )
    return store.create_job(spec, run_dir_root=tmp_path / "runs").id


def _attempt(
    store: Store,
    job_id: int,
    start_h: float,
    running_h: float | None,
    end_h: float | None,
    state: str,
    reason: str = "",
) -> None:
    number = store.start_attempt(job_id, handle={}).number
    at = lambda h: None if h is None else T0 + timedelta(hours=h)  # noqa: E731
    with store.engine.begin() as conn:
        conn.execute(
            update(Attempt)
            .where(Attempt.job_id == job_id, Attempt.number == number)
            .values(
                started_at=at(start_h),
                running_at=at(running_h),
                finished_at=at(end_h),
                state=state,
                reason=reason,
            )
        )


def _by_day(rows: list, team: str) -> dict[str, dict[str, float]]:
    return {
        r.day: {k: round(getattr(r, k), 3) for k in ("useful", "restarts", "preemption", "idle")}
        for r in rows
        if r.team == team
    }


def test_attempts_split_into_kinds_and_days(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path, "nlp", "ann", gpus=2)
    # 20:00-22:00, running from 20:30, failed: 0.5 h idle and 1.5 h lost to restarts, x2 GPUs
    _attempt(store, job, 0, 0.5, 2, "failed", "exit code 1")
    # 22:00-23:00 preempted (running at once): 1 h x 2 GPUs
    _attempt(store, job, 2, 2, 3, "cancelled", "preempted for job 7: needs its quota back")
    # 23:00-01:00 succeeded: 1 h on Dec 1 and 1 h on Dec 2
    _attempt(store, job, 3, 3, 5, "succeeded", "exit code 0")
    rows = store.gpu_hours(since=T0 - timedelta(days=1), until=T0 + timedelta(days=1))
    assert _by_day(rows, "nlp") == {
        "2026-12-01": {"useful": 2.0, "restarts": 3.0, "preemption": 2.0, "idle": 1.0},
        "2026-12-02": {"useful": 2.0, "restarts": 0.0, "preemption": 0.0, "idle": 0.0},
    }
    assert {r.user for r in rows} == {"ann"}


def test_the_window_clips_attempts_and_cpu_jobs_hold_no_gpu_hours(
    store: Store, tmp_path: Path
) -> None:
    big = _job(store, tmp_path, "vision", "bo", gpus=4, nodes=2)  # 8 GPUs
    _attempt(store, big, 0, 0, 10, "succeeded")
    cpu = _job(store, tmp_path, "vision", "bo", gpus=0)
    _attempt(store, cpu, 0, 0, 10, "succeeded")
    rows = store.gpu_hours(since=T0 + timedelta(hours=1), until=T0 + timedelta(hours=3))
    assert [(r.team, r.useful, r.total) for r in rows] == [("vision", 16.0, 16.0)]
    assert store.gpu_hours(since=T0, until=T0 + timedelta(days=1), teams=["nlp"]) == []


def test_an_unfinished_attempt_counts_until_now_as_useful(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path, "nlp", "cy", gpus=1)
    now = store.now()
    number = store.start_attempt(job, handle={}).number
    with store.engine.begin() as conn:
        conn.execute(
            update(Attempt)
            .where(Attempt.job_id == job, Attempt.number == number)
            .values(started_at=now - timedelta(hours=2), running_at=now - timedelta(hours=1))
        )
    # The two hours may straddle midnight UTC (one row per day): sum the days.
    rows = store.gpu_hours(since=now - timedelta(hours=3))
    assert rows and {(r.team, r.user) for r in rows} == {("nlp", "cy")}
    idle, useful = sum(r.idle for r in rows), sum(r.useful for r in rows)
    assert idle == pytest.approx(1.0, abs=0.01) and useful == pytest.approx(1.0, abs=0.01)


def test_a_window_ending_before_it_starts_is_refused_naming_the_field(store: Store) -> None:
    with pytest.raises(SpecError) as caught:
        store.gpu_hours(since=T0, until=T0 - timedelta(hours=1))
    assert caught.value.issues[0].path == "since"
