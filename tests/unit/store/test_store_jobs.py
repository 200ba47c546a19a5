"""Teams, job submission, the state machine, cancellation and listings (SQLite)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensoryard.errors import Conflict, NotFound, SpecError, StoreError
from tensoryard.spec import JobSpec
from tensoryard.spec.states import ALLOWED_TRANSITIONS, TERMINAL_STATES, JobState
from tensoryard.store import JobRecord, Store, default_sqlite_url

S = JobState
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

# The shortest way from PENDING to each state.
PATH_TO: dict[JobState, list[JobState]] = {
    S.PENDING: [],
    S.ADMITTED: [S.ADMITTED],
    S.STARTING: [S.ADMITTED, S.STARTING],
    S.RUNNING: [S.ADMITTED, S.STARTING, S.RUNNING],
    S.RESTARTING: [S.ADMITTED, S.STARTING, S.RUNNING, S.RESTARTING],
    S.SUCCEEDED: [S.ADMITTED, S.STARTING, S.RUNNING, S.SUCCEEDED],
    S.FAILED: [S.FAILED],
    S.CANCELLED: [S.CANCELLED],
}
ALL_PAIRS = [(a, b) for a in JobState for b in JobState]


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db(migrated_sqlite_url: str, clock: FakeClock) -> Iterator[Store]:
    with Store.open(migrated_sqlite_url, clock=clock) as store:
        store.ensure_team("default")
        yield store


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One store for the many state-machine cases; each case works on its own new job."""
    home = tmp_path_factory.mktemp("state-machine")
    with Store.open(default_sqlite_url(home)) as store:
        store.ensure_team("default")
        yield store


def spec(name: str = "train", **kw: object) -> JobSpec:
    return JobSpec.model_validate({"name": name, "command": ["train.py"], **kw})


def submit(db: Store, name: str = "train", **kw: object) -> JobRecord:
    return db.create_job(spec(name, **kw), run_dir_root=Path("/runs"))


def drive(db: Store, job_id: int, states: list[JobState]) -> JobRecord:
    job = db.get_job(job_id)
    for state in states:
        job = db.transition(job_id, state, reason=f"to {state.lower()}")
    return job


# -- teams -------------------------------------------------------------------------------------


def test_ensure_team_is_idempotent_and_keeps_the_first_settings(db: Store) -> None:
    first = db.ensure_team("vision", gpu_quota=8, cpu_quota=64.0, description="CV")
    again = db.ensure_team("vision", gpu_quota=1)
    assert again == first
    assert (first.gpu_quota, first.cpu_quota, first.description) == (8, 64.0, "CV")
    assert [t.name for t in db.list_teams()] == ["default", "vision"]


def test_update_team_changes_only_the_given_fields(db: Store) -> None:
    db.ensure_team("nlp", gpu_quota=4, description="text")
    updated = db.update_team("nlp", gpu_quota=None, cpu_quota=16.0)
    assert (updated.gpu_quota, updated.cpu_quota, updated.description) == (None, 16.0, "text")
    with pytest.raises(NotFound):
        db.update_team("nobody", gpu_quota=1)


@pytest.mark.parametrize(
    ("kwargs", "paths"),
    [
        ({"name": "Vision Team"}, ["name"]),
        ({"name": "x" * 64}, ["name"]),
        ({"name": "ok", "gpu_quota": -1, "cpu_quota": -0.5}, ["gpu_quota", "cpu_quota"]),
    ],
    ids=[
        "a name no job spec could use is refused",
        "a name longer than 63 characters is refused",
        "negative quotas are refused",
    ],
)
def test_invalid_teams_are_refused_naming_the_field(
    db: Store, kwargs: dict[str, Any], paths: list[str]
) -> None:
    with pytest.raises(SpecError) as info:
        db.ensure_team(**kwargs)
    assert [i.path for i in info.value.issues] == paths
    assert [t.name for t in db.list_teams()] == ["default"]


def test_get_team_of_an_unknown_name_raises_not_found(db: Store) -> None:
    with pytest.raises(NotFound, match="team 'ghost' does not exist"):
        db.get_team("ghost")


# -- submission --------------------------------------------------------------------------------


def test_a_submitted_job_is_pending_with_its_spec_run_dir_and_an_event(db: Store) -> None:
    original = spec("llm", priority=5, user="ada", env={"A": "1"})
    job = db.create_job(original, run_dir_root=Path("/runs"))
    assert job.state is S.PENDING
    assert (job.name, job.team, job.user, job.priority) == ("llm", "default", "ada", 5)
    assert JobSpec.model_validate(job.spec) == original
    assert job.run_dir == f"/runs/job-{job.id}"
    assert job.created_at == job.updated_at == T0
    assert (job.attempts, job.restarts, job.cancel_requested, job.placement) == (0, 0, False, {})
    assert db.get_job(job.id) == job
    [event] = db.list_events(job.id)
    assert (event.kind, event.job_id) == ("submitted", job.id)


