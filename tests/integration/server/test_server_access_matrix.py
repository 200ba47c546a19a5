"""The access matrix: every route of the control plane x every kind of caller, on SQLite and on
PostgreSQL.

Each route declares who may call it (``tensoryard.api.access.ROUTE_ACCESS``). These tests
fail on a route of the real app without a declaration, and call every declared route, in
process through the whole ASGI stack, as each caller below, against real objects of team nlp
(a running job, a pipeline, a model version, a deployment, a node, a webhook delivery): an
allowed caller gets the route's answer (never 401 or 403), a refused one gets exactly 401 or
403 in the route's documented error shape, and every 403 leaves exactly one `denied` audit
line (and no other answer leaves one).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI
from pydantic import BaseModel

from tensoryard.api.access import ROUTE_ACCESS, Caller, route_keys
from tensoryard.executors.local.executor import LocalHandle
from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.server.schemas import ErrorOut
from tensoryard.serving.gateway import OpenAIErrorOut
from tensoryard.spec.job import JobSpec
from tensoryard.spec.pipeline import parse_pipeline_spec
from tensoryard.spec.states import JobState
from tensoryard.store import Store
from tensoryard.store.models import Base

TEAM, OTHER = "nlp", "vision"
GOOD = {"name": "tiny", "command": ["train.py"], "launcher": "python"}
PIPELINE = {
    "name": "chain",
    "team": TEAM,
    "steps": [{"name": "train", "job": {"launcher": "python", "command": ["t.py"]}}],
}

# ---- callers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Who:
    """A caller of the matrix, and what it is to the objects of team nlp (the routes' objects)."""

    words: str
    kind: Caller
    refused_with: int  # the status of a refusal: 401 without a user's token, else 403
    owner: bool = False  # owns the routes' owned objects (the token a DELETE revokes)
    own_job: bool = True  # for a job token: it is the token of the path's job


CALLERS = {
    "admin": Who("a platform admin", Caller.PLATFORM_ADMIN, 403),
    "team-admin": Who("a team-admin of the team", Caller.TEAM_ADMIN, 403),
    "member": Who("a member of the team", Caller.MEMBER, 403, owner=True),
    "viewer": Who("a viewer of the team", Caller.VIEWER, 403),
    "stranger": Who("a member of another team", Caller.USER, 403),
    "job": Who("the job's own token", Caller.JOB, 401),
    "other-job": Who("another job's token", Caller.JOB, 401, own_job=False),
    "anonymous": Who("a caller without a token", Caller.ANONYMOUS, 401),
    "revoked": Who("a revoked platform admin token", Caller.ANONYMOUS, 401),
}


def _admitted(route: tuple[str, str], who: Who) -> bool:
    access = ROUTE_ACCESS[route]
    if who.kind is Caller.JOB and not who.own_job:
        return access.admits(Caller.ANONYMOUS)  # another job's token is no credential here
    return access.admits(who.kind, owner=who.owner)


# ---- an in-process HTTP client that also calls endless streams -------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def _asgi_call(
    app: FastAPI, method: str, path: str, query: str, headers: dict[str, str], body: bytes
) -> Answer:
    """One request through the app's whole ASGI stack (middleware, routing, error handlers).
    A server-sent event stream is answered once it starts: the client then disconnects."""
    done = asyncio.Event()
    start: dict[str, Any] = {}
    chunks: list[bytes] = []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
            kind = dict(message.get("headers", ())).get(b"content-type", b"")
            if kind.startswith(b"text/event-stream"):
                done.set()
        elif message["type"] == "http.response.body" and not done.is_set():
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "server": ("testserver", 80),
        "client": ("testclient", 50000),
        "root_path": "",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    task = asyncio.ensure_future(app(scope, receive, send))  # type: ignore[arg-type]
    waiter = asyncio.ensure_future(done.wait())
    await asyncio.wait([task, waiter], timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        await asyncio.wait([task], timeout=10)  # the stream saw the disconnect: it ends
    waiter.cancel()
    if not task.done():
        task.cancel()
        raise AssertionError(f"{method} {path} did not answer within 60 s")
    task.result()  # an exception the app let through fails the test here
    raw = {k.decode().lower(): v.decode() for k, v in start.get("headers", ())}
    return Answer(int(start["status"]), raw, b"".join(chunks))


# ---- the world: team nlp's objects, one of each ----------------------------------------------


@dataclass(frozen=True)
class Call:
    """The request a recipe makes, and what an allowed caller gets."""

    path: str
    json: Any = None
    params: dict[str, str] = field(default_factory=dict)
    ok: frozenset[int] = frozenset({200, 201, 204})


@dataclass
class World:
    plane: ControlPlane
    app: FastAPI
    portal: BlockingPortal
    tokens: dict[str, str]  # caller -> bearer token
    job: int  # team nlp's running job (attempt 1), whose token is tokens["job"]
    pipeline: int
    digest: str  # the artifact of model nlp/m version 1
    delivery: int  # a webhook delivery row
    fresh: Iterator[int] = field(default_factory=itertools.count)
    audit_seen: int = 0  # the newest audit id already looked at

    @property
    def store(self) -> Store:
        return self.plane.store

    def request(self, method: str, call: Call, token: str | None) -> Answer:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        body = b""
        if call.json is not None:
            body = json.dumps(call.json).encode()
            headers["content-type"] = "application/json"
        query = urlencode(call.params)
        return self.portal.call(_asgi_call, self.app, method, call.path, query, headers, body)

    def new_audit(self) -> list[Any]:
        rows = self.store.list_audit(after_id=self.audit_seen, limit=10_000)
        if rows:
            self.audit_seen = rows[-1].id
        return rows

    def name(self, prefix: str) -> str:
        return f"{prefix}{next(self.fresh)}"

    def new_job(self, team: str = TEAM) -> int:
        spec = JobSpec.model_validate({**GOOD, "team": team, "user": "mo"})
        return self.store.create_job(spec, run_dir_root=self.plane.config.runs_dir).id


def _running_job(plane: ControlPlane, team: str) -> tuple[int, str]:
    """A job of ``team`` with attempt 1 running (a rank-0 log in its run directory) and the
    attempt's job token."""
    store = plane.store
    spec = JobSpec.model_validate({**GOOD, "team": team, "user": "mo"})
    job = store.create_job(spec, run_dir_root=plane.config.runs_dir)
    attempt_dir = Path(job.run_dir or "") / "attempt-1"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "rank-0.log").write_text("step 1\n")
    handle = LocalHandle(
        job_id=str(job.id),
        attempt=1,
        attempt_dir=str(attempt_dir),
        launcher="python",
        world_size=1,
        shim_pid=0,
        shim_create_time=0.0,
        attempt_key="k",
    ).to_dict()
    store.transition(job.id, JobState.ADMITTED, reason="admitted")
    store.begin_attempt(
        job.id, expected=JobState.ADMITTED, number=1, attempt_key="k", handle=handle, reason="go"
    )
    store.mark_launched(job.id, 1, handle)
    token = store.issue_job_token(job.id, attempt=1)
    store.mark_running(job.id, 1, "running")
    return job.id, token


