"""The console's API through the real app (SQLite): sign-in for a session cookie, CSRF on
actions, audit lines like the API's, another team refused, the queue in start order with
paging and visibility, the cluster's quotas, GPU-hours, resubmit, and the pages' files."""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from tensoryard.console import STATIC
from tensoryard.console.routes import cluster_view
from tensoryard.runtime.rank_stats import RankStats
from tensoryard.runtime.stragglers import StragglerDetector
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.server.scheduling import NodeCapacity
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store.models import Attempt

GOOD = {"name": "tiny", "command": ["train.py"], "launcher": "python", "env": {"KEY": "secret"}}


@dataclass
class World:
    plane: ControlPlane
    client: TestClient
    tokens: dict[str, str]  # user -> API token
    jobs: dict[str, int]  # team -> job id

    def sign_in(self, user: str) -> str:
        """Sign in as `user` with the cookie only (no bearer header); returns the CSRF token."""
        self.client.cookies.clear()
        answer = self.client.post(
            "/api/v1/console/session", headers={"Authorization": f"Bearer {self.tokens[user]}"}
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["csrf"])


@pytest.fixture
def world(tmp_path: Path, migrated_sqlite_url: str) -> Iterator[World]:
    config = ServerConfig(home=tmp_path / "home", db_url=migrated_sqlite_url, cpu_slots=2)
    plane = build_control_plane(config)
    store = plane.store
    tokens = {"admin": plane.admin_token}
    for team in ("nlp", "vision"):
        store.ensure_team(team, gpu_quota=4)
    for user, team in (("mo", "nlp"), ("vic", "vision")):
        store.create_user(user)
        store.set_member(team, user, "member")
        tokens[user] = store.create_token(user).token
    jobs = {}
    for team in ("nlp", "vision"):
        spec = JobSpec.model_validate({**GOOD, "team": team, "user": "someone"})
        jobs[team] = store.create_job(spec, run_dir_root=tmp_path / "runs").id
    with TestClient(plane.app()) as client:
        yield World(plane, client, tokens, jobs)
    store.close()


def test_sign_in_sets_an_httponly_strict_cookie_that_is_a_new_expiring_token(
    world: World,
) -> None:
    answer = world.client.post(
        "/api/v1/console/session", headers={"Authorization": f"Bearer {world.tokens['mo']}"}
    )
    assert answer.status_code == 201
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    value = re.match(r"tyard_session=([^;]+)", cookie)
    assert value is not None and value.group(1) != world.tokens["mo"]
    body = answer.json()
    record = world.plane.store.get_token(body["token_id"])
    assert record.expires_at is not None
    assert timedelta(hours=11) < record.expires_at - world.plane.store.now() <= timedelta(hours=12)
    me = world.client.get("/api/v1/console/session").json()  # the cookie alone
    assert me["user"] == "mo" and me["teams"] == {"nlp": "member"} and me["csrf"] == body["csrf"]


def test_a_session_never_outlives_the_token_that_opened_it(world: World) -> None:
    store = world.plane.store
    short = store.create_token("mo", expires_at=store.now() + timedelta(hours=1))
    answer = world.client.post(
        "/api/v1/console/session", headers={"Authorization": f"Bearer {short.token}"}
    )
    assert answer.status_code == 201, answer.text
    record = store.get_token(answer.json()["token_id"])
    assert record.expires_at is not None and short.record.expires_at is not None
    assert record.expires_at <= short.record.expires_at  # not 12 hours from now
    assert "Max-Age=3" in answer.headers["set-cookie"]  # about 3600 s, not 43200


def test_a_bad_token_cannot_sign_in(world: World) -> None:
    answer = world.client.post(
        "/api/v1/console/session", headers={"Authorization": "Bearer tyd_000000000000_nope"}
    )
    assert answer.status_code == 401 and "set-cookie" not in answer.headers
    assert "invalid token" in answer.json()["message"]