def test_submitting_to_an_unknown_team_stores_nothing_and_names_the_fix(db: Store) -> None:
    db.ensure_team("vision")
    with pytest.raises(NotFound) as info:
        submit(db, team="ghost")
    assert str(info.value) == (
        "unknown team 'ghost'; create it with `tyard teams create ghost` "
        "or use one of: default, vision"
    )
    assert db.list_jobs().total == 0
    assert submit(db).id == 1  # the failed submission did not consume anything visible


def test_a_failure_while_submitting_leaves_nothing_half_written(
    db: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_event(*_args: object, **_kw: object) -> None:
        raise StoreError("disk full")

    monkeypatch.setattr(db, "_event", broken_event)
    with pytest.raises(StoreError, match="disk full"):
        submit(db)
    monkeypatch.undo()
    assert db.list_jobs().total == 0
    job = submit(db)
    assert [e.kind for e in db.list_events(job.id)] == ["submitted"]


def test_get_job_of_an_unknown_id_raises_not_found(db: Store) -> None:
    with pytest.raises(NotFound, match="job 42 does not exist"):
        db.get_job(42)


# -- the state machine -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "to"),
    ALL_PAIRS,
    ids=[
        f"{a.lower()} to {b.lower()} is {'allowed' if b in ALLOWED_TRANSITIONS[a] else 'refused'}"
        for a, b in ALL_PAIRS
    ],
)
def test_transitions_follow_the_state_machine_exactly(
    shared_db: Store, start: JobState, to: JobState
) -> None:
    db = shared_db
    job = drive(db, submit(db).id, PATH_TO[start])
    events_before = db.list_events(job.id)
    if to in ALLOWED_TRANSITIONS[start]:
        moved = db.transition(job.id, to, reason="because")
        assert moved.state is to
        assert db.list_events(job.id)[-1].message == f"{start} -> {to}: because"
    else:
        with pytest.raises(Conflict, match=f"job {job.id} is {start}; it cannot move to {to}"):
            db.transition(job.id, to, reason="because")
        assert db.get_job(job.id) == job
        assert db.list_events(job.id) == events_before


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.sampled_from(list(JobState)), max_size=12))
def test_any_sequence_of_requests_keeps_the_stored_job_equal_to_the_state_machine(
    shared_db: Store, requests: list[JobState]
) -> None:
    job = submit(shared_db)
    state, applied, restarts = S.PENDING, 0, 0
    for to in requests:
        allowed = to in ALLOWED_TRANSITIONS[state]
        try:
            shared_db.transition(job.id, to, reason="r")
        except Conflict:
            assert not allowed
            continue
        assert allowed
        state, applied, restarts = to, applied + 1, restarts + (to is S.RESTARTING)
    stored = shared_db.get_job(job.id)
    assert (stored.state, stored.restarts) == (state, restarts)
    assert (stored.finished_at is not None) == (state in TERMINAL_STATES)
    assert len(shared_db.list_events(job.id)) == 1 + applied


def test_a_transition_from_an_unexpected_state_is_a_conflict_naming_the_current_one(
    db: Store,
) -> None:
    job = drive(db, submit(db).id, [S.ADMITTED])
    with pytest.raises(Conflict, match="job 1 is ADMITTED, not PENDING"):
        db.transition(job.id, S.ADMITTED, reason="again", expected=[S.PENDING])
    moved = db.transition(job.id, S.STARTING, reason="go", expected=[S.ADMITTED, S.RESTARTING])
    assert moved.state is S.STARTING


def test_timestamps_restarts_and_reasons_follow_the_states(db: Store, clock: FakeClock) -> None:
    job_id = submit(db).id
    admitted_at = clock.tick()
    job = db.transition(job_id, S.ADMITTED, reason="fits", placement={"node-0": [0, 1]})
    assert (job.admitted_at, job.placement, job.reason) == (admitted_at, {"node-0": [0, 1]}, "fits")
    clock.tick()
    db.transition(job_id, S.STARTING, reason="launched")
    started_at = clock.tick()
    job = db.transition(job_id, S.RUNNING, reason="workers up")
    assert job.started_at == started_at
    clock.tick()
    job = db.transition(job_id, S.RESTARTING, reason="rank 1 died")
    assert job.restarts == 1
    clock.tick()
    db.transition(job_id, S.STARTING, reason="relaunched")
    clock.tick()
    job = db.transition(job_id, S.RUNNING, reason="workers up")
    assert job.started_at == started_at  # the first start, not the latest
    finished_at = clock.tick()
    job = db.transition(job_id, S.SUCCEEDED, reason="exit 0")
    assert (job.finished_at, job.updated_at, job.reason) == (finished_at, finished_at, "exit 0")
    assert job.placement == {"node-0": [0, 1]}  # kept as a record of where it ran


