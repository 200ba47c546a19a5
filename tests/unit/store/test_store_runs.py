"""Attempts, heartbeats, events, metrics, checkpoints and job tokens (SQLite)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from tensoryard.errors import NotFound, SpecError
from tensoryard.spec import JobSpec
from tensoryard.store import JobRecord, Store


def submit(store: Store, name: str = "train") -> JobRecord:
    store.ensure_team("default")
    return store.create_job(JobSpec(name=name, command=["train.py"]), run_dir_root=Path("/r"))


# -- attempts ----------------------------------------------------------------------------------


def test_attempts_are_numbered_from_one_and_counted_on_the_job(sqlite_store: Store) -> None:
    job = submit(sqlite_store)
    first = sqlite_store.start_attempt(job.id, handle={"pgid": 100})
    second = sqlite_store.start_attempt(job.id, handle={"pgid": 200}, resumed_from_step=50)
    assert (first.number, second.number) == (1, 2)
    assert (first.state, first.handle, first.resumed_from_step) == ("starting", {"pgid": 100}, None)
    assert second.resumed_from_step == 50
    assert sqlite_store.get_job(job.id).attempts == 2
    assert sqlite_store.list_attempts(job.id) == [first, second]
    assert sqlite_store.get_attempt(job.id, 2) == second


def test_updating_an_attempt_changes_only_what_is_given_and_finishes_once(
    sqlite_store: Store,
) -> None:
    job = submit(sqlite_store)
    sqlite_store.start_attempt(job.id, handle={"pgid": 1})
    running = sqlite_store.update_attempt(job.id, 1, state="running", handle={"pgid": 1, "p": 2})
    assert (running.state, running.handle, running.finished_at) == (
        "running",
        {"pgid": 1, "p": 2},
        None,
    )
    done = sqlite_store.update_attempt(
        job.id, 1, state="failed", exit_code=137, reason="rank 1 killed", finished=True
    )
    assert (done.exit_code, done.reason, done.handle) == (137, "rank 1 killed", {"pgid": 1, "p": 2})
    assert done.finished_at is not None and done.finished_at.tzinfo is UTC
    again = sqlite_store.update_attempt(job.id, 1, finished=True)
    assert again.finished_at == done.finished_at


def test_unknown_attempts_and_jobs_raise_not_found(sqlite_store: Store) -> None:
    job = submit(sqlite_store)
    with pytest.raises(NotFound, match="attempt 1 of job 1 does not exist"):
        sqlite_store.get_attempt(job.id, 1)
    with pytest.raises(NotFound, match="attempt 3 of job 1"):
        sqlite_store.update_attempt(job.id, 3, state="running")
    with pytest.raises(NotFound, match="job 9 does not exist"):
        sqlite_store.start_attempt(9, handle={})
    assert sqlite_store.list_attempts(9) == []


def test_heartbeats_update_job_and_attempt_and_never_move_backwards(sqlite_store: Store) -> None:
    job = submit(sqlite_store)
    sqlite_store.start_attempt(job.id, handle={})
    t1 = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
    sqlite_store.heartbeat(job.id, 1, t1)
    sqlite_store.heartbeat(job.id, 1, t1 - timedelta(seconds=30))  # a late, stale report
    assert sqlite_store.get_job(job.id).last_heartbeat == t1
    assert sqlite_store.get_attempt(job.id, 1).last_heartbeat == t1
    with pytest.raises(NotFound):
        sqlite_store.heartbeat(job.id, 2, t1)


def test_datetimes_in_other_timezones_come_back_as_the_same_instant_in_utc(
    sqlite_store: Store,
) -> None:
    job = submit(sqlite_store)
    sqlite_store.start_attempt(job.id, handle={})
    local = datetime(2026, 7, 1, 14, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    sqlite_store.heartbeat(job.id, 1, local)
    stored = sqlite_store.get_job(job.id).last_heartbeat
    assert stored == local and stored is not None and stored.utcoffset() == timedelta(0)
    assert stored.hour == 12


# -- events ------------------------------------------------------------------------------------


def test_events_are_listed_in_order_after_a_given_id(sqlite_store: Store) -> None:
    job = submit(sqlite_store)
    added = [sqlite_store.add_event(job.id, "runtime", f"m{i}", attempt=1) for i in range(5)]
    assert [e.id for e in added] == sorted(e.id for e in added)
    all_events = sqlite_store.list_events(job.id)
    assert [e.kind for e in all_events] == ["submitted"] + ["runtime"] * 5
    after = sqlite_store.list_events(job.id, after_id=added[1].id, limit=2)
    assert [e.message for e in after] == ["m2", "m3"]
    assert after[0].attempt == 1 and after[0].ts.tzinfo is UTC


def test_events_of_an_unknown_job_are_refused(sqlite_store: Store) -> None:
    with pytest.raises(NotFound):
        sqlite_store.add_event(5, "runtime", "hello")
    assert sqlite_store.list_events(5) == []


# -- metrics -----------------------------------------------------------------------------------


def row(step: int, loss: float = 1.0) -> dict[str, object]:
    return {"step": step, "ts": 1000.0 + step, "step_time_s": 0.5, "values": {"loss": loss}}


def test_resent_metric_rows_are_not_duplicated(sqlite_store: Store) -> None:
    job = submit(sqlite_store)
    assert sqlite_store.add_metrics(job.id, 1, [row(1), row(2), row(3)]) == 3
    assert sqlite_store.add_metrics(job.id, 1, [row(2, 9.0), row(3), row(4)]) == 1
    assert sqlite_store.add_metrics(job.id, 1, [row(5), row(5, 7.0)]) == 1
    assert sqlite_store.add_metrics(job.id, 2, [row(3)]) == 1  # same step, new attempt
    assert sqlite_store.add_metrics(job.id, 1, []) == 0
    rows = sqlite_store.list_metrics(job.id)
    assert [(m.attempt, m.step) for m in rows] == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (2, 3)]
    assert rows[1].values == {"loss": 1.0}  # the first report of a step wins
    assert rows[4].values == {"loss": 1.0}


def test_metrics_can_be_filtered_by_attempt_and_step(sqlite_store: Store) -> None:
    job = submit(sqlite_store)
    sqlite_store.add_metrics(job.id, 1, [row(s) for s in range(1, 6)])
    sqlite_store.add_metrics(job.id, 2, [row(s) for s in range(4, 8)])
    assert [m.step for m in sqlite_store.list_metrics(job.id, attempt=2, after_step=5)] == [6, 7]
    assert [m.step for m in sqlite_store.list_metrics(job.id, after_step=4, limit=3)] == [5, 5, 6]
    first = sqlite_store.list_metrics(job.id, attempt=1)[0]
    assert (first.ts, first.step_time_s, first.job_id) == (1001.0, 0.5, job.id)


def test_a_malformed_metric_row_stores_nothing_and_names_the_row(sqlite_store: Store) -> None:
    job = submit(sqlite_store)
    with pytest.raises(SpecError) as info:
        sqlite_store.add_metrics(job.id, 1, [row(1), {"ts": 1.0, "values": {}}])
    assert info.value.issues[0].path == "metrics.1"
    with pytest.raises(SpecError):
        sqlite_store.add_metrics(job.id, 1, [{"step": 2, "ts": 1.0, "values": {"loss": "nan?"}}])
    assert sqlite_store.list_metrics(job.id) == []
    with pytest.raises(NotFound):
        sqlite_store.add_metrics(77, 1, [row(1)])


# -- checkpoints -------------------------------------------------------------------------------


def test_checkpoints_are_idempotent_and_the_latest_is_the_highest_step(
    sqlite_store: Store,
) -> None:
    job = submit(sqlite_store)
    assert sqlite_store.latest_checkpoint(job.id) is None
    a = sqlite_store.add_checkpoint(job.id, 1, step=50, path="/c/50", ts=1.0, size_bytes=10)
    again = sqlite_store.add_checkpoint(job.id, 1, step=50, path="/c/50", ts=2.0, size_bytes=99)
    assert again == a
    big = sqlite_store.add_checkpoint(
        job.id, 2, step=100, path="/c/100", ts=3.0, size_bytes=5 * 2**40
    )
    sqlite_store.add_checkpoint(job.id, 2, step=75, path="/c/75", ts=4.0)
    assert sqlite_store.latest_checkpoint(job.id) == big
    assert big.size_bytes == 5 * 2**40  # larger than 32 bits
    assert [c.step for c in sqlite_store.list_checkpoints(job.id)] == [50, 75, 100]


def test_the_latest_checkpoint_times_of_many_jobs_are_those_of_latest_checkpoint(
    store: Store,
) -> None:
    """One query for many jobs (the scheduler's every pass) agrees with the one-job read:
    the highest step wins, the newest report breaks a tie, jobs without one are absent."""
    jobs = [submit(store, name=f"ckpt-{i}") for i in range(3)]
    a, b, none = (j.id for j in jobs)
    store.add_checkpoint(a, 1, step=100, path="/a/100", ts=5.0)
    store.add_checkpoint(a, 1, step=50, path="/a/50", ts=9.0)  # later, lower step
    store.add_checkpoint(b, 1, step=20, path="/b/20-x", ts=3.0)
    store.add_checkpoint(b, 2, step=20, path="/b/20-y", ts=4.0)  # same step, newer
    many = [a, b, none, *range(10_000, 10_700)]  # more than one chunk of ids
    assert store.latest_checkpoint_times(many) == {a: 5.0, b: 4.0}
    for job in (a, b):
        latest = store.latest_checkpoint(job)
        assert latest is not None and latest.ts == store.latest_checkpoint_times([job])[job]
    assert store.latest_checkpoint_times([]) == {}


# -- job tokens --------------------------------------------------------------------------------


def test_a_job_token_checks_only_for_its_job_and_a_new_one_replaces_it(
    sqlite_store: Store,
) -> None:
    one, two = submit(sqlite_store, "a"), submit(sqlite_store, "b")
    token = sqlite_store.issue_job_token(one.id)
    assert len(token) >= 32
    assert sqlite_store.check_job_token(one.id, token)
    assert not sqlite_store.check_job_token(two.id, token)
    assert not sqlite_store.check_job_token(one.id, token + "x")
    assert not sqlite_store.check_job_token(one.id, "")
    newer = sqlite_store.issue_job_token(one.id)
    assert newer != token
    assert not sqlite_store.check_job_token(one.id, token)
    assert sqlite_store.check_job_token(one.id, newer)
    sqlite_store.revoke_job_token(one.id)
    assert not sqlite_store.check_job_token(one.id, newer)


def test_only_the_hash_of_a_job_token_is_stored(sqlite_store: Store) -> None:
    job = submit(sqlite_store)
    token = sqlite_store.issue_job_token(job.id)
    with sqlite_store.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT token_hash FROM job_tokens")).scalar_one()
    assert stored == hashlib.sha256(token.encode()).hexdigest()
    assert token not in stored
