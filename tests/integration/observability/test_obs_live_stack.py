"""A real Prometheus on loopback scrapes a real control plane (subprocess, SQLite, its read
token from a credentials file) and the node agent (`NodeAgent` over HTTP; 8 fake GPUs, the
recorded IB tree, this machine's /proc) while the tiny GPT example trains (DDP, gloo, torch on
the CPU). The job's step metrics are read back through PromQL, and every Grafana panel query
is run against that Prometheus: none may fail to parse or evaluate, and every metric name a
panel uses must be one this stack serves, or one listed below with the reason it cannot be
served here."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.e2e.conftest import REPO, ServerProcess, _kill_leftovers, free_port, wait_for
from tests.e2e.test_e2e_jobs import TERMINAL, tiny_job
from tests.integration.observability.prometheus_server import running_prometheus

from tensoryard.agent.fake_nvml import FakeNvml
from tensoryard.agent.service import AgentConfig, NodeAgent

FIXTURES = REPO / "tests" / "unit" / "observability" / "fixtures"
GRAFANA = REPO / "deploy" / "grafana"
PROMETHEUS = shutil.which("prometheus")

# Names the dashboards use that this stack cannot serve, and why (anything else must exist).
NOT_SERVED_HERE = {
    **{
        f"tyard_nccl_inspector_{name}": "NCCL Inspector: a GPU job that loads the plugin"
        for name in ("bus_bandwidth_gbps", "bytes_total", "exec_seconds_total")
    },
    "node_filesystem_avail_bytes": "node_exporter's filesystem collector (not run here)",
    "node_filesystem_size_bytes": "node_exporter's filesystem collector (not run here)",
    "node_filesystem_readonly": "node_exporter's filesystem collector (not run here)",
    "tyard_nccl_collective_timeouts_total": "a CPU job (gloo) writes no NCCL log",
    "tyard_nccl_warnings_total": "a CPU job (gloo) writes no NCCL log",
    **{
        f"tyard:{name}:by_job": "the DCGM exporter joined to platform pods: Kubernetes only"
        for name in (
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_XID_ERRORS",
        )
    },
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"
    ),
]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _query(base: str, expr: str) -> dict[str, Any]:
    """The API's answer, errors included (a 400 carries a JSON body too)."""
    url = f"{base}/api/v1/query?query={urllib.parse.quote(expr)}"
    try:
        return dict(_get(url))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))


def _wait(what: str, check: Any, timeout: float = 120) -> Any:
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


def _panel_exprs() -> list[tuple[str, str]]:
    out = []
    for path in sorted(GRAFANA.glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in board["panels"]:
            for target in panel["targets"]:
                out.append((f"{path.name} / {panel['title']}", target["expr"]))
    return out


def _concrete(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus accepts (regex matchers: any)."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return re.sub(r"\$\w+", ".*", expr)


def _names(expr: str) -> set[str]:
    import sys

    sys.path.insert(0, str(REPO / "tests" / "unit" / "observability"))
    from _promql import metric_names

    names: set[str] = metric_names(_concrete(expr))
    return names


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    server = ServerProcess(
        home=tmp_path / "home", port=free_port(), extra_args=["--cpu-slots", "4"]
    )
    server.home.mkdir()
    client = server.start()
    node = client.nodes()[0]["name"]
    nvml = FakeNvml.with_gpus(8)
    nvml.gpus[0].xid_events.append(13)  # a non-fatal XID (graphics engine exception): no drain
    agent = NodeAgent(
        AgentConfig(node=node, port=0, sys_root=FIXTURES / "sys", jobs_interval_s=1.0),
        control_plane=client,
        nvml=nvml,
    )
    agent_url = agent.start()
    config = yaml.safe_dump(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(REPO / "deploy" / "prometheus" / "rules" / "*.yml")],
            "scrape_configs": [
                {
                    "job_name": "tensoryard-control-plane",
                    "honor_labels": True,
                    "authorization": {"credentials_file": str(server.home / "admin.token")},
                    "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}],
                },
                {
                    "job_name": "tensoryard-agent",
                    "honor_labels": True,
                    "static_configs": [{"targets": [agent_url.removeprefix("http://")]}],
                },
            ],
        }
    )
    try:
        with running_prometheus(config, tmp_path) as prometheus:
            yield {"base": prometheus.base, "client": client, "node": node, "tmp": tmp_path}
    finally:
        agent.stop()
        server.stop()
        _kill_leftovers(server.home)