def test_a_requeued_job_drops_its_placement_and_admission_clears_the_pending_reason(
    db: Store,
) -> None:
    job_id = submit(db).id
    eta = T0 + timedelta(hours=1)
    job = db.update_job(job_id, pending_reason="waiting for 8 GPUs", pending_eta=eta)
    assert (job.pending_reason, job.pending_eta) == ("waiting for 8 GPUs", eta)
    job = db.transition(job_id, S.ADMITTED, reason="fits", placement={"n0": [0]})
    assert (job.pending_reason, job.pending_eta) == ("", None)
    drive(db, job_id, [S.STARTING, S.RUNNING])
    job = db.transition(job_id, S.PENDING, reason="preempted", pending_reason="preempted by 7")
    assert (job.placement, job.pending_reason) == ({}, "preempted by 7")


def test_unknown_fields_are_refused_before_anything_changes(db: Store) -> None:
    job = submit(db)
    with pytest.raises(TypeError, match="cannot set job field"):
        db.transition(job.id, S.ADMITTED, reason="x", state="RUNNING")
    with pytest.raises(TypeError, match="cannot set job field"):
        db.update_job(job.id, restarts=9)
    assert db.get_job(job.id) == job


def test_a_failure_during_a_transition_leaves_the_job_as_it_was(
    db: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = submit(db)

    def broken_event(*_args: object, **_kw: object) -> None:
        raise StoreError("connection lost")

    monkeypatch.setattr(db, "_event", broken_event)
    with pytest.raises(StoreError, match="connection lost"):
        db.transition(job.id, S.ADMITTED, reason="fits", placement={"n": [0]})
    monkeypatch.undo()
    assert db.get_job(job.id) == job
    assert [e.kind for e in db.list_events(job.id)] == ["submitted"]


def test_update_job_sets_heartbeat_and_placement_without_an_event(db: Store) -> None:
    job = submit(db)
    beat = T0 + timedelta(seconds=5)
    updated = db.update_job(job.id, last_heartbeat=beat, placement={"n": [3]})
    assert (updated.last_heartbeat, updated.placement, updated.state) == (
        beat,
        {"n": [3]},
        S.PENDING,
    )
    assert len(db.list_events(job.id)) == 1


# -- cancellation ------------------------------------------------------------------------------


def test_requesting_cancel_marks_the_job_once_and_records_one_event(db: Store) -> None:
    job = drive(db, submit(db).id, [S.ADMITTED, S.STARTING, S.RUNNING])
    first = db.request_cancel(job.id)
    second = db.request_cancel(job.id)
    assert first.cancel_requested and second.cancel_requested
    assert first.state is S.RUNNING
    assert [e.kind for e in db.list_events(job.id)].count("cancel") == 1


@pytest.mark.parametrize("final", sorted(TERMINAL_STATES), ids=lambda s: f"a {s.lower()} job")
def test_cancelling_a_finished_job_is_a_conflict(db: Store, final: JobState) -> None:
    job = drive(db, submit(db).id, PATH_TO[final])
    with pytest.raises(Conflict, match=f"already {final}"):
        db.request_cancel(job.id)
    assert not db.get_job(job.id).cancel_requested


# -- listings ----------------------------------------------------------------------------------


def test_active_jobs_are_oldest_first_and_pending_jobs_by_priority(
    db: Store, clock: FakeClock
) -> None:
    ids = {}
    for name, priority in [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", 1), ("f", 0)]:
        clock.tick()
        ids[name] = submit(db, name, priority=priority).id
    drive(db, ids["c"], [S.ADMITTED, S.STARTING, S.RUNNING])
    drive(db, ids["a"], [S.ADMITTED])
    drive(db, ids["f"], [S.CANCELLED])
    assert [j.name for j in db.active_jobs()] == ["a", "c"]
    assert [j.name for j in db.pending_jobs()] == ["b", "d", "e"]


def test_list_jobs_filters_by_state_team_user_and_name(db: Store) -> None:
    db.ensure_team("vision")
    submit(db, "a", user="ada")
    submit(db, "b", user="bob", team="vision")
    submit(db, "a", user="bob", team="vision")
    drive(db, 3, [S.ADMITTED])

    def names(**kw: object) -> list[tuple[int, str]]:
        return [(j.id, j.name) for j in db.list_jobs(newest_first=False, **kw).items]  # type: ignore[arg-type]

    assert names(team="vision") == [(2, "b"), (3, "a")]
    assert names(user="bob") == [(2, "b"), (3, "a")]
    assert names(name="a") == [(1, "a"), (3, "a")]
    assert names(states=[S.ADMITTED]) == [(3, "a")]
    assert names(states=[S.PENDING], team="vision") == [(2, "b")]
    assert names(states=[]) == []


@pytest.mark.parametrize("newest_first", [True, False], ids=["newest first", "oldest first"])
def test_paging_through_jobs_visits_each_exactly_once(db: Store, newest_first: bool) -> None:
    for i in range(7):
        submit(db, f"j{i}")
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        page = db.list_jobs(limit=3, cursor=cursor, newest_first=newest_first)
        assert page.total == 7
        seen += [j.id for j in page.items]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    expected = list(range(1, 8))
    assert seen == (expected[::-1] if newest_first else expected)
    assert pages == 3


def test_a_page_that_ends_exactly_at_the_last_job_has_no_next_cursor(db: Store) -> None:
    for i in range(3):
        submit(db, f"j{i}")
    assert db.list_jobs(limit=3).next_cursor is None
    assert db.list_jobs(limit=2).next_cursor is not None


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({"cursor": "garbage!"}, "cursor"),
        ({"cursor": "eyJhZnRlciI6IDF9"}, "cursor"),  # valid base64 JSON without "desc"
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
    ],
    ids=[
        "a cursor that is not ours",
        "a cursor missing its ordering",
        "a zero limit",
        "an absurd limit",
    ],
)
def test_bad_listing_arguments_raise_spec_errors_naming_the_field(
    db: Store, kwargs: dict[str, object], path: str
) -> None:
    with pytest.raises(SpecError) as info:
        db.list_jobs(**kwargs)  # type: ignore[arg-type]
    assert [i.path for i in info.value.issues] == [path]


