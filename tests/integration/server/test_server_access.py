"""Identity and access through the REST API (SQLite): no route without a token, every role x
action on its own and on another team's objects, scopes, job tokens, redaction, audit."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from httpx import Response

from tensoryard.server.app import PUBLIC_PATHS
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState

GOOD = {"name": "tiny", "command": ["train.py"], "launcher": "python"}


@dataclass
class World:
    """Teams nlp (ours) and vision (theirs), one job in each, a user per role in nlp."""

    plane: ControlPlane
    client: TestClient
    tokens: dict[str, str]  # role -> token
    jobs: dict[str, int]  # team -> job id

    def as_(self, role: str) -> TestClient:
        self.client.headers["Authorization"] = f"Bearer {self.tokens[role]}"
        return self.client


@pytest.fixture
def world(tmp_path: Path, migrated_sqlite_url: str) -> Iterator[World]:
    config = ServerConfig(home=tmp_path / "home", db_url=migrated_sqlite_url, cpu_slots=2)
    plane = build_control_plane(config)
    store = plane.store
    tokens = {"platform-admin": plane.admin_token}
    for team in ("nlp", "vision"):
        store.ensure_team(team)
    for role, user in (("viewer", "vera"), ("member", "mo"), ("team-admin", "tad")):
        store.create_user(user)
        store.set_member("nlp", user, role)
        tokens[role] = store.create_token(user).token
    store.create_user("vic")
    store.set_member("vision", "vic", "member")
    store.create_user("outsider")
    tokens["outsider"] = store.create_token("outsider").token
    jobs = {}
    for team in ("nlp", "vision"):
        spec = JobSpec.model_validate(
            {**GOOD, "team": team, "user": "someone", "restart": {"in_place": 1}}
        )
        jobs[team] = store.create_job(spec, run_dir_root=tmp_path / "runs").id
    with TestClient(plane.app()) as client:
        yield World(plane, client, tokens, jobs)
    store.close()


# ---- no route is unguarded -------------------------------------------------------------------


def _filled(path: str) -> str:
    values = {
        "job_id": "1",
        "pipeline_id": "1",
        "team": "nlp",
        "user": "mo",
        "token_id": "0123456789ab",
        "name": "nlp",
        "ref": "1",
        "alias": "production",
        "version": "1",
        "row_id": "1",  # a webhook delivery
    }
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)


def test_every_route_but_the_public_ones_requires_a_token(world: World) -> None:
    app = world.client.app
    doc = app.openapi()  # type: ignore[attr-defined]
    operations = [
        (path, method)
        for path, item in doc["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]
    assert len(operations) >= 20
    # Nothing hides from the document: every API route is in it, or public on purpose.
    routes = {r.path for r in app.routes if isinstance(r, APIRoute)}  # type: ignore[attr-defined]
    assert routes <= set(doc["paths"]) | PUBLIC_PATHS
    guarded = []
    for path, method in operations:
        op = doc["paths"][path][method]
        if path in PUBLIC_PATHS:
            assert "security" not in op, f"{method.upper()} {path} is public"
            continue
        assert op.get("security") == [{"HTTPBearer": []}], f"{method.upper()} {path}"
        for header in ({}, {"Authorization": "Bearer tyd_0123456789ab_" + "x" * 43}):
            answer = world.client.request(method.upper(), _filled(path), headers=header, json={})
            assert answer.status_code == 401, (method, path, answer.text)
            assert answer.headers["WWW-Authenticate"] == "Bearer"
        guarded.append(path)
    assert "/healthz" in PUBLIC_PATHS and "/healthz" not in guarded
    assert world.client.get("/healthz", headers={"Authorization": ""}).status_code == 200


# ---- role x action ---------------------------------------------------------------------------

Act = Callable[[TestClient, World, str], Response]


def _job(w: World, team: str) -> int:
    return w.jobs[team]


ACTIONS: dict[str, tuple[Act, str]] = {
    # name: (call, least role in the object's team; "platform" = platform admins only)
    "see a job": (lambda c, w, t: c.get(f"/api/v1/jobs/{_job(w, t)}"), "viewer"),
    "read a job's events": (lambda c, w, t: c.get(f"/api/v1/jobs/{_job(w, t)}/events"), "viewer"),
    "read a job's logs": (lambda c, w, t: c.get(f"/api/v1/jobs/{_job(w, t)}/logs"), "viewer"),
    "list a team's jobs": (lambda c, w, t: c.get("/api/v1/jobs", params={"team": t}), "viewer"),
    "list a team's members": (lambda c, w, t: c.get(f"/api/v1/teams/{t}/members"), "viewer"),
    "submit a job": (
        lambda c, w, t: c.post("/api/v1/jobs", json={"spec": {**GOOD, "team": t}}),
        "member",
    ),
    "cancel a job": (lambda c, w, t: c.post(f"/api/v1/jobs/{_job(w, t)}/cancel"), "member"),
    "add a member": (
        lambda c, w, t: c.put(f"/api/v1/teams/{t}/members/outsider", json={"role": "viewer"}),
        "team-admin",
    ),
    "remove a member": (
        lambda c, w, t: c.delete(f"/api/v1/teams/{t}/members/{'vera' if t == 'nlp' else 'vic'}"),
        "team-admin",
    ),
    "change a team's quota": (
        lambda c, w, t: c.patch(f"/api/v1/teams/{t}", json={"gpu_quota": 8}),
        "platform",
    ),
    "create a team": (lambda c, w, t: c.post("/api/v1/teams", json={"name": "new"}), "platform"),
    "create a user": (lambda c, w, t: c.post("/api/v1/users", json={"name": "neo"}), "platform"),
    "list users": (lambda c, w, t: c.get("/api/v1/users"), "platform"),
    "scrape the platform metrics": (lambda c, w, t: c.get("/metrics"), "platform"),
    "list a team's secret names": (lambda c, w, t: c.get(f"/api/v1/teams/{t}/secrets"), "member"),
    "set a team's secret": (
        lambda c, w, t: c.put(f"/api/v1/teams/{t}/secrets/hf-token", json={"value": "s3cret"}),
        "team-admin",
    ),
    "read the audit log": (lambda c, w, t: c.get("/api/v1/audit"), "platform"),
    "export the audit log": (lambda c, w, t: c.get("/api/v1/audit/export"), "platform"),
    "list everyone's tokens": (
        lambda c, w, t: c.get("/api/v1/tokens", params={"all": True}),
        "platform",
    ),
}
ROLES = ["outsider", "viewer", "member", "team-admin", "platform-admin"]
RANK = {"outsider": 0, "viewer": 1, "member": 2, "team-admin": 3, "platform": 4}


def _allowed(role: str, least: str, own_team: bool) -> bool:
    if role == "platform-admin":
        return True
    return own_team and RANK[role] >= RANK[least] and least != "platform"


CASES = [
    (role, action, own)
    for role in ROLES
    for action in ACTIONS
    for own in (True, False)
    if role != "outsider" or not own  # an outsider has no own team
]


def _case_id(case: tuple[str, str, bool]) -> str:
    role, action, own = case
    verdict = "may" if _allowed(role, ACTIONS[action][1], own) else "may not"
    where = "of their own team" if own else "of another team"
    article = "an" if role[0] in "aeiou" else "a"
    return f"{article} {role} {verdict} {action} {where}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_each_role_may_do_exactly_what_its_rank_allows(
    world: World, case: tuple[str, str, bool]
) -> None:
    role, action, own = case
    call, least = ACTIONS[action]
    team = "nlp" if own else "vision"
    answer = call(world.as_(role), world, team)
    if _allowed(role, least, own):
        assert answer.status_code < 400, answer.text
        return
    assert answer.status_code == 403, answer.text
    message = answer.json()["message"]
    assert "platform admin" in message or "tyard teams members add" in message
    denied = world.plane.store.list_audit(outcome="denied")
    assert denied and denied[-1].detail == message


def test_a_listing_shows_only_the_teams_the_caller_belongs_to(world: World) -> None:
    assert [j["team"] for j in world.as_("viewer").get("/api/v1/jobs").json()["items"]] == ["nlp"]
    assert world.as_("outsider").get("/api/v1/jobs").json()["total"] == 0
    assert world.as_("platform-admin").get("/api/v1/jobs").json()["total"] == 2


def test_a_submitted_job_belongs_to_the_caller_whatever_the_spec_says(world: World) -> None:
    answer = world.as_("member").post(
        "/api/v1/jobs", json={"spec": {**GOOD, "team": "nlp", "user": "the-boss"}}
    )
    assert answer.status_code == 201
    assert answer.json()["user"] == "mo"
    assert world.plane.store.list_audit(action="job.submit")[-1].actor == "mo"


def test_unknown_teams_and_bad_specs_are_still_422_for_members(world: World) -> None:
    answer = world.as_("member").post("/api/v1/jobs", json={"spec": {**GOOD, "team": "ghost"}})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["path"] == "team"


# ---- tokens and scopes -----------------------------------------------------------------------


def test_a_read_only_token_can_read_but_not_submit_nor_mint_a_stronger_token(
    world: World,
) -> None:
    made = world.as_("member").post("/api/v1/tokens", json={"name": "ro", "scopes": ["read"]})
    assert made.status_code == 201
    body = made.json()
    assert body["scopes"] == ["read"] and body["token"].startswith(f"tyd_{body['id']}_")
    world.tokens["ro"] = body["token"]
    ro = world.as_("ro")
    assert ro.get(f"/api/v1/jobs/{world.jobs['nlp']}").status_code == 200
    refused = ro.post("/api/v1/jobs", json={"spec": {**GOOD, "team": "nlp"}})
    assert refused.status_code == 403
    assert "lacks the 'write' scope" in refused.json()["message"]
    stronger = ro.post("/api/v1/tokens", json={"scopes": ["read", "write"]})
    assert stronger.status_code == 403


def test_a_revoked_token_is_refused_at_once_and_others_cannot_revoke_it(world: World) -> None:
    made = world.as_("member").post("/api/v1/tokens", json={"name": "tmp"}).json()
    world.tokens["tmp"] = made["token"]
    assert world.as_("viewer").delete(f"/api/v1/tokens/{made['id']}").status_code == 403
    assert world.as_("tmp").get("/api/v1/users/me").json()["name"] == "mo"
    assert world.as_("member").delete(f"/api/v1/tokens/{made['id']}").status_code == 200
    refused = world.as_("tmp").get("/api/v1/users/me")
    assert refused.status_code == 401 and "revoked" in refused.json()["message"]
    listed = world.as_("member").get("/api/v1/tokens").json()
    assert {t["id"]: bool(t["revoked_at"]) for t in listed}[made["id"]]
    assert all("token" not in t for t in listed)


def test_a_platform_admin_creates_a_user_whose_first_token_works(world: World) -> None:
    made = world.as_("platform-admin").post("/api/v1/users", json={"name": "neo"})
    assert made.status_code == 201
    world.tokens["neo"] = made.json()["token"]
    assert world.as_("neo").get("/api/v1/users/me").json() == {
        **made.json()["user"],
        "teams": {},
    }
    added = world.as_("team-admin").put("/api/v1/teams/nlp/members/neo", json={"role": "member"})
    assert added.status_code == 200
    assert world.as_("neo").get("/api/v1/users/me").json()["teams"] == {"nlp": "member"}


# ---- job tokens ------------------------------------------------------------------------------


def _report(world: World, job: int, token: str, **body: Any) -> Response:
    return world.client.post(
        f"/api/v1/jobs/{job}/report",
        json={"attempt": 1, **body},
        headers={"Authorization": f"Bearer {token}"},
    )


def test_a_job_token_reports_only_for_its_own_attempt(world: World) -> None:
    job = world.jobs["nlp"]
    token = world.plane.store.issue_job_token(job)  # for attempt 1
    world.plane.store.start_attempt(job, handle={})
    world.plane.store.start_attempt(job, handle={})
    assert _report(world, job, token).status_code == 200
    other = _report(world, job, token, attempt=2)
    assert other.status_code == 403
    assert "issued for attempt 1" in other.json()["message"]
    assert _report(world, world.jobs["vision"], token).status_code == 401


def _running(world: World, team: str = "nlp") -> tuple[int, str]:
    """The team's job with attempt 1 running and its token issued for it."""
    store, job = world.plane.store, world.jobs[team]
    store.transition(job, JobState.ADMITTED, reason="admitted")
    handle = {"executor": "local", "key": "k"}
    store.begin_attempt(
        job, expected=JobState.ADMITTED, number=1, attempt_key="k", handle=handle, reason="go"
    )
    store.mark_launched(job, 1, handle)
    token = store.issue_job_token(job, attempt=1)
    store.mark_running(job, 1, "running")
    return job, token


