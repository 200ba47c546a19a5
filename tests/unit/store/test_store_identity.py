"""Users, team roles, API tokens and the audit log in the store (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from tensoryard.errors import Conflict, NotFound, SpecError, StoreError, Unauthenticated
from tensoryard.spec.job import JobSpec
from tensoryard.store import AuditContext, Store, _inputs
from tensoryard.store._db import alembic_config

ALICE = AuditContext(actor="alice", source_ip="10.0.0.7")


def spec(team: str = "nlp", **changes: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "j", "team": team, "command": ["t.py"], "launcher": "python", **changes}
    )


def test_a_user_is_created_once_and_carries_their_team_roles(store: Store) -> None:
    store.ensure_team("nlp")
    store.create_user("bob", description="ML")
    with pytest.raises(Conflict, match="exists already"):
        store.create_user("bob")
    store.set_member("nlp", "bob", "viewer")
    store.set_member("nlp", "bob", "team-admin")  # a second call changes the role
    bob = store.get_user("bob")
    assert bob.teams == {"nlp": "team-admin"} and not bob.platform_admin
    assert [(m.user, m.role) for m in store.list_members("nlp")] == [("bob", "team-admin")]
    assert [u.name for u in store.list_users()] == ["bob"]
    store.remove_member("nlp", "bob")
    assert store.get_user("bob").teams == {}
    with pytest.raises(NotFound):
        store.remove_member("nlp", "bob")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.create_user("no spaces"), "name"),
        (lambda s: s.set_member("nlp", "bob", "owner"), "role"),
        (lambda s: s.create_token("bob", scopes=["root"]), "scopes"),
        (lambda s: s.create_token("bob", scopes=[]), "scopes"),
        (
            lambda s: s.create_token("bob", expires_at=datetime(2000, 1, 1, tzinfo=UTC)),
            "expires",
        ),
    ],
    ids=[
        "a user name with a space",
        "an unknown role",
        "an unknown scope",
        "no scope at all",
        "an expiry in the past",
    ],
)
def test_bad_identity_input_is_a_spec_error_naming_the_field(
    store: Store, call: object, field: str
) -> None:
    store.ensure_team("nlp")
    store.create_user("bob")
    with pytest.raises(SpecError) as err:
        call(store)  # type: ignore[operator]
    assert [i.path for i in err.value.issues] == [field]


def test_membership_needs_an_existing_team_and_user(store: Store) -> None:
    store.ensure_team("nlp")
    with pytest.raises(NotFound, match="tyard users create ghost"):
        store.set_member("nlp", "ghost", "member")
    store.create_user("bob")
    with pytest.raises(NotFound, match="team 'vision'"):
        store.set_member("vision", "bob", "member")


def test_a_token_authenticates_its_user_and_only_its_hash_is_stored(store: Store) -> None:
    store.create_user("bob")
    issued = store.create_token("bob", name="laptop", scopes=["read"])
    assert issued.token.startswith(f"tyd_{issued.record.id}_")
    user, token = store.authenticate(issued.token)
    assert (user.name, token.scopes, token.name) == ("bob", ("read",), "laptop")
    with store.engine.connect() as conn:
        dump = " ".join(str(r) for r in conn.exec_driver_sql("SELECT * FROM api_tokens"))
    secret = issued.token.split("_", 2)[2]
    assert secret not in dump and issued.token not in dump


@pytest.mark.parametrize(
    "token",
    ["", "garbage", "tyd_0123456789ab_" + "x" * 43, "tyd_zzzz_abc"],
    ids=["an empty token", "garbage", "an unknown id", "a malformed id"],
)
def test_tokens_that_do_not_exist_are_refused(store: Store, token: str) -> None:
    with pytest.raises(Unauthenticated, match="invalid token"):
        store.authenticate(token)


def test_a_token_with_a_right_id_but_wrong_secret_is_refused(store: Store) -> None:
    store.create_user("bob")
    issued = store.create_token("bob")
    forged = f"tyd_{issued.record.id}_" + "A" * 43
    with pytest.raises(Unauthenticated, match="invalid token"):
        store.authenticate(forged)


def test_a_revoked_token_stops_working_at_once(store: Store) -> None:
    store.create_user("bob")
    issued = store.create_token("bob")
    store.revoke_token(issued.record.id, audit=ALICE)
    with pytest.raises(Unauthenticated, match="revoked"):
        store.authenticate(issued.token)
    again = store.revoke_token(issued.record.id)  # idempotent
    assert again.revoked_at is not None
    with pytest.raises(NotFound):
        store.revoke_token("0123456789ab")


def test_an_expired_token_is_refused_and_last_use_is_recorded(store: Store) -> None:
    store.create_user("bob")
    now = datetime.now(UTC)
    issued = store.create_token("bob", expires_at=now + timedelta(hours=1))
    store.authenticate(issued.token)
    assert store.get_token(issued.record.id).last_used_at is not None
    later = Store(store.engine, store.url, clock=lambda: now + timedelta(hours=2))
    with pytest.raises(Unauthenticated, match="expired"):
        later.authenticate(issued.token)


def test_tokens_are_listed_per_user_without_secrets(store: Store) -> None:
    store.create_user("bob")
    store.create_user("eve")
    a = store.create_token("bob").record
    b = store.create_token("eve").record
    assert [t.id for t in store.list_tokens("bob")] == [a.id]
    assert {t.id for t in store.list_tokens()} == {a.id, b.id}
    assert not hasattr(a, "token")


def test_changes_with_an_audit_context_write_one_audit_line_in_their_transaction(
    store: Store, tmp_path: Path
) -> None:
    store.ensure_team("nlp", audit=ALICE)
    job = store.create_job(spec(), run_dir_root=tmp_path, audit=ALICE)
    store.request_cancel(job.id, audit=ALICE)
    store.update_team("nlp", gpu_quota=4, audit=ALICE)
    with pytest.raises(NotFound):  # nothing stored, so nothing audited
        store.create_job(spec(team="ghost"), run_dir_root=tmp_path, audit=ALICE)
    rows = store.list_audit()
    assert [(r.action, r.object) for r in rows] == [
        ("team.create", "team/nlp"),
        ("job.submit", f"job/{job.id}"),
        ("job.cancel", f"job/{job.id}"),
        ("team.update", "team/nlp"),
    ]
    assert {(r.actor, r.source_ip, r.outcome) for r in rows} == {("alice", "10.0.0.7", "ok")}


def test_the_audit_log_filters_by_actor_action_prefix_object_outcome_and_time(
    store: Store,
) -> None:
    bob = AuditContext("bob", "1.2.3.4")
    store.record_audit(ALICE, "job.submit", "job/1")
    store.record_audit(bob, "job.cancel", "job/1", outcome="denied", detail="not a member")
    store.record_audit(bob, "team.create", "team/nlp")
    assert [r.action for r in store.list_audit(actor="bob")] == ["job.cancel", "team.create"]
    assert [r.actor for r in store.list_audit(action="job.")] == ["alice", "bob"]
    assert [r.action for r in store.list_audit(obj="team/")] == ["team.create"]
    assert [r.detail for r in store.list_audit(outcome="denied")] == ["not a member"]
    future = datetime.now(UTC) + timedelta(days=1)
    assert store.list_audit(since=future) == []
    assert len(store.list_audit(until=future)) == 3
    first = store.list_audit(limit=1)
    assert [r.action for r in store.list_audit(after_id=first[0].id)] == [
        "job.cancel",
        "team.create",
    ]
    assert [r.id for r in store.iter_audit(page=1)] == [r.id for r in store.list_audit()]
    with pytest.raises(SpecError):
        store.list_audit(limit=0)


@pytest.mark.parametrize(
    "statement",
    ["UPDATE audit_log SET actor = 'mallory'", "DELETE FROM audit_log"],
    ids=["an update", "a delete"],
)
def test_the_audit_log_is_append_only_even_for_raw_sql(store: Store, statement: str) -> None:
    store.record_audit(ALICE, "user.create", "user/bob")
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), store.engine.begin() as conn:
        conn.exec_driver_sql(statement)
    assert [r.actor for r in store.list_audit()] == ["alice"]


def test_a_job_token_is_bound_to_the_next_attempt(store: Store, tmp_path: Path) -> None:
    store.ensure_team("nlp")
    job = store.create_job(spec(), run_dir_root=tmp_path)
    token = store.issue_job_token(job.id)
    grant = store.job_token_grant(job.id, token)
    assert grant is not None and grant.attempt == 1
    store.start_attempt(job.id, handle={})
    second = store.issue_job_token(job.id)
    assert store.job_token_grant(job.id, token) is None  # replaced
    grant = store.job_token_grant(job.id, second)
    assert grant is not None and grant.attempt == 2
    assert store.check_job_token(job.id, second)


def test_job_listing_can_be_limited_to_the_teams_a_caller_may_see(
    store: Store, tmp_path: Path
) -> None:
    for team in ("nlp", "vision"):
        store.ensure_team(team)
        store.create_job(spec(team=team), run_dir_root=tmp_path)
    assert [j.team for j in store.list_jobs(teams=["nlp"]).items] == ["nlp"]
    assert store.list_jobs(teams=[]).total == 0
    assert store.list_jobs(teams=None).total == 2


def test_store_errors_stay_in_the_tree(store: Store) -> None:
    with pytest.raises(StoreError):
        store.get_token("0123456789ab")


def test_upgrading_from_0001_keeps_jobs_and_their_tokens_working(
    store: Store, tmp_path: Path
) -> None:
    store.ensure_team("nlp")
    job = store.create_job(spec(), run_dir_root=tmp_path)
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0001")
    token = "a-token-of-version-0.1"
    with store.engine.begin() as conn:  # as 0.1 stored it: no attempt column
        conn.exec_driver_sql(
            "INSERT INTO job_tokens (job_id, token_hash, created_at) VALUES "
            f"({job.id}, '{_inputs.token_hash(token)}', CURRENT_TIMESTAMP)"
        )
    reopened = Store.open(store.url)
    try:
        grant = reopened.job_token_grant(job.id, token)
        assert grant is not None and grant.attempt is None  # any attempt, as before
        assert reopened.get_job(job.id).name == "j"
        reopened.create_user("bob")  # the new tables exist
    finally:
        reopened.close()
