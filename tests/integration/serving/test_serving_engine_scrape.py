"""The engines' own metrics, scraped over HTTP from a pod's address and exported under one
contract (serving/engine_scrape.py). The "pod" is a real HTTP server on loopback serving an
engine's /metrics text (the fixtures of tests/unit/serving/data/engine_metrics, written from the
engines' documented metric lists: no GPU engine runs here); the replica supervisor finds it as a
Ready pod through a recording stand-in for the cluster."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tensoryard.serving.engine_scrape import EngineScraper, engine_version
from tensoryard.serving.kubernetes import ServingPod
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.replicas import ReplicaManager
from tensoryard.store import Store
from tensoryard.store._serving import DeploymentRecord

FIXTURES = Path(__file__).resolve().parents[2] / "unit/serving/data/engine_metrics"


class Engine:
    """An HTTP server answering GET /metrics with `text`."""

    def __init__(self) -> None:
        self.text = ""
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = engine.text.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.server.shutdown()


class Cluster:
    def __init__(self, pods: list[ServingPod]) -> None:
        self.listed = pods

    def ensure(self, dep: DeploymentRecord, replicas: int) -> bool:
        return True

    def pods(self, dep: DeploymentRecord) -> list[ServingPod]:
        return self.listed

    def delete(self, name: str) -> None:
        pass

    def collect(self, keep: Any) -> list[str]:
        return []


def setup(store: Store, tmp_path: Path, port: int, **options: Any) -> ReplicaManager:
    store.ensure_team("default")
    store.create_deployment(
        "llama",
        team="default",
        model_ref="/models/llama",
        model_path="/models/llama",
        engine="vllm",
        replicas=2,
        options={"router": "prefix", **options},
        idle_timeout_s=None,
        created_by="admin",
    )
    pods = [
        ServingPod("pod-a", "127.0.0.1", True, "gpu-1", "Running", 0, None, None, ""),
        ServingPod("pod-b", "127.0.0.2", False, "gpu-2", "Pending", 0, None, None, "starting"),
    ]
    manager = ReplicaManager(
        store,
        log_dir=tmp_path,
        metrics=ServingMetrics(CollectorRegistry()),
        kube=Cluster(pods),  # type: ignore[arg-type]  # the four calls KubeServing has
    )
    manager.reconcile()
    for replica in manager.replicas("llama"):
        replica.port = port  # the test engine's port (pods listen on 8000)
    return manager


def test_a_pods_engine_metrics_are_exported_under_the_contract(
    sqlite_store: Store, tmp_path: Path, engine: Engine
) -> None:
    engine.text = (FIXTURES / "vllm_0.11.prom").read_text()
    manager = setup(sqlite_store, tmp_path, engine.port)
    registry = CollectorRegistry()
    scraper = EngineScraper(manager, registry)
    [scrape] = scraper.scrape_once()  # the ready pod only
    assert scrape.ok and scrape.pod == "pod-a" and scrape.missing == ()
    assert 0.0 <= scrape.values["kv_usage_ratio"] <= 1.0
    exported = generate_latest(registry).decode()
    assert 'tyard_serving_engine_scrape_ok{deployment="llama",pod="pod-a"} 1.0' in exported
    line = next(x for x in exported.splitlines() if x.startswith("tyard_serving_engine_kv_usage"))
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(scrape.values["kv_usage_ratio"])
    assert "tyard_serving_engine_metric_missing{" not in exported


def test_an_engine_that_renamed_a_metric_is_a_named_gap_on_the_dashboard(
    sqlite_store: Store, tmp_path: Path, engine: Engine
) -> None:
    # the deployment says 0.11 (the pinned image) but the pod emits 0.10's names
    engine.text = (FIXTURES / "vllm_0.10.prom").read_text()
    manager = setup(sqlite_store, tmp_path, engine.port)
    registry = CollectorRegistry()
    [scrape] = EngineScraper(manager, registry).scrape_once()
    assert scrape.ok and "itl_seconds (vllm:inter_token_latency_seconds)" in scrape.missing
    exported = generate_latest(registry).decode()
    assert (
        'tyard_serving_engine_metric_missing{deployment="llama",metric="itl_seconds '
        '(vllm:inter_token_latency_seconds)",pod="pod-a"} 1.0'
    ) in exported
    # with the image that really emits those names, nothing is missing
    sqlite_store.delete_deployment("llama")
    manager = setup(sqlite_store, tmp_path, engine.port, image="vllm/vllm-openai:v0.10.2")
    [scrape] = EngineScraper(manager).scrape_once()
    assert scrape.ok and scrape.missing == ()


def test_a_pod_that_does_not_answer_is_scrape_ok_0(
    sqlite_store: Store, tmp_path: Path, engine: Engine
) -> None:
    manager = setup(sqlite_store, tmp_path, engine.port)
    engine.server.shutdown()
    engine.server.server_close()
    registry = CollectorRegistry()
    [scrape] = EngineScraper(manager, registry, timeout_s=1).scrape_once()
    assert not scrape.ok and "/metrics" in scrape.error
    assert 'tyard_serving_engine_scrape_ok{deployment="llama",pod="pod-a"} 0.0' in (
        generate_latest(registry).decode()
    )


def test_the_engine_version_is_the_image_tags() -> None:
    def dep(engine: str, **options: Any) -> DeploymentRecord:
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        return DeploymentRecord("d", "t", "m", "m", engine, 1, options, None, "a", now, now)

    assert engine_version(dep("vllm")) == "0.11.0"
    assert engine_version(dep("sglang")) == "0.5.3"
    assert engine_version(dep("vllm", image="registry.local/vllm-openai:v0.10.2-cu128")) == "0.10.2"
    assert engine_version(dep("vllm", image="vllm/vllm-openai@sha256:" + "a" * 64)) == "0.11.0"