def test_an_action_by_cookie_needs_the_csrf_token_and_is_audited_like_the_api(
    world: World,
) -> None:
    csrf = world.sign_in("mo")
    job = world.jobs["nlp"]
    refused = world.client.post(f"/api/v1/jobs/{job}/cancel")
    assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["message"]
    forged = world.client.post(f"/api/v1/jobs/{job}/cancel", headers={"X-CSRF-Token": "0" * 40})
    assert forged.status_code == 403
    assert world.plane.store.get_job(job).cancel_requested is False
    denied = [a for a in world.plane.store.list_audit() if a.outcome == "denied"]
    assert len(denied) == 2 and all("X-CSRF-Token" in a.detail for a in denied)  # each audited
    assert {a.action for a in denied} == {f"POST /api/v1/jobs/{job}/cancel"}
    done = world.client.post(f"/api/v1/jobs/{job}/cancel", headers={"X-CSRF-Token": csrf})
    assert done.status_code == 200 and done.json()["cancel_requested"] is True
    lines = world.plane.store.list_audit(actor="mo", action="job.cancel")
    assert [(a.object, a.outcome) for a in lines] == [(f"job/{job}", "ok")]


def test_a_member_of_another_team_is_refused_and_the_refusal_audited(world: World) -> None:
    csrf = world.sign_in("vic")
    job = world.jobs["nlp"]
    answer = world.client.post(f"/api/v1/jobs/{job}/cancel", headers={"X-CSRF-Token": csrf})
    assert answer.status_code == 403
    assert "vic is not a member of team 'nlp'" in answer.json()["message"]
    [line] = world.plane.store.list_audit(actor="vic", outcome="denied")
    assert line.object == f"job/{job}"
    resubmit = world.client.post(f"/api/v1/jobs/{job}/resubmit", headers={"X-CSRF-Token": csrf})
    assert resubmit.status_code == 403


def test_sign_out_revokes_the_session_token(world: World) -> None:
    csrf = world.sign_in("mo")
    token_id = world.client.get("/api/v1/console/session").json()["token_id"]
    assert world.client.delete("/api/v1/console/session").status_code == 403  # CSRF first
    out = world.client.delete("/api/v1/console/session", headers={"X-CSRF-Token": csrf})
    assert out.status_code == 200
    assert world.plane.store.get_token(token_id).revoked_at is not None
    world.client.cookies.clear()
    assert world.client.get("/api/v1/console/session").status_code == 401


def test_the_queue_is_in_start_order_paged_and_limited_to_visible_teams(world: World) -> None:
    store = world.plane.store
    now = store.now()
    ids = []
    for i in range(6):
        spec = JobSpec.model_validate({**GOOD, "team": "nlp", "user": "mo", "priority": i})
        ids.append(store.create_job(spec, run_dir_root=Path("/nonexistent")).id)
    # ETAs: ids[3] first, then ids[0]; the rest unknown (higher priority first, then age)
    store.set_pending_info(
        [
            (ids[0], "waiting for 2 GPUs", now + timedelta(minutes=20)),
            (ids[3], "quota of nlp is used", now + timedelta(minutes=5)),
            (ids[1], "no node fits", None),
        ]
    )
    headers = {"Authorization": f"Bearer {world.tokens['mo']}"}
    first = world.client.get("/api/v1/queue?team=nlp&limit=4", headers=headers).json()
    nlp_old = world.jobs["nlp"]
    expected = [ids[3], ids[0], ids[5], ids[4], ids[2], ids[1], nlp_old]
    assert first["total"] == 7
    assert [j["id"] for j in first["items"]] == expected[:4]
    assert [j["position"] for j in first["items"]] == [1, 2, 3, 4]
    assert first["items"][0]["pending_reason"] == "quota of nlp is used"
    assert first["items"][0]["pending_eta"] is not None
    rest = world.client.get("/api/v1/queue?team=nlp&limit=4&offset=4", headers=headers).json()
    assert [j["id"] for j in rest["items"]] == expected[4:]
    mine = world.client.get("/api/v1/queue", headers=headers).json()
    assert {j["team"] for j in mine["items"]} == {"nlp"}  # vision's job is not shown
    other = world.client.get("/api/v1/queue?team=vision", headers=headers)
    assert other.status_code == 403