def test_prometheus_reads_the_jobs_step_metrics_and_runs_every_dashboard_query(
    stack: dict[str, Any],
) -> None:
    base, client = stack["base"], stack["client"]
    # Long enough to outlive every wait below on a loaded machine (the per-rank series exist
    # only while the ranks do); cancelled at the end.
    spec = yaml.safe_load(tiny_job(stack["tmp"], "--steps", "100000").read_text())
    job_id = str(client.submit(spec)["id"])
    wait_for(client, int(job_id), {"RUNNING"})

    def targets_up() -> bool:
        up = _query(base, "up")["data"]["result"]
        return len(up) == 2 and all(s["value"][1] == "1" for s in up)

    _wait("both targets up", targets_up, timeout=60)
    loss = _wait(
        "the job's loss in Prometheus",
        lambda: _query(base, f'tyard_job_loss{{job="{job_id}"}}')["data"]["result"],
    )
    assert 0 < float(loss[0]["value"][1]) < 10
    step = _wait(
        "the job's step time",
        lambda: _query(base, f'tyard_job_step_time_seconds{{job="{job_id}"}}')["data"]["result"],
    )
    assert float(step[0]["value"][1]) > 0
    running = _query(base, 'tyard_jobs{state="RUNNING"}')["data"]["result"]
    assert sum(float(s["value"][1]) for s in running) == 1
    gpus = _query(base, f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{stack["node"]}"}}')["data"]["result"]
    assert len(gpus) == 8
    waits = _wait(
        "per-rank data-loader wait from the agent",
        lambda: _query(base, f'tyard_job_data_wait_seconds{{job="{job_id}"}}')["data"]["result"],
    )
    assert sorted(s["metric"]["rank"] for s in waits) == ["0", "1"]
    io = _wait(  # each rank's /proc/<pid>/io, found through the pid in its rank file
        "per-rank process I/O from the agent",
        lambda: _query(base, f'tyard_job_io_read_chars_total{{job="{job_id}"}}')["data"]["result"],
    )
    assert sorted(s["metric"]["rank"] for s in io) == ["0", "1"]
    assert all(float(s["value"][1]) > 0 for s in io)
    straggler = _query(base, f'tyard_job_rank_step_time_seconds{{job="{job_id}"}}')
    assert len(straggler["data"]["result"]) == 2
    assert [n["state"] for n in client.nodes()] == ["ready"]  # XID 13 is not fatal

    exprs = _panel_exprs()
    assert len(exprs) > 40
    needed = set().union(*(_names(e) for _, e in exprs)) - set(NOT_SERVED_HERE)

    def served_now() -> set[str]:
        return set(_get(f"{base}/api/v1/label/__name__/values")["data"])

    # Some series start with the first checkpoint or step of a busy machine: give them time.
    deadline = time.monotonic() + 120
    while not needed <= (served := served_now()) and time.monotonic() < deadline:
        time.sleep(1)
    failures = []
    for where, expr in exprs:
        answer = _query(base, _concrete(expr))
        if answer.get("status") != "success":
            failures.append(f"{where}: {answer.get('errorType')}: {answer.get('error')}")
        for name in _names(expr) - served - set(NOT_SERVED_HERE):
            failures.append(f"{where}: metric {name} is served by nothing here")
    assert not failures, "\n".join(sorted(set(failures)))

    assert client.job(int(job_id))["state"] == "RUNNING"  # the series above were a live job's
    client.cancel(int(job_id))
    job = wait_for(client, int(job_id), TERMINAL, timeout=120)
    assert job["state"] == "CANCELLED", job["reason"]