def _truncate(url: str) -> None:
    """The PostgreSQL database lives for the session: empty it for this module."""
    with Store.open(url) as store, store.engine.begin() as conn:
        tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")


def _build(plane: ControlPlane, portal: BlockingPortal, home: Path) -> World:
    store = plane.store
    tokens = {"admin": plane.admin_token}
    for team in (TEAM, OTHER):
        store.ensure_team(team)
    for caller, user, team, role in (
        ("team-admin", "tad", TEAM, "team-admin"),
        ("member", "mo", TEAM, "member"),
        ("viewer", "vera", TEAM, "viewer"),
        ("stranger", "vic", OTHER, "member"),
    ):
        store.create_user(user)
        store.set_member(team, user, role)
        tokens[caller] = store.create_token(user).token
    store.create_user("spare")  # the user whose membership PUT changes
    revoked = store.create_token("admin", name="revoked")
    store.revoke_token(revoked.record.id)
    tokens["revoked"] = revoked.token
    job, tokens["job"] = _running_job(plane, TEAM)
    _, tokens["other-job"] = _running_job(plane, TEAM)
    store.register_nodes(["node-a"])
    spec = parse_pipeline_spec({**PIPELINE, "user": "mo"}, source="test")
    pipeline = store.create_pipeline(spec, {}).id
    weights = home / "weights"
    weights.mkdir()
    (weights / "model.bin").write_bytes(b"\0" * 64)
    digest = ArtifactStore(open_blobs(plane.config.artifact_store_url)).push(weights)
    store.route_webhooks([("http://127.0.0.1:9/hook", ["model.version.created"])])
    store.register_version(
        TEAM,
        "m",
        artifact=digest.manifest.digest,
        size_bytes=64,
        created_by="mo",
        aliases=["production"],
    )
    delivery = store.list_webhook_deliveries()[0].id
    app = plane.app()
    world = World(plane, app, portal, tokens, job, pipeline, digest.manifest.digest, delivery)
    made = world.request(
        "POST",
        Call(
            "/api/v1/deployments",
            json={"model": "mock", "name": "chat", "engine": "mock", "replicas": 0, "team": TEAM},
        ),
        plane.admin_token,
    )
    assert made.status == 201, made.body
    assert plane.serving is not None
    plane.serving.manager.reconcile()  # adopted, at 0 replicas: the gateway answers at once
    world.new_audit()
    return world


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    db_url = None
    if request.param == "postgres":
        db_url = request.getfixturevalue("pg_url")
        _truncate(db_url)
    home = tmp_path_factory.mktemp(f"matrix-{request.param}")
    config = ServerConfig(
        home=home / "home",
        db_url=db_url,
        cpu_slots=2,
        rate_limit_per_s=1e6,  # a thousand requests in seconds must not turn into 429s
        rate_limit_burst=10**6,
    )
    plane = build_control_plane(config)
    try:
        with start_blocking_portal() as portal:
            yield _build(plane, portal, home)
    finally:
        plane.store.close()