def test_a_cursor_from_one_ordering_is_refused_by_the_other(db: Store) -> None:
    for i in range(3):
        submit(db, f"j{i}")
    cursor = db.list_jobs(limit=1, newest_first=True).next_cursor
    with pytest.raises(SpecError, match="same ordering"):
        db.list_jobs(limit=1, cursor=cursor, newest_first=False)


def test_a_long_transaction_stamps_its_jobs_at_commit_so_readers_looking_back_see_them(
    migrated_sqlite_url: str, tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta

    from tensoryard.spec.job import JobSpec

    t = [datetime(2026, 1, 1, tzinfo=UTC)]

    def clock() -> datetime:
        t[0] += timedelta(seconds=0.01)
        return t[0]

    store = Store.open(migrated_sqlite_url, clock=clock)
    store.ensure_team("default")
    specs = [JobSpec(name=f"j{i}", launcher="python", command=["x.py"]) for i in range(300)]
    # Each insert advances the clock: the batch "takes" several seconds.
    created = store.create_jobs(specs, run_dir_root=tmp_path)
    stamps = {j.changed_at for j in store.jobs_changed_since(None)[0]}
    assert len(stamps) == 1
    assert min(stamps) > created[0].changed_at  # stamped at commit, after the inserts
    seen, _ = store.jobs_changed_since(t[0] - timedelta(seconds=1))
    assert len(seen) == 300
    store.close()


def test_pending_info_is_written_in_bulk_only_for_pending_jobs_with_an_event_per_new_reason(
    store: Store, tmp_path: Path
) -> None:
    from tensoryard.spec.job import JobSpec
    from tensoryard.spec.states import JobState

    store.ensure_team("default")
    specs = [JobSpec(name=f"j{i}", launcher="python", command=["x.py"]) for i in range(3)]
    a, b, c = store.create_jobs(specs, run_dir_root=tmp_path)
    store.transition(c.id, JobState.ADMITTED, reason="test", placement={})
    items = [(a.id, "waiting for 2 CPUs", None), (b.id, "", None), (c.id, "stale", None)]
    written, stamp = store.set_pending_info(items)
    assert sorted(written) == [a.id, b.id]  # c is no longer PENDING
    assert store.get_job(a.id).pending_reason == "waiting for 2 CPUs"
    assert store.get_job(a.id).changed_at == stamp
    assert store.get_job(c.id).pending_reason == ""
    kinds = [e.kind for e in store.list_events(a.id)]
    assert kinds.count("pending") == 1
    assert [e.kind for e in store.list_events(b.id)].count("pending") == 0  # reason unchanged
    store.set_pending_info([(a.id, "waiting for 2 CPUs", None)])  # same reason: no new event
    assert [e.kind for e in store.list_events(a.id)].count("pending") == 1
    store.set_pending_info([(a.id, "waiting for 4 CPUs", None)])  # counts alone: no event
    assert store.get_job(a.id).pending_reason == "waiting for 4 CPUs"
    assert [e.kind for e in store.list_events(a.id)].count("pending") == 1
    store.set_pending_info([(a.id, "waiting for quota", None)])  # says something new
    assert [e.kind for e in store.list_events(a.id)].count("pending") == 2
