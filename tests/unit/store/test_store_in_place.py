"""Store.restart_in_place: torchrun restarted a launch's workers, which report as the next
attempt; one transaction ends the old attempt and starts the new one (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoryard.errors import Conflict
from tensoryard.spec import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import Store

HANDLE = {"executor": "local", "key": "k1", "dir": "/runs/1/attempt-1"}


def running_job(store: Store, *, token: str = "tok") -> int:
    """A job whose attempt 1 runs, with its token issued for attempt 1."""
    store.ensure_team("default")
    spec = JobSpec.model_validate({"name": "t", "command": ["train.py"]})
    job = store.create_job(spec, run_dir_root=Path("/runs"))
    store.transition(job.id, JobState.ADMITTED, reason="admitted")
    store.begin_attempt(
        job.id,
        expected=JobState.ADMITTED,
        number=1,
        attempt_key="k1",
        handle=HANDLE,
        reason="launching",
    )
    store.mark_launched(job.id, 1, HANDLE)
    store.issue_job_token(job.id, token, attempt=1)
    store.mark_running(job.id, 1, "running")
    return job.id


def test_a_restart_ends_the_old_attempt_starts_the_next_and_moves_the_token(store: Store) -> None:
    job_id = running_job(store)
    new = store.restart_in_place(job_id, launch=1, number=2)

    assert (new.number, new.state, new.launch_attempt) == (2, "running", 1)
    assert (new.handle, new.attempt_key) == (HANDLE, "k1")  # the same processes' launch
    assert new.running_at is not None and new.finished_at is None
    old = store.get_attempt(job_id, 1)
    assert old.state == "failed" and old.finished_at is not None and old.launch_attempt is None
    assert "restarted the workers in place" in old.reason
    job = store.get_job(job_id)
    assert (job.attempts, job.restarts, job.state) == (2, 1, JobState.RUNNING)
    assert job.run_time_s >= 0.0
    grant = store.job_token_grant(job_id, "tok")
    assert grant is not None and grant.attempt == 2
    assert [a.number for a in store.current_attempts().values()] == [2]
    assert store.stray_attempts() == []  # the old attempt is closed, not stray
    events = [e.message for e in store.list_events(job_id) if e.kind == "restart"]
    assert events == [
        f"attempt 1 failed ({old.reason}); restarted in place as attempt 2 "
        "(same allocation, no new launch)"
    ]


def test_the_same_restart_reported_twice_is_recorded_once(store: Store) -> None:
    job_id = running_job(store)
    first = store.restart_in_place(job_id, launch=1, number=2)
    again = store.restart_in_place(job_id, launch=1, number=2)  # rank 1's first report
    assert again == first
    assert (store.get_job(job_id).restarts, len(store.list_attempts(job_id))) == (1, 2)


def test_a_restart_that_never_reported_is_recorded_as_failed_on_the_way(store: Store) -> None:
    job_id = running_job(store)
    store.update_attempt(job_id, 1, reason="rank 1 exited with code 137")
    new = store.restart_in_place(job_id, launch=1, number=3)  # restart 1 died before a report
    attempts = store.list_attempts(job_id)
    assert [(a.number, a.state, a.launch_attempt) for a in attempts] == [
        (1, "failed", None),
        (2, "failed", 1),
        (3, "running", 1),
    ]
    assert attempts[0].reason == "rank 1 exited with code 137"  # a recorded reason is kept
    assert new.number == 3 and store.get_job(job_id).restarts == 2
    # a later restart of the same launch continues from the in-place attempt
    assert store.restart_in_place(job_id, launch=1, number=4).launch_attempt == 1


def test_a_stale_launch_or_an_ended_job_is_refused_and_nothing_changes(store: Store) -> None:
    job_id = running_job(store)
    with pytest.raises(Conflict, match="stale"):
        store.restart_in_place(job_id, launch=7, number=8)  # not this job's launch
    store.finish_attempt(
        job_id, 1, state="failed", reason="boom", job_to=JobState.RESTARTING, job_reason="x"
    )
    with pytest.raises(Conflict, match="stale"):
        store.restart_in_place(job_id, launch=1, number=2)  # the launch has ended
    job = store.get_job(job_id)
    assert (job.attempts, job.restarts, len(store.list_attempts(job_id))) == (1, 1, 1)
    grant = store.job_token_grant(job_id, "tok")
    assert grant is not None and grant.attempt == 1


def test_attempts_keep_the_nodes_they_were_launched_on(store: Store) -> None:
    store.ensure_team("default")
    spec = JobSpec.model_validate({"name": "t", "command": ["train.py"]})
    job = store.create_job(spec, run_dir_root=Path("/runs"))
    store.transition(
        job.id, JobState.ADMITTED, reason="admitted", placement={"gpu-b": [0], "gpu-a": [1]}
    )
    first = store.begin_attempt(
        job.id, expected=JobState.ADMITTED, number=1, attempt_key="k1", handle=HANDLE, reason="x"
    )[1]
    assert first.nodes == ("gpu-a", "gpu-b")
    store.mark_launched(job.id, 1, HANDLE)
    store.mark_running(job.id, 1, "running")
    assert store.restart_in_place(job.id, launch=1, number=2).nodes == ("gpu-a", "gpu-b")
    # requeued to be placed elsewhere: PENDING, the placement given back, a restart counted
    moved = store.finish_attempt(
        job.id,
        2,
        state="failed",
        reason="exit 1",
        job_to=JobState.PENDING,
        job_reason="requeued",
        count_restart=True,
        placement={},
    )
    assert (moved.state, moved.restarts, moved.placement) == (JobState.PENDING, 2, {})
    assert [a.nodes for a in store.list_attempts(job.id)] == [("gpu-a", "gpu-b")] * 2