def test_bad_queue_and_usage_queries_name_the_field(world: World) -> None:
    headers = {"Authorization": f"Bearer {world.tokens['admin']}"}
    answer = world.client.get("/api/v1/queue?which=sideways", headers=headers)
    assert answer.status_code == 422 and answer.json()["detail"][0]["path"] == "which"
    answer = world.client.get("/api/v1/usage/gpu-hours?by=planet", headers=headers)
    assert answer.status_code == 422 and answer.json()["detail"][0]["path"] == "by"
    answer = world.client.get("/api/v1/usage/gpu-hours?since=yesterday", headers=headers)
    assert answer.status_code == 422 and answer.json()["detail"][0]["path"] == "since"


def test_the_cluster_view_counts_gpus_by_node_and_team_with_borrowing(world: World) -> None:
    store = world.plane.store
    store.register_nodes(["n1", "n2"])
    store.set_node_state("n2", "cordoned", reason="xid 79", actor="admin")
    jobs = []
    for team, gpus in (("nlp", {"n1": [0, 1, 2, 3, 4, 5]}), ("vision", {"n1": [6]})):
        spec = JobSpec.model_validate({**GOOD, "team": team, "user": "x"})
        job = store.create_job(spec, run_dir_root=Path("/nonexistent"))
        store.transition(job.id, JobState.ADMITTED, reason="test", placement=gpus)
        jobs.append(job.id)
    capacity = [
        NodeCapacity("n1", 8, 1 << 30, gpu_indices=tuple(range(8)), switch="s1"),
        NodeCapacity("n2", 8, 1 << 30, gpu_indices=tuple(range(8)), switch="s1"),
    ]
    view = cluster_view(store, capacity, ["vision"])
    assert view["totals"] == {"gpus": 16, "allocated": 7, "free": 1, "unavailable": 8, "nodes": 2}
    n1 = view["nodes"][0]
    assert n1["gpus"][0] == {
        "index": 0,
        "status": "allocated",
        "team": "nlp",
        "job": None,
        "user": None,
    }  # another team's job: not named
    assert n1["gpus"][6]["job"] == jobs[1]
    teams = {t["name"]: t for t in view["teams"]}
    assert teams["nlp"] | {"pending": 0} == {
        "name": "nlp",
        "nominal": 4,
        "used": 6,
        "borrowed": 2,
        "lent": 0,
        "pending": 0,
        "running": 1,
    }
    assert teams["vision"]["used"] == 1 and teams["vision"]["lent"] == 2
    assert view["nodes"][1]["state"] == "cordoned" and view["switches"] == {"s1": ["n1", "n2"]}


def test_resubmit_keeps_the_hidden_environment_and_makes_the_caller_its_user(
    world: World,
) -> None:
    headers = {"Authorization": f"Bearer {world.tokens['mo']}"}
    old = world.jobs["nlp"]
    answer = world.client.post(f"/api/v1/jobs/{old}/resubmit", headers=headers)
    assert answer.status_code == 201, answer.text
    new = world.plane.store.get_job(answer.json()["id"])
    assert new.spec["env"] == {"KEY": "secret"} and new.user == "mo" and new.id != old
    shown = world.client.get(f"/api/v1/jobs/{new.id}", headers=headers).json()
    assert shown["spec"]["env"] == {"KEY": "***"}
    [line] = world.plane.store.list_audit(actor="mo", action="job.submit")
    assert line.outcome == "ok"


def test_gpu_hours_route_groups_and_limits_to_visible_teams(world: World) -> None:
    headers = {"Authorization": f"Bearer {world.tokens['vic']}"}
    answer = world.client.get("/api/v1/usage/gpu-hours?by=team,user", headers=headers)
    assert answer.status_code == 200
    body = answer.json()
    assert body["by"] == ["team", "user"] and body["rows"] == []
    assert body["kinds"] == ["useful", "restarts", "preemption", "idle"]
    refused = world.client.get("/api/v1/usage/gpu-hours?team=nlp", headers=headers)
    assert refused.status_code == 403