def test_workers_restarted_in_place_report_as_the_next_attempt_with_the_launchs_token(
    world: World,
) -> None:
    job, token = _running(world)
    store, registry = world.plane.store, world.plane.registry
    labels = {"team": "nlp", "reason": "in-place"}
    before = registry.get_sample_value("tyard_restarts_total", labels) or 0.0
    restarted = {"attempt": 2, "launch_attempt": 1, "resumed_from_step": 40}
    first = _report(world, job, token, **restarted, metrics=[{"step": 41, "ts": 1.0}])
    assert first.status_code == 200, first.text
    assert _report(world, job, token, **restarted).status_code == 200  # rank 1: same restart
    attempts = store.list_attempts(job)
    assert [(a.number, a.state, a.launch_attempt) for a in attempts] == [
        (1, "failed", None),
        (2, "running", 1),
    ]
    assert attempts[1].resumed_from_step == 40
    assert [m.step for m in store.list_metrics(job, attempt=2)] == [41]
    assert (store.get_job(job).restarts, store.get_job(job).attempts) == (1, 2)
    assert registry.get_sample_value("tyard_restarts_total", labels) == before + 1
    listed = world.as_("member").get(f"/api/v1/jobs/{job}/attempts").json()
    assert [a["launch_attempt"] for a in listed] == [None, 1]
    # The old group's last words arrive late: its attempt is over, the token moved on.
    stale = _report(world, job, token, attempt=1)
    assert stale.status_code == 403 and "issued for attempt 2" in stale.json()["message"]