# ---- one request per route: the objects it acts on exist ------------------------------------

Recipe = Callable[[World], Call]
J = "/api/v1/jobs"


def _fresh_token(w: World) -> Call:
    return Call(f"/api/v1/tokens/{w.store.create_token('mo', name=w.name('t')).record.id}")


def _fresh_member(w: World) -> Call:
    user = w.name("leaver")
    w.store.create_user(user)
    w.store.set_member(TEAM, user, "viewer")
    return Call(f"/api/v1/teams/{TEAM}/members/{user}")


def _fresh_pipeline(w: World) -> Call:
    spec = parse_pipeline_spec({**PIPELINE, "user": "mo"}, source="test")
    return Call(f"/api/v1/pipelines/{w.store.create_pipeline(spec, {}).id}/cancel")


def _fresh_secret(w: World) -> Call:
    name = w.name("s")
    w.plane.controller.secrets.put(TEAM, name, "x")
    return Call(f"/api/v1/teams/{TEAM}/secrets/{name}")


def _fresh_alias(w: World) -> Call:
    alias = w.name("a")
    w.store.set_alias(TEAM, "m", alias, 1)
    return Call(f"/api/v1/models/{TEAM}/m/aliases/{alias}")


def _failed_delivery(w: World) -> Call:
    for row in w.store.claim_webhook_deliveries("matrix"):
        w.store.finish_webhook_delivery(row.id, "matrix", "failed", status=500)
    return Call(f"/api/v1/webhook-deliveries/{w.delivery}/redeliver")


def _fresh_deployment(w: World) -> Call:
    name = w.name("d")
    w.store.create_deployment(
        name,
        team=TEAM,
        model_ref="mock",
        model_path="",
        engine="mock",
        replicas=0,
        options={},
        idle_timeout_s=None,
        created_by="mo",
    )
    return Call(f"/api/v1/deployments/{name}")


NO_REPLICA = frozenset({503})  # allowed, then: the deployment is scaled to zero
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