def test_gpu_hours_route_sums_attempts_by_team_and_user(world: World) -> None:
    store = world.plane.store
    spec = JobSpec.model_validate(
        {
            **GOOD,
            "team": "nlp",
            "user": "mo",
            "launcher": "torchrun",
            "resources": {"nodes": 2, "gpus_per_node": 4, "processes_per_node": 4},
        }
    )
    job = store.create_job(spec, run_dir_root=Path("/nonexistent")).id
    number = store.start_attempt(job, handle={}).number
    now = store.now()
    with store.engine.begin() as conn:  # 8 GPUs: 1 h allocated before running, then 2 h running
        conn.execute(
            update(Attempt)
            .where(Attempt.job_id == job, Attempt.number == number)
            .values(
                started_at=now - timedelta(hours=3),
                running_at=now - timedelta(hours=2),
                finished_at=now - timedelta(minutes=1),
                state="succeeded",
            )
        )
    headers = {"Authorization": f"Bearer {world.tokens['mo']}"}
    body = world.client.get("/api/v1/usage/gpu-hours?by=team,user", headers=headers).json()
    [row] = body["rows"]
    assert (row["team"], row["user"]) == ("nlp", "mo")
    assert row["idle"] == pytest.approx(8.0, abs=0.01)
    assert row["useful"] == pytest.approx(8 * (2 - 1 / 60), abs=0.01)
    assert body["total"]["total"] == pytest.approx(row["total"])


def test_per_rank_series_of_the_latest_attempt_with_the_runtimes_stragglers_marked(
    world: World,
) -> None:
    store, job_id = world.plane.store, world.jobs["nlp"]
    run_dir = store.get_job(job_id).run_dir
    for _ in range(2):
        store.start_attempt(job_id, handle={})
    clock = [0.0]
    for rank in range(3):  # what the runtime writes: one record a second, per attempt
        clock[0] = 0.0
        stats = RankStats(run_dir, rank, 2, clock=lambda: clock[0], wall=lambda: 1000.0)
        for step in range(1, 101):
            clock[0] += 1.0
            stats.step(step, 0.2 if rank == 1 else 0.1, 0.01 * rank)
    # the runtime's detector names rank 1 in attempt 2; rank 0 only in attempt 1
    named = StragglerDetector(windows=1).observe([0.1, 0.2, 0.1])
    store.add_event(job_id, "warning", named[0].message, attempt=2)
    store.add_event(job_id, "warning", "straggler: rank 0 forward time 9ms is 2x", attempt=1)
    mo = {"Authorization": f"Bearer {world.tokens['mo']}"}

    body = world.client.get(f"/api/v1/jobs/{job_id}/ranks?points=10", headers=mo).json()
    assert body["attempt"] == 2 and body["stragglers"] == [1] and body["note"] == ""
    assert [r["rank"] for r in body["ranks"]] == [0, 1, 2]
    slow = body["ranks"][1]
    assert slow["straggler"] and slow["straggler_message"] == named[0].message
    assert len(slow["points"]) == 10 and slow["points"][-1] == [100, 0.2, 0.01]
    assert not body["ranks"][0]["straggler"] and body["ranks"][2]["points"][0] == [1, 0.1, 0.02]

    first = world.client.get(f"/api/v1/jobs/{job_id}/ranks?attempt=1", headers=mo).json()
    assert first["ranks"] == [] and first["stragglers"] == [0]
    assert first["note"].startswith("no per-rank numbers for attempt 1")
    vic = {"Authorization": f"Bearer {world.tokens['vic']}"}
    assert world.client.get(f"/api/v1/jobs/{job_id}/ranks", headers=vic).status_code == 403
    # the running attempt's GPUs, as the node agents' heartbeats last said
    world.plane.store.register_nodes(["g1"])
    held = [
        {"gpu": 3, "util_pct": 97, "job": str(job_id), "rank": "1"},
        {"gpu": 2, "util_pct": 55, "job": str(job_id), "rank": "0"},
        {"gpu": 0, "util_pct": 0},  # idle
    ]
    admin = {"Authorization": f"Bearer {world.tokens['admin']}"}
    beat = {"telemetry": {"gpus": held}}
    assert world.client.post("/api/v1/nodes/g1/heartbeat", json=beat, headers=admin).is_success
    gpus = world.client.get(f"/api/v1/jobs/{job_id}/ranks", headers=mo).json()["gpus"]
    assert gpus == [
        {"rank": "0", "node": "g1", "gpu": 2, "util_pct": 55},
        {"rank": "1", "node": "g1", "gpu": 3, "util_pct": 97},
    ]
    earlier = world.client.get(f"/api/v1/jobs/{job_id}/ranks?attempt=1", headers=mo).json()
    assert earlier["gpus"] == []  # utilisation now says nothing of an ended attempt
    bad = world.client.get(f"/api/v1/jobs/{job_id}/ranks?points=1", headers=mo)
    assert bad.status_code == 422 and "points" in bad.text


