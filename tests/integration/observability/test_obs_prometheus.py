"""The node agent's exposition scraped by a real Prometheus evaluating deploy/prometheus/rules:
a fatal XID injected into the fake NVML fires GpuFatalXid, the recorded faults fire theirs, and
healthy GPUs and ports stay quiet. Also: promtool parses the exposition."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from tests.integration.observability.prometheus_server import running_prometheus

from tensoryard.agent.fake_nvml import FakeNvml
from tensoryard.observability import (
    CollectorErrors,
    GpuCollector,
    InfinibandCollector,
    agent_registry,
)
from tensoryard.observability.registry import render

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "unit" / "observability" / "fixtures"
RULES = ROOT / "deploy" / "prometheus" / "rules"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _nvml() -> FakeNvml:
    doc = json.loads((FIXTURES / "nvml_h100x8.json").read_text(encoding="utf-8"))
    return FakeNvml.from_records(doc["gpus"])


@pytest.fixture
def agent() -> Iterator[tuple[int, FakeNvml]]:
    """The agent's exposition (8 fake GPUs, 8 recorded IB ports) over HTTP on loopback."""
    nvml = _nvml()
    errors = CollectorErrors()
    registry = agent_registry(
        [
            InfinibandCollector(FIXTURES / "sys", errors=errors),
            GpuCollector(nvml, hostname=lambda: "node7", errors=errors),
            errors,
        ]
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", _free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], nvml
    server.shutdown()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _alerts(base: str) -> list[dict[str, Any]]:
    return list(_get(f"{base}/api/v1/alerts")["data"]["alerts"])


def _wait(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"
)
def test_prometheus_fires_the_rules_on_the_agents_metrics(
    agent: tuple[int, FakeNvml], tmp_path: Path
) -> None:
    port, nvml = agent
    config = (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}/*.yml']\n"
        "scrape_configs:\n"
        "  - job_name: tensoryard-agent\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    with running_prometheus(config, tmp_path) as prometheus:
        base = prometheus.base
        query = urllib.parse.quote('tyard_gpu_xid_errors_total{gpu="3",xid="79"}')
        _wait(
            "two scrapes of XID counters at 0",
            lambda: (
                len(_get(f"{base}/api/v1/query?query={query}[10s]")["data"]["result"])
                and len(
                    _get(f"{base}/api/v1/query?query={query}[10s]")["data"]["result"][0]["values"]
                )
                >= 2
            ),
        )
        nvml.gpus[3].xid_events.append(79)

        def fired() -> list[dict[str, Any]]:
            return [
                a
                for a in _alerts(base)
                if a["labels"]["alertname"] == "GpuFatalXid" and a["state"] == "firing"
            ]

        xid = _wait("GpuFatalXid to fire", fired)
        assert [(a["labels"]["gpu"], a["labels"]["xid"]) for a in xid] == [("3", "79")]
        alerts = _alerts(base)
        firing = {
            (a["labels"]["alertname"], a["labels"].get("gpu", a["labels"].get("device")))
            for a in alerts
            if a["state"] == "firing"
        }
        pending = {
            (a["labels"]["alertname"], a["labels"].get("device"))
            for a in alerts
            if a["state"] == "pending"
        }
        assert ("GpuRowRemapFailure", "5") in firing  # recorded: GPU 5's row remap failed
        assert not {g for name, g in firing if name == "GpuRowRemapFailure"} - {"5"}
        assert ("InfinibandPortDown", "mlx5_3") in pending  # for: 2m
        assert not {d for name, d in pending if name == "InfinibandPortDown"} - {"mlx5_3"}
        assert ("GpuThermalOrPowerSlowdown", "6") not in firing  # for: 5m, not yet
        # honor_labels: an unowned GPU's empty job label stays empty, not the scrape job's name
        util = urllib.parse.quote('DCGM_FI_DEV_GPU_UTIL{gpu="4"}')
        series = _get(f"{base}/api/v1/query?query={util}")["data"]["result"]
        assert [s["metric"].get("job", "") for s in series] == [""]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_parses_the_exposition_and_lints_only_dcgm_conventions() -> None:
    assert PROMTOOL is not None
    registry = agent_registry([InfinibandCollector(FIXTURES / "sys"), GpuCollector(_nvml())])
    done = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=render(registry), capture_output=True
    )
    problems = (done.stdout + done.stderr).decode().splitlines()
    expected = (
        "label names should be written in 'snake_case' not 'camelCase'",  # DCGM's UUID etc.
        'counter metrics should have "_total" suffix',  # DCGM's counter names
        "tyard_ib_hw_counter_total metric name should not include type 'counter'",
    )
    assert problems, "expected DCGM's naming to be linted"
    unexpected = [p for p in problems if not any(e in p for e in expected)]
    assert not unexpected, unexpected