def test_an_in_place_report_for_a_launch_that_ended_is_refused_and_changes_nothing(
    world: World,
) -> None:
    job, token = _running(world)
    store = world.plane.store
    store.finish_attempt(
        job, 1, state="failed", reason="x", job_to=JobState.RESTARTING, job_reason="x"
    )
    late = _report(world, job, token, attempt=2, launch_attempt=1)
    assert late.status_code == 403 and "stale" in late.json()["message"]
    assert [a.number for a in store.list_attempts(job)] == [1]
    # and a launch number that is not the token's is no way around the attempt binding
    other = _report(world, job, token, attempt=3, launch_attempt=2)
    assert other.status_code == 403 and "issued for attempt 1" in other.json()["message"]


@pytest.mark.parametrize("attempt", [3, 2**31 - 1], ids=["one too many", "the largest attempt"])
def test_a_job_token_cannot_claim_more_in_place_restarts_than_its_spec_grants(
    world: World, attempt: int
) -> None:
    # Each in-place restart is an attempt row: the number a report claims is bounded by the
    # spec (restart.in_place: 1 here), or one report could write billions of rows.
    job, token = _running(world)
    refused = _report(world, job, token, attempt=attempt, launch_attempt=1)
    assert refused.status_code == 403
    assert "grants at most 1 (restart.in_place)" in refused.json()["message"]
    assert [a.number for a in world.plane.store.list_attempts(job)] == [1]
    assert world.plane.store.list_audit(outcome="denied")[-1].actor == f"job/{job}/attempt/1"


