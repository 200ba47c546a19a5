"""The REST API against a real store (SQLite and PostgreSQL): auth, validation, listing,
cancel. The control loop is driven by hand (`controller.cycle()`), so nothing is timing-bound."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.store import Store
from tensoryard.store.models import Base

GOOD = {"name": "tiny", "command": ["train.py"], "launcher": "python"}


def _truncate(url: str) -> None:
    """The PostgreSQL database lives for the session: empty it for each test."""
    with Store.open(url) as store, store.engine.begin() as conn:
        tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def plane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ControlPlane]:
    db_url = None
    if request.param == "postgres":
        db_url = request.getfixturevalue("pg_url")
        _truncate(db_url)
    config = ServerConfig(home=tmp_path / "home", db_url=db_url, cpu_slots=2)
    cp = build_control_plane(config)
    assert cp.controller.lead()  # the tests run cycles by hand; the loop's writes are fenced
    yield cp
    cp.store.close()


@pytest.fixture
def api(plane: ControlPlane) -> Iterator[TestClient]:
    with TestClient(plane.app()) as client:
        client.headers["Authorization"] = f"Bearer {plane.admin_token}"
        yield client


def submit(api: TestClient, **changes: Any) -> dict[str, Any]:
    response = api.post("/api/v1/jobs", json={"spec": {**GOOD, **changes}})
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_health_needs_no_token(plane: ControlPlane) -> None:
    with TestClient(plane.app()) as client:
        assert client.get("/healthz").json()["ok"] is True


@pytest.mark.parametrize(
    "header",
    [None, "Bearer wrong", "Basic abc"],
    ids=["no token", "a wrong token", "a non-bearer scheme"],
)
def test_requests_without_a_valid_token_get_401(plane: ControlPlane, header: str | None) -> None:
    with TestClient(plane.app()) as client:
        headers = {"Authorization": header} if header else {}
        response = client.get("/api/v1/jobs", headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"


def test_a_submitted_job_is_pending_with_its_spec_and_a_submitted_event(api: TestClient) -> None:
    job = submit(api)
    assert job["state"] == "PENDING"
    assert job["spec"]["command"] == ["train.py"]
    events = api.get(f"/api/v1/jobs/{job['id']}/events").json()
    assert events[0]["kind"] == "submitted"


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({**GOOD, "bogus": 1}, "bogus"),
        ({**GOOD, "resources": {"nodes": -2}}, "resources.nodes"),
        ({**GOOD, "resources": {"gpus_per_node": 1000}}, "resources.gpus_per_node"),
        ({"name": "tiny"}, "command"),
        ({**GOOD, "team": "nobody"}, "team"),
        ({**GOOD, "volumes": [{"claim": "team-data", "mount": "/data"}]}, "volumes"),
    ],
    ids=[
        "an unknown field",
        "a negative node count",
        "an absurd GPU count",
        "a missing command",
        "an unknown team",
        "a volume claim on the local executor",
    ],
)
def test_bad_specs_get_422_with_field_paths_and_nothing_is_stored(
    api: TestClient, spec: dict[str, Any], path: str
) -> None:
    response = api.post("/api/v1/jobs", json={"spec": spec})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert path in [d["path"] for d in detail]
    assert all(d["message"] for d in detail)
    assert api.get("/api/v1/jobs").json()["total"] == 0


def test_a_body_without_spec_gets_422_naming_the_field(api: TestClient) -> None:
    response = api.post("/api/v1/jobs", json={"name": "x"})
    assert response.status_code == 422
    assert "spec" in [d["path"] for d in response.json()["detail"]]


def test_listing_filters_by_state_and_team_and_pages_with_a_cursor(
    api: TestClient, plane: ControlPlane
) -> None:
    plane.store.ensure_team("nlp")
    ids = [submit(api, name=f"job-{i}", team="nlp" if i % 2 else "default")["id"] for i in range(5)]
    nlp = api.get("/api/v1/jobs", params={"team": "nlp"}).json()
    assert {j["id"] for j in nlp["items"]} == {ids[1], ids[3]}
    seen: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/api/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted(ids)
    assert len(seen) == len(set(seen))
    pending = api.get("/api/v1/jobs", params={"state": "pending"}).json()
    assert pending["total"] == 5
    bad = api.get("/api/v1/jobs", params={"state": "SLEEPING"})
    assert bad.status_code == 422
    assert "PENDING" in bad.json()["detail"][0]["fix"]


def test_an_unknown_job_is_404(api: TestClient) -> None:
    assert api.get("/api/v1/jobs/9999").status_code == 404


def test_cancelling_a_pending_job_ends_it_at_the_next_cycle(
    api: TestClient, plane: ControlPlane
) -> None:
    job = submit(api, resources={"cpu": 64})  # can never fit on 2 slots: stays pending
    plane.controller.cycle()
    pending = api.get(f"/api/v1/jobs/{job['id']}").json()
    assert pending["state"] == "PENDING"
    assert "never start" in pending["pending_reason"]
    assert api.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    plane.controller.cycle()
    assert api.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "CANCELLED"
    again = api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert "already ended" in again.json()["message"]


def test_a_job_token_may_report_only_for_its_own_job(api: TestClient, plane: ControlPlane) -> None:
    a, b = submit(api, name="a"), submit(api, name="b")
    token = plane.store.issue_job_token(a["id"])
    body = {"attempt": 1, "metrics": []}
    hdr = {"Authorization": f"Bearer {token}"}
    plane.store.start_attempt(a["id"], handle={})
    assert api.post(f"/api/v1/jobs/{a['id']}/report", json=body, headers=hdr).status_code == 200
    assert api.post(f"/api/v1/jobs/{b['id']}/report", json=body, headers=hdr).status_code == 401
    assert api.get("/api/v1/jobs", headers=hdr).status_code == 401


def test_reports_store_metrics_once_even_when_resent(api: TestClient, plane: ControlPlane) -> None:
    job = submit(api)
    plane.store.start_attempt(job["id"], handle={})
    rows = [
        {"step": s, "ts": 1.0 + s, "step_time_s": 0.1, "values": {"loss": 3.0 - s}} for s in (1, 2)
    ]
    body = {"attempt": 1, "metrics": rows, "heartbeat_at": 100.0}
    for _ in range(2):
        assert api.post(f"/api/v1/jobs/{job['id']}/report", json=body).json() == {
            "ok": True,
            "cancel": False,
        }
    metrics = api.get(f"/api/v1/jobs/{job['id']}/metrics").json()
    assert [m["step"] for m in metrics] == [1, 2]
    summary = api.get(f"/api/v1/jobs/{job['id']}/summary").json()
    assert summary["initial_loss"] == 2.0 and summary["final_loss"] == 1.0


def test_the_openapi_document_lists_the_v1_routes(api: TestClient) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    for route in ("/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/logs"):
        assert route in paths


def test_a_batch_is_stored_whole_and_a_bad_spec_in_it_stores_nothing(api: TestClient) -> None:
    specs = [{**GOOD, "name": f"batch-{i}"} for i in range(5)]
    response = api.post("/api/v1/jobs/batch", json={"specs": specs})
    assert response.status_code == 201, response.text
    ids = response.json()["ids"]
    assert len(ids) == 5 and ids == sorted(ids)
    names = [api.get(f"/api/v1/jobs/{i}").json()["name"] for i in ids]
    assert names == [s["name"] for s in specs]

    bad = [*specs, {**GOOD, "name": "ok"}, {**GOOD, "resources": {"cpu": -1}}]
    response = api.post("/api/v1/jobs/batch", json={"specs": bad})
    assert response.status_code == 422
    paths = [d["path"] for d in response.json()["detail"]]
    assert paths == ["specs.6.resources.cpu"]
    assert api.get("/api/v1/jobs").json()["total"] == 5


def test_a_batch_over_the_limit_is_refused_naming_the_field(api: TestClient) -> None:
    response = api.post("/api/v1/jobs/batch", json={"specs": [GOOD] * 1001})
    assert response.status_code == 422
    assert "specs" in response.text


def test_a_secret_is_written_and_listed_by_name_but_never_read_back(api: TestClient) -> None:
    assert (
        api.put("/api/v1/teams/default/secrets/hf-token", json={"value": "s3"}).status_code == 204
    )
    assert api.get("/api/v1/teams/default/secrets").json() == ["hf-token"]
    assert api.get("/api/v1/teams/default/secrets/hf-token").status_code in (404, 405)
    job = submit(api, secrets={"HF_TOKEN": "hf-token"})
    assert job["spec"]["secrets"] == {"HF_TOKEN": "hf-token"}
    assert "s3" not in str(api.get(f"/api/v1/jobs/{job['id']}").json())
    bad = api.put("/api/v1/teams/default/secrets/..%2Fescape", json={"value": "x"})
    assert bad.status_code in (404, 422)
    assert api.delete("/api/v1/teams/default/secrets/hf-token").status_code == 204
    assert api.get("/api/v1/teams/default/secrets").json() == []


def test_secret_references_are_checked_in_the_spec(api: TestClient) -> None:
    for refs, fragment in (
        ({"TYARD_JOB_TOKEN": "x"}, "control plane"),
        ({"bad name": "x"}, "not an environment variable name"),
        ({"KEY": "Not_A_Name"}, "not a secret name"),
    ):
        answer = api.post("/api/v1/jobs", json={"spec": {**GOOD, "secrets": refs}})
        assert answer.status_code == 422 and fragment in answer.text, answer.text


def test_an_idempotency_key_makes_a_retried_submission_return_the_first_job(
    api: TestClient,
) -> None:
    body = {"spec": GOOD}
    first = api.post("/api/v1/jobs", json=body, headers={"Idempotency-Key": "abc-1"})
    again = api.post("/api/v1/jobs", json=body, headers={"Idempotency-Key": "abc-1"})
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    changed = {"spec": {**GOOD, "name": "other"}}
    reused = api.post("/api/v1/jobs", json=changed, headers={"Idempotency-Key": "abc-1"})
    assert reused.status_code == 409 and "different submission" in reused.text
    batch = {"specs": [GOOD, GOOD]}
    key = {"Idempotency-Key": "b"}
    ids = api.post("/api/v1/jobs/batch", json=batch, headers=key).json()
    assert api.post("/api/v1/jobs/batch", json=batch, headers=key).json() == ids
    for bad in ["has space", "x#1", "y" * 101]:
        response = api.post("/api/v1/jobs", json=body, headers={"Idempotency-Key": bad})
        assert response.status_code == 422, response.text
        assert [d["path"] for d in response.json()["detail"]] == ["Idempotency-Key"]
    assert api.get("/api/v1/jobs").json()["total"] == 3