def test_a_deployments_gateway_numbers_are_for_its_teams_members_and_count_its_requests(
    world: World,
) -> None:
    plane = world.plane
    assert plane.serving is not None
    plane.store.create_deployment(
        "echo",
        team="nlp",
        model_ref="mock",
        model_path="mock",
        engine="mock",
        replicas=1,
        options={},
        idle_timeout_s=None,
        created_by="mo",
    )
    for _ in range(3):  # what the gateway counts for each answered request
        plane.serving.metrics.requests.labels("echo", "200").inc()
        plane.serving.metrics.ttft.labels("echo").observe(0.02)
    plane.serving.metrics.requests.labels("echo", "502").inc()
    mo = {"Authorization": f"Bearer {world.tokens['mo']}"}
    body = world.client.get("/api/v1/deployments/echo/gateway", headers=mo).json()
    assert (body["requests"], body["errors"], body["window"]) == (4, 1, None)
    assert 0.01 <= body["ttft_p50_s"] <= 0.025
    vic = {"Authorization": f"Bearer {world.tokens['vic']}"}
    assert world.client.get("/api/v1/deployments/echo/gateway", headers=vic).status_code == 403
    assert world.client.get("/api/v1/deployments/nope/gateway", headers=mo).status_code == 404


def test_node_telemetry_from_an_agents_heartbeat_is_shown_to_every_user(world: World) -> None:
    world.plane.store.register_nodes(["n1", "n2"])
    admin = {"Authorization": f"Bearer {world.tokens['admin']}"}
    telemetry = {
        "gpus": [{"gpu": 0, "temp_c": 61, "xids": {"79": 1}}],
        "ib_ports": [{"device": "mlx5_0", "port": "1", "state": "DOWN", "errors": {"x": 2}}],
    }
    beat = world.client.post(
        "/api/v1/nodes/n1/heartbeat", json={"telemetry": telemetry}, headers=admin
    )
    assert beat.status_code == 200, beat.text
    assert world.client.post("/api/v1/nodes/n2/heartbeat", headers=admin).status_code == 200
    mo = {"Authorization": f"Bearer {world.tokens['mo']}"}
    [n1] = world.client.get("/api/v1/nodes/telemetry", headers=mo).json()  # n2 sent none
    assert n1["node"] == "n1" and n1["received_at"]
    [gpu] = n1["gpus"]
    assert (gpu["gpu"], gpu["temp_c"], gpu["xids"], gpu["util_pct"]) == (0, 61, {"79": 1}, None)
    assert n1["ib_ports"][0]["state"] == "DOWN" and n1["ib_ports"][0]["errors"] == {"x": 2}
    # telemetry that does not check out never costs the node its heartbeat, and is not shown
    before = world.plane.store.get_node("n1").heartbeat_at
    hot = {"gpus": [{"gpu": 0, "temp_c": 900}]}
    beat = world.client.post("/api/v1/nodes/n1/heartbeat", json={"telemetry": hot}, headers=admin)
    assert beat.status_code == 200 and world.plane.store.get_node("n1").heartbeat_at != before
    assert world.client.get("/api/v1/nodes/telemetry", headers=mo).json() == []


def test_the_page_and_its_files_are_served_compressed_with_a_strict_csp(world: World) -> None:
    page = world.client.get("/", headers={"Authorization": ""})
    assert page.status_code == 200 and "<title>tensoryard</title>" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    raw = world.client.get("/ui/app.js", headers={"Accept-Encoding": "gzip"})  # httpx decodes it
    assert raw.headers["content-encoding"] == "gzip"
    assert raw.content == (STATIC / "app.js").read_bytes()
    again = world.client.get("/ui/app.js", headers={"If-None-Match": raw.headers["etag"]})
    assert again.status_code == 304
    assert world.client.get("/ui/../server/app.py").status_code == 404
    assert len(gzip.compress((STATIC / "app.js").read_bytes())) < 5000