@pytest.mark.parametrize("kind", ["state", "cancel", "submitted", "preempt", "x" * 32])
def test_a_job_token_may_not_post_control_plane_event_kinds(world: World, kind: str) -> None:
    job = world.jobs["nlp"]
    token = world.plane.store.issue_job_token(job)
    world.plane.store.start_attempt(job, handle={})
    answer = _report(world, job, token, events=[{"kind": kind, "message": "SUCCEEDED"}])
    assert answer.status_code == 403
    assert "may not post events of kind" in answer.json()["message"]
    assert [e.kind for e in world.plane.store.list_events(job)] == ["submitted"]


@pytest.mark.parametrize("kind", ["runtime", "log", "progress", "warning", "error", "checkpoint"])
def test_a_job_token_may_post_runtime_event_kinds(world: World, kind: str) -> None:
    job = world.jobs["nlp"]
    token = world.plane.store.issue_job_token(job)
    world.plane.store.start_attempt(job, handle={})
    answer = _report(world, job, token, events=[{"kind": kind, "message": "hello"}])
    assert answer.status_code == 200
    assert world.plane.store.list_events(job)[-1].kind == kind


def test_a_job_token_is_no_credential_for_anything_but_its_report(world: World) -> None:
    job = world.jobs["nlp"]
    token = world.plane.store.issue_job_token(job)
    hdr = {"Authorization": f"Bearer {token}"}
    for path in (f"/api/v1/jobs/{job}", "/api/v1/jobs", "/api/v1/users/me"):
        assert world.client.get(path, headers=hdr).status_code == 401
    assert world.client.post(f"/api/v1/jobs/{job}/cancel", headers=hdr).status_code == 401


