"""The same behaviour on SQLite and PostgreSQL: a job's whole life and the edge cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import event

from tensoryard.errors import Conflict, NotFound, StoreError
from tensoryard.spec import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import AuditContext, Store

S = JobState


def spec(name: str = "train", **kw: object) -> JobSpec:
    return JobSpec.model_validate({"name": name, "command": ["train.py", "--lr", "3e-4"], **kw})


def test_a_job_lives_from_submission_through_a_restart_to_success(store: Store) -> None:
    store.ensure_team("nlp", gpu_quota=16, cpu_quota=128.5, description="language")
    job = store.create_job(spec(team="nlp", user="ada", priority=3), run_dir_root=Path("/runs"))
    eta = datetime(2030, 1, 1, 8, 30, tzinfo=UTC)
    store.update_job(job.id, pending_reason="needs 16 GPUs, 8 free", pending_eta=eta)
    assert store.get_job(job.id).pending_eta == eta

    placement = {"node-a": [0, 1, 2, 3], "node-b": [4, 5, 6, 7]}
    store.transition(job.id, S.ADMITTED, reason="fits", expected=[S.PENDING], placement=placement)
    store.transition(job.id, S.STARTING, reason="launched")
    store.start_attempt(job.id, handle={"pgid": 4242, "ranks": [1, 2]})
    store.transition(job.id, S.RUNNING, reason="all ranks up")
    store.add_metrics(
        job.id, 1, [{"step": s, "ts": 1.0 * s, "values": {"loss": 3.0}} for s in range(1, 11)]
    )
    store.add_checkpoint(job.id, 1, step=10, path="/ckpt/step-10", ts=10.0, size_bytes=3 * 2**33)
    store.update_attempt(
        job.id, 1, state="FAILED", exit_code=-9, reason="rank 1 killed", finished=True
    )
    store.transition(job.id, S.RESTARTING, reason="rank 1 killed")
    store.transition(job.id, S.STARTING, reason="relaunched")
    resume = store.latest_checkpoint(job.id)
    assert resume is not None and resume.step == 10 and resume.size_bytes == 3 * 2**33
    store.start_attempt(job.id, handle={"pgid": 4343}, resumed_from_step=resume.step)
    store.transition(job.id, S.RUNNING, reason="all ranks up")
    store.heartbeat(job.id, 2, datetime(2030, 1, 1, 9, 0, tzinfo=UTC))
    store.add_metrics(
        job.id, 2, [{"step": s, "ts": 1.0 * s, "values": {"loss": 1.0}} for s in range(11, 21)]
    )
    done = store.transition(job.id, S.SUCCEEDED, reason="exit 0", expected=[S.RUNNING])

    assert (done.state, done.attempts, done.restarts, done.placement) == (
        S.SUCCEEDED,
        2,
        1,
        placement,
    )
    assert done.team == "nlp" and store.get_team("nlp").cpu_quota == 128.5
    assert done.spec["command"] == ["train.py", "--lr", "3e-4"]
    for stamp in (done.created_at, done.admitted_at, done.started_at, done.finished_at):
        assert stamp is not None and stamp.tzinfo is UTC
    assert done.created_at <= done.admitted_at <= done.started_at <= done.finished_at  # type: ignore[operator]
    assert done.last_heartbeat == datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
    attempts = store.list_attempts(job.id)
    assert [(a.number, a.exit_code, a.resumed_from_step) for a in attempts] == [
        (1, -9, None),
        (2, None, 10),
    ]
    assert attempts[0].handle == {"pgid": 4242, "ranks": [1, 2]}
    assert len(store.list_metrics(job.id)) == 20
    assert [e.kind for e in store.list_events(job.id)] == ["submitted"] + ["state"] * 7
    assert store.active_jobs() == [] and store.pending_jobs() == []


def test_refused_and_stale_transitions_are_conflicts_that_change_nothing(store: Store) -> None:
    store.ensure_team("default")
    job = store.create_job(spec(), run_dir_root=Path("/r"))
    with pytest.raises(Conflict, match="PENDING; it cannot move to RUNNING"):
        store.transition(job.id, S.RUNNING, reason="skip ahead")
    store.transition(job.id, S.CANCELLED, reason="user asked")
    with pytest.raises(Conflict, match="is CANCELLED, not PENDING"):
        store.transition(job.id, S.ADMITTED, reason="late", expected=[S.PENDING])
    with pytest.raises(Conflict, match="already CANCELLED"):
        store.request_cancel(job.id)
    assert [e.kind for e in store.list_events(job.id)] == ["submitted", "state"]
    with pytest.raises(NotFound):
        store.transition(999, S.ADMITTED, reason="ghost")


def test_errors_in_the_middle_of_a_write_roll_everything_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.ensure_team("default")
    job = store.create_job(spec(), run_dir_root=Path("/r"))

    def broken_event(*_a: object, **_k: object) -> None:
        raise StoreError("injected failure")

    monkeypatch.setattr(store, "_event", broken_event)
    with pytest.raises(StoreError, match="injected"):
        store.transition(job.id, S.ADMITTED, reason="fits", placement={"n": [0]})
    with pytest.raises(StoreError, match="injected"):
        store.create_job(spec("other"), run_dir_root=Path("/r"))
    monkeypatch.undo()
    assert store.get_job(job.id) == job
    assert store.list_jobs().total == 1
    with pytest.raises(NotFound, match=r"unknown team 'ghost'.*one of: default"):
        store.create_job(spec(team="ghost"), run_dir_root=Path("/r"))
    assert store.list_jobs().total == 1


def test_listing_filters_pages_and_orders_pending_jobs_the_same_way(store: Store) -> None:
    store.ensure_team("default")
    store.ensure_team("vision")
    ids = [
        store.create_job(
            spec(f"j{i}", priority=i % 3, team=["default", "vision"][i % 2]),
            run_dir_root=Path("/r"),
        ).id
        for i in range(9)
    ]
    store.transition(ids[0], S.ADMITTED, reason="fits")
    pages, cursor = [], None
    while True:
        page = store.list_jobs(limit=4, cursor=cursor, team="vision")
        pages.append([j.id for j in page.items])
        if (cursor := page.next_cursor) is None:
            break
    assert pages == [[ids[7], ids[5], ids[3], ids[1]]]
    all_pages, cursor = [], None
    while True:
        page = store.list_jobs(limit=2, cursor=cursor, newest_first=False, states=[S.PENDING])
        assert page.total == 8
        all_pages += [j.id for j in page.items]
        if (cursor := page.next_cursor) is None:
            break
    assert all_pages == ids[1:]
    by_priority = [(j.priority, j.id) for j in store.pending_jobs()]
    assert by_priority == sorted(by_priority, key=lambda p: (-p[0], p[1]))
    assert [j.id for j in store.active_jobs()] == [ids[0]]


def test_resent_reports_are_idempotent_and_tokens_check_out(store: Store) -> None:
    store.ensure_team("default")
    job = store.create_job(spec(), run_dir_root=Path("/r"))
    rows = [
        {"step": s, "ts": 100.0 + s, "step_time_s": 0.25, "values": {"loss": 2.0 / s}}
        for s in range(1, 6)
    ]
    assert store.add_metrics(job.id, 1, rows) == 5
    assert store.add_metrics(job.id, 1, [*rows[2:], {"step": 6, "ts": 1.0, "values": {}}]) == 1
    assert [m.values.get("loss") for m in store.list_metrics(job.id, after_step=4)] == [0.4, None]
    first = store.add_checkpoint(job.id, 1, step=5, path="/c/5", ts=5.0)
    assert store.add_checkpoint(job.id, 1, step=5, path="/c/5", ts=6.0) == first
    assert len(store.list_checkpoints(job.id)) == 1
    token = store.issue_job_token(job.id)
    assert store.check_job_token(job.id, token)
    assert not store.check_job_token(job.id, token[:-1])
    assert not store.check_job_token(job.id + 1, token)


def test_stored_times_are_the_same_instants_in_utc(store: Store) -> None:
    store.ensure_team("default")
    job = store.create_job(spec(), run_dir_root=Path("/r"))
    store.start_attempt(job.id, handle={})
    plus_five = timezone(timedelta(hours=5))
    beat = datetime(2031, 3, 4, 17, 0, 0, 123456, tzinfo=plus_five)
    store.heartbeat(job.id, 1, beat)
    eta = datetime(2031, 3, 4, 20, 0)  # naive: taken as UTC
    got = store.update_job(job.id, pending_eta=eta)
    assert got.last_heartbeat == beat and got.last_heartbeat.tzinfo is UTC  # type: ignore[union-attr]
    assert got.last_heartbeat.hour == 12  # type: ignore[union-attr]
    assert got.pending_eta == eta.replace(tzinfo=UTC)


def test_a_repeated_submission_with_the_same_key_returns_the_first_job(store: Store) -> None:
    store.ensure_team("default")
    first = store.create_job(spec(user="ada"), run_dir_root=Path("/runs"), key="k1")
    again = store.create_job(spec(user="ada"), run_dir_root=Path("/runs"), key="k1")
    assert again.id == first.id
    assert [e.kind for e in store.list_events(first.id)] == ["submitted"]
    # the key is per user: another user's key of the same name is a different submission
    other = store.create_job(spec(user="bob"), run_dir_root=Path("/runs"), key="k1")
    assert other.id != first.id
    with pytest.raises(Conflict, match=r"k1.*different submission"):
        store.create_job(spec("other", user="ada"), run_dir_root=Path("/runs"), key="k1")
    batch = [spec(f"b{i}", user="ada") for i in range(3)]
    ids = [j.id for j in store.create_jobs(batch, run_dir_root=Path("/runs"), key="k2")]
    assert [j.id for j in store.create_jobs(batch, run_dir_root=Path("/runs"), key="k2")] == ids
    with pytest.raises(Conflict, match="k2"):
        store.create_jobs(batch[:2], run_dir_root=Path("/runs"), key="k2")
    # a batch's key reused for one job, and one job's key for a batch: both found
    with pytest.raises(Conflict, match="k2"):
        store.create_job(batch[0], run_dir_root=Path("/runs"), key="k2")
    with pytest.raises(Conflict, match="k1"):
        store.create_jobs(batch, run_dir_root=Path("/runs"), key="k1")
    assert store.list_jobs(limit=100).total == 5  # first, other and the batch of 3: no copies


def test_a_request_reads_its_caller_in_one_query_and_a_submit_checks_in_one(
    store: Store,
) -> None:
    """Each statement is a round trip on PostgreSQL: authentication (token, user and teams)
    is one query, and a submit reads what its insert needs (an earlier submission under the
    key, the team, and on PostgreSQL the new id) in one query before its inserts."""
    store.ensure_team("nlp")
    store.ensure_team("vision")
    store.create_user("ada")
    store.set_member("nlp", "ada", "member")
    store.set_member("vision", "ada", "viewer")
    issued = store.create_token("ada")
    store.authenticate(issued.token)  # notes the first use (a write), not counted below
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, sql: str, *_args: object) -> None:
        word = sql.split()[0].upper()
        if word not in ("BEGIN", "PRAGMA"):  # SQLite's transaction statements
            statements.append(word)

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        user, _ = store.authenticate(issued.token)
        assert user.teams == {"nlp": "member", "vision": "viewer"}
        assert statements == ["SELECT"]
        statements.clear()
        job = store.create_job(
            spec(team="nlp", user="ada"),
            run_dir_root=Path("/runs"),
            key="k1",
            audit=AuditContext(actor="ada"),
        )
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    assert job.run_dir == f"/runs/job-{job.id}"
    assert statements[0] == "SELECT" and statements.count("SELECT") == 1
    if store.dialect == "postgresql":  # the job, its event and its audit row
        assert statements[1:] == ["INSERT", "INSERT", "INSERT"]
    else:  # no sequence: the id comes from the insert, the run directory after it
        assert sorted(statements[1:]) == ["INSERT", "INSERT", "INSERT", "UPDATE"]
    with pytest.raises(NotFound, match=r"unknown team 'cv'.*teams create cv.*nlp, vision"):
        store.create_job(spec(team="cv", user="ada"), run_dir_root=Path("/runs"))
    assert store.list_jobs(limit=10).total == 1
