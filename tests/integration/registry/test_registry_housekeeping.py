"""The leader's scheduled upkeep on a real store (SQLite and PostgreSQL) and a real artifact
store: artifact GC every interval (registered versions kept, unreferenced chunks freed, a pass
found in the audit log, manual or from another replica, not repeated early), delivered
webhook rows pruned after the keep period; and `tyard server --webhooks FILE` end to end."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from tests.e2e.conftest import ServerProcess, free_port

from tensoryard.registry import ArtifactConfig, ArtifactStore, open_blobs
from tensoryard.registry.webhooks import verify
from tensoryard.server.housekeeping import GC_ACTION, Housekeeper, HousekeepingMetrics
from tensoryard.store import Store
from tensoryard.store.records import AuditContext

HOUR = 3600.0


def _push(artifacts: ArtifactStore, tmp_path: Path, name: str, content: bytes) -> str:
    src = tmp_path / name
    src.write_bytes(content)
    return artifacts.push(src).manifest.digest


def _chunks(artifacts: ArtifactStore) -> set[str]:
    return {b.key for b in artifacts.blobs.list("chunks/")}


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def test_the_leader_collects_garbage_every_interval_keeping_registered_versions(
    store: Store, tmp_path: Path
) -> None:
    store.ensure_team("nlp")
    artifacts = ArtifactStore(
        open_blobs(str(tmp_path / "artifacts")), config=ArtifactConfig(gc_grace_s=0)
    )
    kept = _push(artifacts, tmp_path, "kept.bin", os.urandom(300_000))
    store.register_version("nlp", "m", artifact=kept, size_bytes=300_000, created_by="mo")
    kept_chunks = _chunks(artifacts)
    _push(artifacts, tmp_path, "orphan.bin", os.urandom(200_000))  # pushed, never registered
    assert len(_chunks(artifacts)) > len(kept_chunks)

    leader = False
    clock = Clock()
    registry = CollectorRegistry()
    keeper = Housekeeper(
        store,
        artifacts,
        is_leader=lambda: leader,
        metrics=HousekeepingMetrics(registry),
        artifact_gc_interval_s=6 * HOUR,
        webhook_keep_s=None,
        clock=clock,
    )
    keeper.tick()  # not the leader: nothing runs
    assert store.list_audit(action=GC_ACTION) == []

    leader = True
    keeper.tick()  # first pass: the orphan's manifest goes, its chunks are condemned
    (first,) = store.list_audit(action=GC_ACTION)
    assert first.actor == "system" and first.detail.startswith("scheduled: freed 0 chunks")
    keeper.tick()  # within the interval (read back from the audit log): no second pass
    assert len(store.list_audit(action=GC_ACTION)) == 1

    clock.now += timedelta(hours=7)
    keeper.tick()  # due again: the condemned chunks are freed, the registered ones stay
    second = store.list_audit(action=GC_ACTION)[-1]
    assert "freed 0 chunks" not in second.detail, second.detail
    assert _chunks(artifacts) == kept_chunks
    assert artifacts.verify(kept).total_bytes == 300_000
    freed = registry.get_sample_value("tyard_artifact_gc_freed_bytes_total")
    assert freed is not None and freed >= 200_000
    assert registry.get_sample_value("tyard_artifact_gc_runs_total", {"outcome": "ok"}) == 2

    # a manual pass (`tyard models gc`, audited by the API) counts as the last one too
    store.record_audit(AuditContext(actor="admin"), GC_ACTION, "artifacts", detail="manual")
    clock.now += timedelta(hours=7)
    fresh = Housekeeper(  # a restarted control plane: no memory but the audit log
        store,
        artifacts,
        is_leader=lambda: True,
        metrics=HousekeepingMetrics(CollectorRegistry()),
        artifact_gc_interval_s=6 * HOUR,
        webhook_keep_s=None,
    )
    fresh.tick()
    assert store.list_audit(action=GC_ACTION)[-1].detail == "manual"


def test_a_failed_pass_is_audited_and_counted_and_the_next_interval_retries(
    store: Store, tmp_path: Path
) -> None:
    class Broken(ArtifactStore):
        def gc(self, keep: object, *, dry_run: bool = False) -> object:  # type: ignore[override]
            raise OSError("disk on fire")

    registry = CollectorRegistry()
    keeper = Housekeeper(
        store,
        Broken(open_blobs(str(tmp_path / "a"))),
        is_leader=lambda: True,
        metrics=HousekeepingMetrics(registry),
        artifact_gc_interval_s=HOUR,
        webhook_keep_s=None,
    )
    keeper.tick()
    (row,) = store.list_audit(action=GC_ACTION)
    assert (row.outcome, row.detail) == ("error", "scheduled: disk on fire")
    assert registry.get_sample_value("tyard_artifact_gc_runs_total", {"outcome": "error"}) == 1


def test_delivered_webhook_rows_are_pruned_after_the_keep_period_and_others_stay(
    store: Store, tmp_path: Path
) -> None:
    store.ensure_team("nlp")
    store.route_webhooks([("http://a.example/h", ["model.version.created"])])
    for _ in range(3):
        store.register_version("nlp", "m", artifact="ab" * 32, size_bytes=1, created_by="mo")
    rows = store.claim_webhook_deliveries("cp", limit=10, lease_s=60)
    assert len(rows) == 3
    store.finish_webhook_delivery(rows[0].id, "cp", "delivered", status=204)
    store.finish_webhook_delivery(rows[1].id, "cp", "failed", status=410)
    # rows[2] stays pending (claimed)

    assert store.prune_webhook_deliveries(HOUR) == 0  # delivered just now: kept
    registry = CollectorRegistry()
    keeper = Housekeeper(
        store,
        ArtifactStore(open_blobs(str(tmp_path / "a"))),
        is_leader=lambda: True,
        metrics=HousekeepingMetrics(registry),
        artifact_gc_interval_s=None,
        webhook_keep_s=0.0,
    )
    time.sleep(0.05)
    keeper.tick()
    left = {r.id: r.status for r in store.list_webhook_deliveries()}
    assert left == {rows[1].id: "failed", rows[2].id: "pending"}
    assert registry.get_sample_value("tyard_webhook_deliveries_pruned_total") == 1


# -- `tyard server --webhooks FILE` --------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    got: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    server.shutdown()
    thread.join(timeout=5)


@pytest.mark.slow
def test_tyard_server_sends_registry_events_to_the_receivers_of_its_webhooks_file(
    receiver: tuple[str, list[tuple[dict[str, str], bytes]]], tmp_path: Path
) -> None:
    url, got = receiver
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(f"webhooks:\n  - url: {url}\n    secret_env: TEST_HOOK_SECRET\n")
    home = tmp_path / "home"
    home.mkdir()
    server = ServerProcess(
        home=home,
        port=free_port(),
        extra_args=["--cpu-slots", "1", "--webhooks", str(hooks)],
        env={"TEST_HOOK_SECRET": "from-env", "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    client = server.start()
    try:
        artifacts = ArtifactStore(open_blobs(str(home / "artifacts")))
        digest = _push(artifacts, tmp_path, "w.bin", b"w" * 5000)
        with client:
            client.register_version("default", "m", artifact=digest)
        deadline = time.monotonic() + 30
        while not got:
            assert time.monotonic() < deadline, "no webhook arrived"
            time.sleep(0.05)
    finally:
        server.stop()
    headers, body = got[0]
    assert headers["X-Tyard-Event"] == "model.version.created"
    assert verify("from-env", body, headers["X-Tyard-Timestamp"], headers["X-Tyard-Signature"])