def test_only_platform_admins_report_without_a_job_token(world: World) -> None:
    job = world.jobs["nlp"]
    world.plane.store.start_attempt(job, handle={})
    assert _report(world, job, world.tokens["member"]).status_code == 403
    assert _report(world, job, world.tokens["platform-admin"]).status_code == 200


# ---- secrets and logs ------------------------------------------------------------------------


def test_env_values_never_leave_the_server_but_reach_the_store(world: World) -> None:
    spec = {**GOOD, "team": "nlp", "env": {"WANDB_API_KEY": "hunter2", "OMP_NUM_THREADS": "1"}}
    job = world.as_("member").post("/api/v1/jobs", json={"spec": spec}).json()
    assert job["spec"]["env"] == {"WANDB_API_KEY": "***", "OMP_NUM_THREADS": "***"}
    for role in ("viewer", "member", "platform-admin"):
        c = world.as_(role)
        for path in (f"/api/v1/jobs/{job['id']}", "/api/v1/jobs", "/api/v1/audit"):
            assert "hunter2" not in c.get(path).text
    stored = world.plane.store.get_job(job["id"]).spec["env"]
    assert stored["WANDB_API_KEY"] == "hunter2"
    log = world.plane.config.home / "server.log"
    assert not log.exists() or "hunter2" not in log.read_text()


def test_logs_of_an_attempt_that_never_launched_answer_409_not_500(world: World) -> None:
    job = world.jobs["nlp"]
    store = world.plane.store
    store.start_attempt(job, handle={})
    store.update_attempt(
        job, 1, state="failed", reason="launch failed: no such file", finished=True
    )
    answer = world.as_("viewer").get(f"/api/v1/jobs/{job}/logs")
    assert answer.status_code == 409
    assert "it was never launched: launch failed: no such file" in answer.json()["message"]
    assert world.as_("viewer").get(f"/api/v1/jobs/{job}/logs?attempt=7").status_code == 404
    assert world.as_("viewer").get(f"/api/v1/jobs/{job}/logs?attempt=0").status_code == 422


def test_logs_are_never_served_from_outside_the_job_run_dir(world: World, tmp_path: Path) -> None:
    job = world.jobs["nlp"]
    handle = {"run_dir": "/etc", "attempt": 1, "world_size": 1}

    class Outside:
        def log_paths(self, _handle: dict[str, Any]) -> dict[int, Path]:
            return {0: Path("/etc/passwd")}

    from tensoryard.server.routes_logs import log_path as _log_path

    record = world.plane.store.start_attempt(job, handle=handle)
    with pytest.raises(Exception, match="no log in its run dir"):
        _log_path(Outside(), world.plane.store.get_job(job), record, 0)  # type: ignore[arg-type]


# ---- audit -----------------------------------------------------------------------------------


def test_every_change_is_audited_with_actor_source_and_outcome_and_exports_as_json_lines(
    world: World,
) -> None:
    member = world.as_("member")
    job = member.post("/api/v1/jobs", json={"spec": {**GOOD, "team": "nlp"}}).json()
    member.post(f"/api/v1/jobs/{job['id']}/cancel")
    world.as_("viewer").post(f"/api/v1/jobs/{job['id']}/cancel")  # refused
    admin = world.as_("platform-admin")
    lines = admin.get("/api/v1/audit/export", params={"object": f"job/{job['id']}"})
    assert lines.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in lines.text.splitlines()]
    assert [(r["actor"], r["action"], r["outcome"]) for r in rows] == [
        ("mo", "job.submit", "ok"),
        ("mo", "job.cancel", "ok"),
        ("vera", "job.cancel", "denied"),
    ]
    assert all(r["source_ip"] == "testclient" and r["ts"] for r in rows)
    page = admin.get("/api/v1/audit", params={"actor": "vera", "outcome": "denied"}).json()
    assert [r["action"] for r in page] == ["job.cancel"]