RECIPES: dict[tuple[str, str], Recipe] = {
    ("GET", "/healthz"): lambda w: Call("/healthz"),
    ("GET", "/openapi.json"): lambda w: Call("/openapi.json"),
    ("GET", "/docs"): lambda w: Call("/docs"),
    ("GET", "/docs/oauth2-redirect"): lambda w: Call("/docs/oauth2-redirect"),
    ("GET", "/redoc"): lambda w: Call("/redoc"),
    ("GET", "/"): lambda w: Call("/"),
    ("GET", "/ui/{path:path}"): lambda w: Call("/ui/app.js"),
    # jobs
    ("POST", J): lambda w: Call(J, json={"spec": {**GOOD, "team": TEAM}}),
    ("POST", f"{J}/batch"): lambda w: Call(f"{J}/batch", json={"specs": [{**GOOD, "team": TEAM}]}),
    ("GET", J): lambda w: Call(J),
    ("GET", f"{J}/{{job_id}}"): lambda w: Call(f"{J}/{w.job}"),
    ("POST", f"{J}/{{job_id}}/cancel"): lambda w: Call(f"{J}/{w.new_job()}/cancel"),
    ("GET", f"{J}/{{job_id}}/attempts"): lambda w: Call(f"{J}/{w.job}/attempts"),
    ("GET", f"{J}/{{job_id}}/events"): lambda w: Call(f"{J}/{w.job}/events"),
    ("GET", f"{J}/{{job_id}}/metrics"): lambda w: Call(f"{J}/{w.job}/metrics"),
    ("GET", f"{J}/{{job_id}}/checkpoints"): lambda w: Call(f"{J}/{w.job}/checkpoints"),
    ("GET", f"{J}/{{job_id}}/ranks"): lambda w: Call(f"{J}/{w.job}/ranks"),
    ("GET", f"{J}/{{job_id}}/checkpoint-removals"): lambda w: Call(
        f"{J}/{w.job}/checkpoint-removals"
    ),
    ("GET", f"{J}/{{job_id}}/summary"): lambda w: Call(f"{J}/{w.job}/summary"),
    ("GET", f"{J}/{{job_id}}/logs"): lambda w: Call(f"{J}/{w.job}/logs"),
    ("POST", f"{J}/{{job_id}}/report"): lambda w: Call(f"{J}/{w.job}/report", json={"attempt": 1}),
    ("POST", f"{J}/{{job_id}}/resubmit"): lambda w: Call(f"{J}/{w.job}/resubmit"),
    ("GET", f"{J}/{{job_id}}/stream"): lambda w: Call(f"{J}/{w.job}/stream"),
    ("GET", f"{J}/{{job_id}}/logs/stream"): lambda w: Call(f"{J}/{w.job}/logs/stream"),
    # teams, users, members, tokens, audit
    ("GET", "/api/v1/teams"): lambda w: Call("/api/v1/teams"),
    ("POST", "/api/v1/teams"): lambda w: Call("/api/v1/teams", json={"name": "new"}),
    ("PATCH", "/api/v1/teams/{name}"): lambda w: Call(
        f"/api/v1/teams/{TEAM}", json={"gpu_quota": 8}
    ),
    ("GET", "/api/v1/teams/{name}/goodput"): lambda w: Call(f"/api/v1/teams/{TEAM}/goodput"),
    ("GET", "/api/v1/users/me"): lambda w: Call("/api/v1/users/me"),
    ("GET", "/api/v1/users"): lambda w: Call("/api/v1/users"),
    ("POST", "/api/v1/users"): lambda w: Call("/api/v1/users", json={"name": w.name("neo")}),
    ("GET", "/api/v1/teams/{team}/members"): lambda w: Call(f"/api/v1/teams/{TEAM}/members"),
    ("PUT", "/api/v1/teams/{team}/members/{user}"): lambda w: Call(
        f"/api/v1/teams/{TEAM}/members/spare", json={"role": "viewer"}
    ),
    ("DELETE", "/api/v1/teams/{team}/members/{user}"): _fresh_member,
    ("GET", "/api/v1/tokens"): lambda w: Call("/api/v1/tokens"),
    ("POST", "/api/v1/tokens"): lambda w: Call("/api/v1/tokens", json={"name": "more"}),
    ("DELETE", "/api/v1/tokens/{token_id}"): _fresh_token,
    ("GET", "/api/v1/audit"): lambda w: Call("/api/v1/audit"),
    ("GET", "/api/v1/audit/export"): lambda w: Call("/api/v1/audit/export"),
    ("GET", "/metrics"): lambda w: Call("/metrics"),
    # pipelines
    ("POST", "/api/v1/pipelines"): lambda w: Call("/api/v1/pipelines", json={"spec": PIPELINE}),
    ("GET", "/api/v1/pipelines"): lambda w: Call("/api/v1/pipelines"),
    ("GET", "/api/v1/pipelines/{pipeline_id}"): lambda w: Call(f"/api/v1/pipelines/{w.pipeline}"),
    ("POST", "/api/v1/pipelines/{pipeline_id}/cancel"): _fresh_pipeline,
    # nodes
    ("GET", "/api/v1/nodes"): lambda w: Call("/api/v1/nodes"),
    ("GET", "/api/v1/nodes/{name}/history"): lambda w: Call("/api/v1/nodes/node-a/history"),
    ("GET", "/api/v1/nodes/telemetry"): lambda w: Call("/api/v1/nodes/telemetry"),
    ("POST", "/api/v1/nodes/{name}/cordon"): lambda w: Call(
        "/api/v1/nodes/node-a/cordon", json={"reason": "matrix"}
    ),
    ("POST", "/api/v1/nodes/{name}/uncordon"): lambda w: Call(
        "/api/v1/nodes/node-a/uncordon", json={}
    ),
    ("POST", "/api/v1/nodes/{name}/heartbeat"): lambda w: Call("/api/v1/nodes/node-a/heartbeat"),
    ("POST", "/api/v1/nodes/{name}/preflight"): lambda w: Call(
        "/api/v1/nodes/node-a/preflight", json={"node": "node-a", "ok": True}
    ),
    ("POST", "/api/v1/health/alerts"): lambda w: Call("/api/v1/health/alerts", json={"alerts": []}),
    # team secrets
    ("GET", "/api/v1/teams/{team}/secrets"): lambda w: Call(f"/api/v1/teams/{TEAM}/secrets"),
    ("PUT", "/api/v1/teams/{team}/secrets/{name}"): lambda w: Call(
        f"/api/v1/teams/{TEAM}/secrets/hf-token", json={"value": "s3cret"}
    ),
    ("DELETE", "/api/v1/teams/{team}/secrets/{name}"): _fresh_secret,
    # model registry
    ("GET", "/api/v1/artifacts"): lambda w: Call("/api/v1/artifacts"),
    ("POST", "/api/v1/artifacts/gc"): lambda w: Call(
        "/api/v1/artifacts/gc", params={"dry_run": "true"}
    ),
    ("GET", "/api/v1/models"): lambda w: Call("/api/v1/models"),
    ("GET", "/api/v1/models/{team}/{name}"): lambda w: Call(f"/api/v1/models/{TEAM}/m"),
    ("POST", "/api/v1/models/{team}/{name}/versions"): lambda w: Call(
        f"/api/v1/models/{TEAM}/m/versions", json={"artifact": w.digest}
    ),
    ("GET", "/api/v1/models/{team}/{name}/versions/{ref}"): lambda w: Call(
        f"/api/v1/models/{TEAM}/m/versions/production"
    ),
    ("GET", "/api/v1/models/{team}/{name}/versions/{ref}/lineage"): lambda w: Call(
        f"/api/v1/models/{TEAM}/m/versions/1/lineage"
    ),
    ("PUT", "/api/v1/models/{team}/{name}/aliases/{alias}"): lambda w: Call(
        f"/api/v1/models/{TEAM}/m/aliases/staging", json={"version": 1}
    ),
    ("DELETE", "/api/v1/models/{team}/{name}/aliases/{alias}"): _fresh_alias,
    ("PUT", "/api/v1/models/{team}/{name}/versions/{version}/tags"): lambda w: Call(
        f"/api/v1/models/{TEAM}/m/versions/1/tags", json={"tags": {"by": "matrix"}}
    ),
    ("GET", "/api/v1/model-versions"): lambda w: Call(
        "/api/v1/model-versions", params={"artifact": w.digest}
    ),
    # webhook outbox
    ("GET", "/api/v1/webhook-deliveries"): lambda w: Call("/api/v1/webhook-deliveries"),
    ("GET", "/api/v1/webhook-deliveries/{row_id}"): lambda w: Call(
        f"/api/v1/webhook-deliveries/{w.delivery}"
    ),
    ("POST", "/api/v1/webhook-deliveries/{row_id}/redeliver"): _failed_delivery,
    # serving
    ("POST", "/api/v1/deployments"): lambda w: Call(
        "/api/v1/deployments",
        json={"model": "mock", "name": w.name("d"), "engine": "mock", "replicas": 0, "team": TEAM},
    ),
    ("GET", "/api/v1/deployments"): lambda w: Call("/api/v1/deployments"),
    ("GET", "/api/v1/deployments/{name}"): lambda w: Call("/api/v1/deployments/chat"),
    ("GET", "/api/v1/deployments/{name}/gateway"): lambda w: Call(
        "/api/v1/deployments/chat/gateway"
    ),
    ("POST", "/api/v1/deployments/{name}/scale"): lambda w: Call(
        "/api/v1/deployments/chat/scale", json={"replicas": 0}
    ),
    ("DELETE", "/api/v1/deployments/{name}"): _fresh_deployment,
    ("GET", "/api/v1/usage"): lambda w: Call("/api/v1/usage"),
    ("GET", "/v1/models"): lambda w: Call("/v1/models"),
    ("POST", "/v1/completions"): lambda w: Call(
        "/v1/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 1}, ok=NO_REPLICA
    ),
    ("POST", "/v1/chat/completions"): lambda w: Call(
        "/v1/chat/completions", json=CHAT, ok=NO_REPLICA
    ),
    # the console's routes
    ("POST", "/api/v1/console/session"): lambda w: Call("/api/v1/console/session"),
    ("GET", "/api/v1/console/session"): lambda w: Call("/api/v1/console/session"),
    ("DELETE", "/api/v1/console/session"): lambda w: Call("/api/v1/console/session"),
    ("GET", "/api/v1/queue"): lambda w: Call("/api/v1/queue"),
    ("GET", "/api/v1/cluster"): lambda w: Call("/api/v1/cluster"),
    ("GET", "/api/v1/usage/gpu-hours"): lambda w: Call("/api/v1/usage/gpu-hours"),
    ("GET", "/api/v1/stream"): lambda w: Call("/api/v1/stream"),
}

