"""Registry webhooks from the durable outbox to a real HTTP receiver on loopback.

The receiver verifies every signature with ``verify`` and de-duplicates by delivery id, as a
real one should; it can fail its first N requests. Covered: retries with growing backoff until
it answers, two control planes sending from one database without sending anything twice, a 4xx
that dead-letters a delivery and its redelivery, and events from the REST API.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli
from tensoryard.client import Client
from tensoryard.errors import ClientError
from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.registry.webhooks import WebhookConfig, WebhookDispatcher, backoff_s, verify
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import build_control_plane
from tensoryard.store import Store

SECRET = "s3cret"
DIGEST = "cd" * 32


@dataclass
class Receiver:
    """A webhook receiver: checks the signature, answers `answers` first (then 204), and
    processes each delivery id once (`processed`), as receivers are told to."""

    url: str = ""
    answers: list[int] = field(default_factory=list)
    requests: list[tuple[float, dict[str, str], bytes]] = field(default_factory=list)
    processed: dict[str, dict[str, Any]] = field(default_factory=dict)
    duplicates: int = 0
    bad_signatures: int = 0
    delay_s: float = 0.0  # how long each answer takes (a receiver doing real work)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        if self.delay_s:
            time.sleep(self.delay_s)
        with self.lock:
            self.requests.append((time.monotonic(), headers, body))
            ok = verify(SECRET, body, headers["X-Tyard-Timestamp"], headers["X-Tyard-Signature"])
            if not ok:
                self.bad_signatures += 1
                return 401
            status = self.answers.pop(0) if self.answers else 204
            if status < 300:
                delivery = headers["X-Tyard-Delivery"]
                if delivery in self.processed:
                    self.duplicates += 1
                else:
                    self.processed[delivery] = json.loads(body)
            return status


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = state.handle(dict(self.headers), body)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    thread.join(timeout=5)


def _wait(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _register(store: Store, n: int = 1) -> None:
    for _ in range(n):
        store.register_version("nlp", "m", artifact=DIGEST, size_bytes=1, created_by="mo")


def test_a_failing_receiver_gets_signed_retries_with_growing_backoff_until_it_answers(
    receiver: Receiver, store: Store
) -> None:
    store.ensure_team("nlp")
    receiver.answers = [503, 500, 429]
    hook = WebhookConfig(url=receiver.url, secret=SECRET, backoff_s=0.2, retries=5)
    plane = WebhookDispatcher(store, [hook], owner="cp-1", poll_s=0.02)
    _register(store)
    plane.start()
    try:
        _wait("the delivery", lambda: bool(receiver.processed))
    finally:
        plane.stop()

    (row,) = store.list_webhook_deliveries()
    assert (row.status, row.attempts, row.last_status) == ("delivered", 4, 204)
    assert [h["X-Tyard-Delivery"] for _, h, _ in receiver.requests] == [row.delivery_id] * 4
    assert receiver.bad_signatures == 0 and receiver.duplicates == 0
    gaps = [b[0] - a[0] for a, b in zip(receiver.requests, receiver.requests[1:], strict=False)]
    for n, gap in enumerate(gaps, start=1):  # equal jitter: at least half the full backoff
        assert gap >= 0.2 * 2 ** (n - 1) / 2 - 0.01, gaps
    body = receiver.processed[row.delivery_id]
    assert body["event"] == "model.version.created" and body["event_id"] == row.event_id
    assert (body["data"]["team"], body["data"]["model"], body["data"]["version"]) == ("nlp", "m", 1)


def test_two_control_planes_on_one_database_send_each_delivery_once(
    receiver: Receiver, store: Store
) -> None:
    store.ensure_team("nlp")
    receiver.answers = [503] * 6  # the first six requests fail, whoever sends them
    # Each answer takes 50 ms, so one plane's two workers need >= 0.65 s for all 26 requests:
    # the other plane gets its share even when this 2-core machine starts its threads late (a
    # CI run once saw one plane send everything with instant answers).
    receiver.delay_s = 0.05
    hook = WebhookConfig(url=receiver.url, secret=SECRET, backoff_s=0.05)
    other = Store.open(store.url, migrate=False)  # a second control plane's own connections
    planes = [
        WebhookDispatcher(db, [hook], owner=f"cp-{i}", poll_s=0.01, batch=2, workers=2)
        for i, db in enumerate((store, other))
    ]
    for plane in planes:
        plane.start()
    try:
        _register(store, 20)
        _wait("20 deliveries", lambda: len(receiver.processed) == 20)
    finally:
        for plane in planes:
            plane.stop()
        other.close()

    assert receiver.duplicates == 0  # no delivery id was accepted twice
    assert all(plane.attempts > 0 for plane in planes)  # both sent some
    sent = Counter(h["X-Tyard-Delivery"] for _, h, _ in receiver.requests)
    assert len(sent) == 20 and sum(sent.values()) == 26  # 20 successes + the 6 failures
    rows = store.list_webhook_deliveries(limit=100)
    assert {r.status for r in rows} == {"delivered"}
    assert sum(r.attempts for r in rows) == 26
    versions = sorted(b["data"]["version"] for b in receiver.processed.values())
    assert versions == list(range(1, 21))


def test_a_4xx_dead_letters_the_delivery_and_a_redelivery_sends_it_again(
    receiver: Receiver, store: Store
) -> None:
    store.ensure_team("nlp")
    receiver.answers = [410]
    dead = "http://127.0.0.1:9/hook"  # discard port: nothing listens
    hooks = [
        WebhookConfig(url=receiver.url, secret=SECRET, backoff_s=0.01),
        WebhookConfig(url=dead, secret=SECRET, retries=2, backoff_s=0.01, timeout_s=2),
    ]
    plane = WebhookDispatcher(store, hooks, owner="cp-1", poll_s=0.01)
    _register(store)
    for _ in range(50):
        plane.run_once()
        if len(store.list_webhook_deliveries(status="failed")) == 2:
            break
        time.sleep(0.02)

    gone, unreachable = sorted(
        store.list_webhook_deliveries(status="failed"), key=lambda r: r.hook_url != receiver.url
    )
    assert (gone.attempts, gone.last_status, gone.last_error) == (1, 410, "HTTP 410 (not retried)")
    assert (unreachable.attempts, unreachable.last_status) == (3, None)
    assert "ConnectError" in unreachable.last_error
    assert receiver.processed == {}

    store.redeliver_webhook(gone.id)
    plane.run_once()
    plane.stop()
    assert store.get_webhook_delivery(gone.id).status == "delivered"
    assert list(receiver.processed) == [gone.delivery_id]


def test_a_delivery_for_a_receiver_no_longer_configured_fails_with_the_fix(
    receiver: Receiver, store: Store
) -> None:
    store.ensure_team("nlp")
    WebhookDispatcher(store, [WebhookConfig(url=receiver.url, secret=SECRET)], owner="old").stop()
    _register(store)  # routed to receiver.url
    plane = WebhookDispatcher(store, [], owner="new")  # restarted without that hook
    plane.run_once()
    plane.stop()

    (row,) = store.list_webhook_deliveries()
    assert row.status == "failed" and "configure it again and redeliver" in row.last_error
    assert receiver.requests == []


def test_backoff_doubles_with_half_of_it_jittered_and_stops_at_the_cap() -> None:
    hook = WebhookConfig(url="http://h/x", secret="s", backoff_s=1.0, max_backoff_s=10.0)
    rng = random.Random(0)
    for attempts, full in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (30, 10.0)):
        waits = [backoff_s(hook, attempts, rng) for _ in range(200)]
        assert full / 2 <= min(waits) and max(waits) <= full
        assert max(waits) - min(waits) > full / 4  # jittered, not a constant


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"url": "ftp://h/x"}, "is not http"),
        ({"secret": ""}, "empty secret"),
        ({"events": ("model.deleted",)}, "unknown events"),
        ({"retries": -1}, "retries and backoff_s"),
    ],
    ids=["a non-http url", "an empty secret", "an unknown event", "negative retries"],
)
def test_a_bad_webhook_config_is_refused_with_the_fix(fields: dict[str, Any], message: str) -> None:
    from tensoryard.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        WebhookConfig(**{"url": "http://h/x", "secret": "s", **fields})


def test_the_api_writes_events_with_the_change_and_admins_see_the_outbox(
    receiver: Receiver, tmp_path: Path, migrated_sqlite_url: str
) -> None:
    hook = WebhookConfig(
        url=receiver.url,
        secret=SECRET,
        events=("model.version.created", "model.alias.moved"),
        backoff_s=0.05,
    )
    config = ServerConfig(home=tmp_path / "home", db_url=migrated_sqlite_url, webhooks=(hook,))
    plane = build_control_plane(config)
    assert plane.webhooks is not None
    plane.store.ensure_team("nlp")
    plane.store.create_user("mo")
    plane.store.set_member("nlp", "mo", "member")
    member = plane.store.create_token("mo").token
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.bin").write_bytes(b"a" * 5000)
    digest = ArtifactStore(open_blobs(config.artifact_store_url)).push(tmp_path / "w")
    plane.webhooks.start()
    try:
        with TestClient(plane.app()) as client:
            admin = {"Authorization": f"Bearer {plane.admin_token}"}
            as_mo = {"Authorization": f"Bearer {member}"}
            path = "/api/v1/models/nlp/m"
            answer = client.post(
                f"{path}/versions", json={"artifact": digest.manifest.digest}, headers=as_mo
            )
            client.put(f"{path}/aliases/production", json={"version": 1}, headers=as_mo)
            client.delete(f"{path}/aliases/production", headers=as_mo)  # not subscribed
            _wait("two deliveries", lambda: len(receiver.processed) == 2)
            listed = client.get("/api/v1/webhook-deliveries", headers=admin)
            refused = client.get("/api/v1/webhook-deliveries", headers=as_mo)
            one = client.get(f"/api/v1/webhook-deliveries/{listed.json()[0]['id']}", headers=admin)
            busy = client.post(
                f"/api/v1/webhook-deliveries/{listed.json()[0]['id']}/redeliver", headers=admin
            )
            bad = client.get("/api/v1/webhook-deliveries?status=lost", headers=admin)
    finally:
        plane.webhooks.stop()
        plane.store.close()

    assert answer.status_code == 201, answer.text
    events = [h["X-Tyard-Event"] for _, h, _ in receiver.requests]
    assert events == ["model.version.created", "model.alias.moved"]
    assert listed.status_code == 200
    assert [(d["event"], d["status"]) for d in listed.json()] == [
        ("model.alias.moved", "delivered"),
        ("model.version.created", "delivered"),
    ]
    assert refused.status_code == 403 and "platform admins" in refused.json()["message"]
    assert one.json()["payload"] == {
        "team": "nlp",
        "model": "m",
        "alias": "production",
        "version": 1,
    }
    assert busy.status_code == 409 and "only failed ones" in busy.json()["message"]
    assert bad.status_code == 422


SERVE = """
import sys
from pathlib import Path
from tensoryard.registry.webhooks import WebhookConfig
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import run_server

