"""Registry webhooks against a real HTTP receiver on loopback: signature, retries with backoff,
no retry on a 4xx, and events from the API after a registration and an alias move."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.registry.webhooks import WebhookConfig, WebhookNotifier, verify
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import build_control_plane

SECRET = "s3cret"


@dataclass
class Receiver:
    url: str
    answers: list[int] = field(default_factory=list)  # status per request; then 204
    seen: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    got: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.seen.append((dict(self.headers), body))
            status = state.answers.pop(0) if state.answers else 204
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if status < 300:
                state.got.set()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    thread.join(timeout=5)


def test_a_failing_receiver_gets_signed_retries_with_backoff_until_it_answers(
    receiver: Receiver,
) -> None:
    receiver.answers = [503, 500]
    waits: list[float] = []
    notifier = WebhookNotifier(
        [WebhookConfig(url=receiver.url, secret=SECRET, backoff_s=0.5)], sleep=waits.append
    )

    (future,) = notifier.emit("model.alias.moved", {"alias": "production", "version": 2})
    delivery = future.result(timeout=10)
    notifier.close()

    assert delivery.ok and delivery.attempts == 3 and delivery.status == 204
    assert waits == [0.5, 1.0]
    ids = {headers["X-Tyard-Delivery"] for headers, _ in receiver.seen}
    assert ids == {delivery.delivery_id}  # one id across retries: receivers de-duplicate
    for headers, body in receiver.seen:
        assert verify(SECRET, body, headers["X-Tyard-Timestamp"], headers["X-Tyard-Signature"])
        assert not verify("wrong", body, headers["X-Tyard-Timestamp"], headers["X-Tyard-Signature"])
    assert json.loads(receiver.seen[0][1])["data"] == {"alias": "production", "version": 2}


def test_a_4xx_answer_is_final_and_a_dead_receiver_gives_up_after_the_retries(
    receiver: Receiver,
) -> None:
    receiver.answers = [410]
    dead = "http://127.0.0.1:9/hook"  # discard port: nothing listens
    notifier = WebhookNotifier(
        [
            WebhookConfig(url=receiver.url, secret=SECRET),
            WebhookConfig(url=dead, secret=SECRET, retries=2, timeout_s=2),
        ],
        sleep=lambda _: None,
    )

    gone, unreachable = (f.result(timeout=30) for f in notifier.emit("model.alias.deleted", {}))
    notifier.close()

    assert (gone.ok, gone.attempts, gone.status) == (False, 1, 410)
    assert (unreachable.ok, unreachable.attempts, unreachable.status) == (False, 3, None)
    assert "ConnectError" in unreachable.error


def test_the_api_sends_an_event_after_a_registration_commits(
    receiver: Receiver, tmp_path: Path, migrated_sqlite_url: str
) -> None:
    hook = WebhookConfig(url=receiver.url, secret=SECRET, events=("model.version.created",))
    config = ServerConfig(home=tmp_path / "home", db_url=migrated_sqlite_url, webhooks=(hook,))
    plane = build_control_plane(config)
    plane.store.ensure_team("nlp")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.bin").write_bytes(b"a" * 5000)
    digest = ArtifactStore(open_blobs(config.artifact_store_url)).push(tmp_path / "w")
    with TestClient(plane.app()) as client:
        client.headers["Authorization"] = f"Bearer {plane.admin_token}"
        answer = client.post(
            "/api/v1/models/nlp/m/versions", json={"artifact": digest.manifest.digest}
        )
        client.put("/api/v1/models/nlp/m/aliases/production", json={"version": 1})
    plane.store.close()

    assert answer.status_code == 201, answer.text
    assert receiver.got.wait(10)
    events = [headers["X-Tyard-Event"] for headers, _ in receiver.seen]
    assert events == ["model.version.created"]  # the hook did not ask for alias moves
    data = json.loads(receiver.seen[0][1])["data"]
    assert (data["team"], data["model"], data["version"]) == ("nlp", "m", 1)