# ---- every route is declared -----------------------------------------------------------------


def test_every_route_of_the_app_declares_who_may_call_it(world: World) -> None:
    served = route_keys(world.app.routes)
    undeclared = sorted(served - set(ROUTE_ACCESS))
    assert not undeclared, (
        f"routes without an access declaration: {undeclared}; add each to ROUTE_ACCESS in "
        "src/tensoryard/server/access.py (and a request for it to RECIPES here)"
    )
    gone = sorted(set(ROUTE_ACCESS) - served)
    assert not gone, f"ROUTE_ACCESS declares routes the app does not serve: {gone}"
    assert len(served) >= 80


def test_the_matrix_has_a_request_for_every_declared_route() -> None:
    assert sorted(set(ROUTE_ACCESS) - set(RECIPES)) == []
    assert sorted(set(RECIPES) - set(ROUTE_ACCESS)) == []


# ---- every route x every caller --------------------------------------------------------------

CASES = [(route, caller) for route in sorted(ROUTE_ACCESS) for caller in CALLERS]


def _case_id(case: tuple[tuple[str, str], str]) -> str:
    (method, path), caller = case
    who = CALLERS[caller]
    verdict = "may" if _admitted((method, path), who) else "may not"
    return f"{who.words} {verdict} call {method} {path}"


