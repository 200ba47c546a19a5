"""The DCGM-exporter join (deploy/prometheus/rules/k8s.yml) on a real Prometheus.

Two GPU nodes run the DCGM exporter (``tensoryard.observability.fake_dcgm_exporter``: its
exposition in Kubernetes mode, from recorded NVML readings of an 8 x H100 node), and the control
plane serves ``tyard_k8s_pod_info`` from its pod watch (the real PodCollector). Node A is scraped
with honor_labels (our prometheus.yml, `tyard cluster plan`'s GPU Operator values); node B the
way a ServiceMonitor without honorLabels scrapes it (the exporter's own pod in pod/namespace,
the workload's as exported_pod/exported_namespace). The recording rules must give every GPU a
platform pod holds its job, team and rank, with the exporter's value, on both nodes, and drop
idle GPUs and GPUs of pods that are not the platform's."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from tests.integration.observability.prometheus_server import PROMETHEUS, running_prometheus

from tensoryard.agent.fake_nvml import FakeNvml
from tensoryard.executors.kubernetes.pod_metrics import PodCollector
from tensoryard.observability.fake_dcgm_exporter import PodGpu, render_dcgm_exporter

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "unit" / "observability" / "fixtures"
RULES = ROOT / "deploy" / "prometheus" / "rules"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"
    ),
]


def _nvml() -> FakeNvml:
    doc = json.loads((FIXTURES / "nvml_h100x8.json").read_text(encoding="utf-8"))
    return FakeNvml.from_records(doc["gpus"])


def _pod(name: str, rank: int, node: str) -> Mapping[str, Any]:
    """A platform pod as the executor's watch cache holds it (job 7 of team nlp)."""
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {
                "tensoryard.io/job-id": "7",
                "tensoryard.io/team": "nlp",
                "tensoryard.io/attempt": "1",
                "tensoryard.io/attempt-key": "k-7",
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)},
        },
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "img:1"}]},
        "status": {"phase": "Running"},
    }


@pytest.fixture
def endpoints() -> Iterator[dict[str, int]]:
    """/metrics of the control plane and of the DCGM exporters of nodes gpu-a and gpu-b."""
    pod_a, pod_b = "ty-7-1-node-0-0-abcde", "ty-7-1-node-1-0-fghij"
    pods: list[Mapping[str, Any]] = [_pod(pod_a, 0, "gpu-a"), _pod(pod_b, 1, "gpu-b")]
    control = CollectorRegistry()
    control.register(PodCollector(lambda: pods))
    node_a, node_b = _nvml(), _nvml()
    bodies: dict[str, Callable[[], bytes]] = {
        "control": lambda: generate_latest(control),
        "gpu-a": lambda: render_dcgm_exporter(
            node_a, hostname="gpu-a", pods={i: PodGpu("ml", pod_a, "trainer") for i in range(4)}
        ),
        "gpu-b": lambda: render_dcgm_exporter(
            node_b,
            hostname="gpu-b",
            pods={
                **{i: PodGpu("ml", pod_b, "trainer") for i in range(4)},
                4: PodGpu("research", "notebook-1", "main"),  # not a platform pod
            },
        ),
    }
    servers = []
    ports: dict[str, int] = {}
    for name, body in bodies.items():

        class Handler(BaseHTTPRequestHandler):
            render = staticmethod(body)

            def do_GET(self) -> None:
                data = self.render()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        ports[name] = server.server_address[1]
    yield ports
    for server in servers:
        server.shutdown()


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=5) as r:
        return list(json.loads(r.read())["data"]["result"])


def test_dcgm_series_join_to_jobs_with_and_without_honor_labels(
    endpoints: dict[str, int], tmp_path: Path
) -> None:
    assert PROMETHEUS is not None
    config = (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}/*.yml']\n"
        "scrape_configs:\n"
        "  - job_name: tensoryard-control-plane\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{endpoints['control']}']}}]\n"
        "  - job_name: dcgm-exporter\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{endpoints['gpu-a']}']}}]\n"
        # what a ServiceMonitor's Kubernetes discovery attaches to the target, honorLabels off
        "  - job_name: nvidia-dcgm-exporter\n    honor_labels: false\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{endpoints['gpu-b']}'], labels: "
        "{namespace: gpu-operator, pod: nvidia-dcgm-exporter-x1, "
        "container: nvidia-dcgm-exporter}}]\n"
    )
    with running_prometheus(config, tmp_path) as prometheus:
        base = prometheus.base
        joined: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(joined) < 8:
            prometheus.assert_alive()
            assert time.monotonic() < deadline, f"join incomplete: {joined}"
            time.sleep(0.5)
            try:
                joined = _query(base, "tyard:DCGM_FI_DEV_GPU_UTIL:by_job")
            except OSError:
                continue
        raw = {
            (s["metric"]["Hostname"], s["metric"]["gpu"]): float(s["value"][1])
            for s in _query(base, "DCGM_FI_DEV_GPU_UTIL")
        }
        # node B's series really came in the ServiceMonitor shape (not joinable on pod as is)
        shapes = _query(base, 'DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-b",gpu="0"}')
        assert [s["metric"]["pod"] for s in shapes] == ["nvidia-dcgm-exporter-x1"]
        assert shapes[0]["metric"]["exported_pod"] == "ty-7-1-node-1-0-fghij"

        got = {
            (
                s["metric"]["Hostname"],
                s["metric"]["gpu"],
                s["metric"]["job"],
                s["metric"]["team"],
                s["metric"]["rank"],
                s["metric"]["pod"],
            ): float(s["value"][1])
            for s in joined
        }
        expected = {
            (host, str(gpu), "7", "nlp", rank, pod): raw[(host, str(gpu))]
            for host, rank, pod in (
                ("gpu-a", "0", "ty-7-1-node-0-0-abcde"),
                ("gpu-b", "1", "ty-7-1-node-1-0-fghij"),
            )
            for gpu in range(4)
        }
        assert got == expected  # idle GPUs and the notebook's GPU 4 on gpu-b dropped out
        assert len(raw) == 16  # every GPU was scraped, joined or not
        per_job = _query(base, "sum by (job, team) (tyard:DCGM_FI_DEV_FB_USED:by_job)")
        assert [(s["metric"]["job"], s["metric"]["team"]) for s in per_job] == [("7", "nlp")]