home, port, url = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
hook = WebhookConfig(url=url, secret="s3cret", backoff_s=0.2, max_backoff_s=0.5, retries=10000)
run_server(ServerConfig(home=home, port=port, cpu_slots=1, webhooks=(hook,)), log_level="warning")
"""


def _serve(home: Path, port: int, url: str) -> subprocess.Popen[bytes]:
    """A real control plane (run_server: API, loops, delivery loop) in its own process."""
    log = (home / "server.out").open("ab")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(home), str(port), url],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    probe = Client(f"http://127.0.0.1:{port}", None, timeout=2)
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, (home / "server.out").read_text()[-3000:]
        assert time.monotonic() < deadline, "the control plane did not start"
        try:
            probe.healthz()
            break
        except ClientError:
            time.sleep(0.2)
    probe.close()
    return proc


@pytest.mark.slow
def test_an_event_not_yet_delivered_when_the_control_plane_is_killed_is_sent_after_restart(
    receiver: Receiver, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    receiver.answers = [503] * 1_000_000  # down for the whole first run
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.bin").write_bytes(b"w" * 5000)
    digest = ArtifactStore(open_blobs(str(home / "artifacts"))).push(tmp_path / "w")
    server = _serve(home, port, receiver.url)
    try:
        with Client(f"http://127.0.0.1:{port}", (home / "admin.token").read_text().strip()) as c:
            c.register_version("default", "m", artifact=digest.manifest.digest)
        _wait("a first failed attempt", lambda: len(receiver.requests) >= 2)
        server.kill()  # SIGKILL: no shutdown code runs
        server.wait()
        before = len(receiver.requests)
        assert receiver.processed == {}

        receiver.answers = []  # the receiver is back
        server = _serve(home, port, receiver.url)
        _wait("the delivery after the restart", lambda: len(receiver.processed) == 1)
    finally:
        server.kill()
        server.wait()

    ids = {h["X-Tyard-Delivery"] for _, h, _ in receiver.requests}
    assert len(ids) == 1 and before >= 2  # the same delivery, tried before and after
    (body,) = receiver.processed.values()
    assert body["event"] == "model.version.created" and body["data"]["model"] == "m"
    assert receiver.bad_signatures == 0 and receiver.duplicates == 0
    with Store.open(f"sqlite:///{home / 'tensoryard.db'}", migrate=False) as store:
        (row,) = store.list_webhook_deliveries()
    # the attempt is counted when claimed, before the POST: a kill in between counts one more
    assert row.status == "delivered"
    assert len(receiver.requests) <= row.attempts <= len(receiver.requests) + 1


def test_an_admin_lists_failed_deliveries_and_redelivers_one_from_the_cli(
    receiver: Receiver, tmp_path: Path, migrated_sqlite_url: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    receiver.answers = [400]  # a bad answer: final, dead-lettered
    hook = WebhookConfig(url=receiver.url, secret=SECRET)
    config = ServerConfig(
        home=tmp_path / "home", db_url=migrated_sqlite_url, port=port, webhooks=(hook,)
    )
    plane = build_control_plane(config)
    assert plane.webhooks is not None
    plane.store.ensure_team("nlp")
    _register(plane.store)
    plane.webhooks.start()  # sends it once: 400, dead-lettered
    _wait("the dead letter", lambda: bool(plane.store.list_webhook_deliveries(status="failed")))
    server = uvicorn.Server(uvicorn.Config(plane.app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait("uvicorn", lambda: server.started)
    env = {"TYARD_SERVER": f"http://127.0.0.1:{port}", "TYARD_TOKEN": plane.admin_token}
    try:
        failed = CliRunner().invoke(
            cli, ["models", "webhooks", "deliveries", "--failed", "--json"], env=env
        )
        wide = {**env, "COLUMNS": "250"}
        table = CliRunner().invoke(cli, ["models", "webhooks", "deliveries"], env=wide)
        row_id = json.loads(failed.stdout)[0]["id"]
        again = CliRunner().invoke(cli, ["models", "webhooks", "redeliver", str(row_id)], env=env)
        _wait("the redelivery", lambda: len(receiver.processed) == 1)
        twice = CliRunner().invoke(cli, ["models", "webhooks", "redeliver", str(row_id)], env=env)
        missing = CliRunner().invoke(cli, ["models", "webhooks", "redeliver", "999"], env=env)
        audit = plane.store.list_audit(action="webhook.")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        plane.webhooks.stop()
        plane.store.close()

    assert failed.exit_code == 0, failed.output
    (dead,) = json.loads(failed.stdout)
    assert (dead["status"], dead["last_status"], dead["attempts"]) == ("failed", 400, 1)
    assert "HTTP 400 (not retried)" in table.stdout and "failed" in table.stdout
    assert again.exit_code == 0 and "queued" in again.stdout, again.output
    assert twice.exit_code != 0 and "was delivered" in twice.output
    assert missing.exit_code != 0 and "does not exist" in missing.output
    assert [(a.actor, a.action, a.object) for a in audit] == [
        ("admin", "webhook.redeliver", f"webhook-delivery/{row_id}")
    ]