ERROR_SHAPES: dict[str, type[BaseModel]] = {"ErrorOut": ErrorOut, "OpenAIErrorOut": OpenAIErrorOut}


def _documented_error(world: World, method: str, path: str, status: int) -> type[BaseModel]:
    operation = world.app.openapi()["paths"][path][method.lower()]
    schema = operation["responses"][str(status)]["content"]["application/json"]["schema"]
    return ERROR_SHAPES[schema["$ref"].rsplit("/", 1)[-1]]


def _message(shape: type[BaseModel], body: dict[str, Any]) -> str:
    """The refusal's message, checked against the documented shape of the error."""
    if shape is ErrorOut:
        assert set(body) == {"message"}, body
        return str(body["message"])
    parsed = OpenAIErrorOut.model_validate(body)
    assert set(body) == {"error"}, body
    return parsed.error.message


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_each_route_answers_each_caller_as_declared(
    world: World, case: tuple[tuple[str, str], str]
) -> None:
    route, caller = case
    method, path = route
    who = CALLERS[caller]
    call = RECIPES[route](world)
    world.new_audit()
    answer = world.request(method, call, world.tokens.get(caller))
    denied = [a for a in world.new_audit() if a.outcome == "denied"]
    if _admitted(route, who):
        assert answer.status in call.ok, (answer.status, answer.body[:500])
        assert denied == []
        return
    assert answer.status == who.refused_with, (answer.status, answer.body[:500])
    shape = _documented_error(world, method, path, answer.status)
    message = _message(shape, json.loads(answer.body))
    assert message
    if answer.status == 401:
        assert answer.headers["www-authenticate"] == "Bearer"
        assert denied == []
    else:
        assert [a.detail for a in denied] == [message]
