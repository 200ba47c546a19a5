"""Pipelines through the REST API and the Python client's routes (SQLite): team access like
jobs, bad specs and parameters as 422 naming the field, nothing stored on error, env redacted,
cancel."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane


def spec(team: str = "nlp", **extra: Any) -> dict[str, Any]:
    return {
        "name": "chain",
        "team": team,
        "params": {"lr": 0.1},
        "steps": [
            {"name": "train", "job": {"launcher": "python", "command": ["t.py", "${{ params.lr }}"],
                                      "env": {"WANDB_KEY": "secret"}}},
            {"name": "eval", "job": {"launcher": "python",
                                     "command": ["e.py", "${{ steps.train.outputs.checkpoint }}"]}},
        ],
        **extra,
    }  # fmt: skip


@dataclass
class World:
    plane: ControlPlane
    client: TestClient
    tokens: dict[str, str]

    def as_(self, who: str) -> TestClient:
        self.client.headers["Authorization"] = f"Bearer {self.tokens[who]}"
        return self.client


@pytest.fixture
def world(tmp_path: Path, migrated_sqlite_url: str) -> Iterator[World]:
    config = ServerConfig(home=tmp_path / "home", db_url=migrated_sqlite_url, cpu_slots=2)
    plane = build_control_plane(config)
    store = plane.store
    tokens = {"admin": plane.admin_token}
    for team in ("nlp", "vision"):
        store.ensure_team(team)
    for user, team, role in (("vera", "nlp", "viewer"), ("mo", "nlp", "member"),
                             ("vic", "vision", "member")):  # fmt: skip
        store.create_user(user)
        store.set_member(team, user, role)
        tokens[user] = store.create_token(user).token
    with TestClient(plane.app()) as client:
        yield World(plane, client, tokens)
    store.close()


def test_a_member_starts_a_pipeline_and_its_team_sees_it_with_env_redacted(world: World) -> None:
    answer = world.as_("mo").post("/api/v1/pipelines", json={"spec": spec(), "params": {"lr": 2}})
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["user"] == "mo" and body["state"] == "RUNNING" and body["params"] == {"lr": 2}
    assert [s["name"] for s in body["steps"]] == ["train", "eval"]
    assert all(s["state"] == "WAITING" for s in body["steps"])
    assert body["spec"]["steps"][0]["job"]["env"] == {"WANDB_KEY": "***"}

    seen = world.as_("vera").get(f"/api/v1/pipelines/{body['id']}")
    assert seen.status_code == 200 and seen.json()["id"] == body["id"]
    assert [p["id"] for p in world.as_("vera").get("/api/v1/pipelines").json()] == [body["id"]]
    assert world.as_("vic").get("/api/v1/pipelines").json() == []
    assert world.as_("vic").get(f"/api/v1/pipelines/{body['id']}").status_code == 403
    listed = world.as_("admin").get("/api/v1/pipelines", params={"state": "running"}).json()
    assert [p["id"] for p in listed] == [body["id"]]


def test_viewers_and_other_teams_may_not_start_or_cancel(world: World) -> None:
    assert world.as_("vera").post("/api/v1/pipelines", json={"spec": spec()}).status_code == 403
    assert world.as_("vic").post("/api/v1/pipelines", json={"spec": spec()}).status_code == 403
    started = world.as_("mo").post("/api/v1/pipelines", json={"spec": spec()}).json()
    assert world.as_("vic").post(f"/api/v1/pipelines/{started['id']}/cancel").status_code == 403
    assert world.plane.store.list_pipelines() != []
    assert len(world.plane.store.list_pipelines()) == 1


@pytest.mark.parametrize(
    ("body", "path", "fragment"),
    [
        ({"spec": spec(), "params": {"rate": 1}}, "params.rate", "unknown parameter 'rate'"),
        (
            {"spec": spec(steps=[{"name": "a", "needs": ["b"], "job": {"command": ["x"]}}])},
            "steps.0.needs.0",
            "which is not a step",
        ),
        ({"spec": spec(team="ghost")}, "team", "unknown team 'ghost'"),
        ({"spec": {"name": "x"}}, "steps", "Field required"),
        ({"spec": spec(), "params": {"lr": "fast"}}, "params.lr", "'fast' is not a number"),
    ],
    ids=["unknown parameter", "unknown need", "unknown team", "no steps", "a mistyped value"],
)
def test_bad_input_is_a_422_naming_the_field_and_nothing_is_stored(
    world: World, body: dict[str, Any], path: str, fragment: str
) -> None:
    answer = world.as_("admin").post("/api/v1/pipelines", json=body)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert any(d["path"] == path and fragment in d["message"] for d in detail), detail
    assert world.plane.store.list_pipelines() == []
    assert world.plane.store.list_jobs().total == 0


def test_cancel_is_recorded_once_and_an_unknown_pipeline_is_404(world: World) -> None:
    started = world.as_("mo").post("/api/v1/pipelines", json={"spec": spec()}).json()
    cancelled = world.as_("mo").post(f"/api/v1/pipelines/{started['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["cancel_requested"] is True
    assert world.plane.controller.lead()  # the advancer writes as the loop: fenced
    world.plane.controller.pipelines.advance()
    record = world.plane.store.get_pipeline(started["id"])
    assert record.state == "CANCELLED"
    assert [s.state for s in record.steps] == ["CANCELLED", "CANCELLED"]
    again = world.as_("mo").post(f"/api/v1/pipelines/{started['id']}/cancel")
    assert again.status_code == 409 and "already ended (CANCELLED)" in again.json()["message"]
    assert world.as_("mo").get("/api/v1/pipelines/999").status_code == 404
    audit = [a.action for a in world.plane.store.list_audit()]
    assert "pipeline.submit" in audit and "pipeline.cancel" in audit
