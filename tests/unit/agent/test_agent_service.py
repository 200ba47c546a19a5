"""The node agent's service: /metrics over real HTTP from recorded /proc and /sys trees and the
NVML fake (tensoryard.agent.fake_nvml), GPU owners from the control plane's placements, and the
health checks that feed the closed loop. The control plane here is a recording double of the two
calls the agent makes; tests/e2e/test_e2e_health_loop.py runs the agent against a real one."""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tensoryard.agent.fake_nvml import FakeNvml
from tensoryard.agent.service import AgentConfig, NodeAgent, gpu_owners
from tensoryard.errors import ClientError
from tensoryard.observability.gpu import GpuOwner
from tensoryard.runtime.rank_stats import RankStats

FIXTURES = Path(__file__).resolve().parents[1] / "observability" / "fixtures"


@dataclass
class RecordingControlPlane:
    jobs_answer: list[dict[str, Any]] = field(default_factory=list)
    reports: list[list[dict[str, Any]]] = field(default_factory=list)
    heartbeats: list[str] = field(default_factory=list)
    telemetry: list[dict[str, Any] | None] = field(default_factory=list)
    down: bool = False

    def jobs(self, *, state: list[str] | None = None, limit: int = 50) -> dict[str, Any]:
        if self.down:
            raise ClientError(0, "cannot reach the control plane")
        return {"items": self.jobs_answer, "next_cursor": None, "total": len(self.jobs_answer)}

    def report_health(self, alerts: list[dict[str, Any]]) -> dict[str, Any]:
        if self.down:
            raise ClientError(0, "cannot reach the control plane")
        self.reports.append(alerts)
        return {"drained": [], "unchanged": [], "unknown_nodes": [], "not_handled": []}

    def node_heartbeat(self, name: str, telemetry: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.down:
            raise ClientError(0, "cannot reach the control plane")
        self.heartbeats.append(name)
        self.telemetry.append(telemetry)
        return {"name": name}


def llama(node: str = "n7", gpus: list[int] | None = None, per_node: int = 4) -> dict[str, Any]:
    return {
        "id": 12,
        "team": "research",
        "run_dir": "/nonexistent/runs/12",
        "placement": {"n6": [0, 1, 2, 3], node: gpus if gpus is not None else [4, 5, 6, 7]},
        "spec": {"resources": {"processes_per_node": per_node, "gpus_per_node": 4}},
    }


AgentFixture = tuple[NodeAgent, FakeNvml, RecordingControlPlane]


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A writable copy of the recorded 8-port sysfs tree (ports can be taken down)."""
    return Path(shutil.copytree(FIXTURES / "sys", tmp_path / "sys"))


@pytest.fixture
def agent(sysfs: Path) -> Iterator[AgentFixture]:
    nvml = FakeNvml.with_gpus(8)
    control_plane = RecordingControlPlane(jobs_answer=[llama()])
    service = NodeAgent(
        AgentConfig(node="n7", port=0, proc_root=FIXTURES / "proc", sys_root=sysfs),
        control_plane=control_plane,
        nvml=nvml,
    )
    yield service, nvml, control_plane
    service.stop()


def get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_are_served_over_http_with_gpus_labelled_by_the_job_that_holds_them(
    agent: AgentFixture,
) -> None:
    service, _, _ = agent
    service.refresh_jobs()
    url = service.start()
    status, kind, body = get(f"{url}/metrics")
    assert status == 200 and kind.startswith("text/plain; version=0.0.4")
    got = samples(body)
    util = {dict(k[1])["gpu"]: dict(k[1]) for k in got if k[0] == "DCGM_FI_DEV_GPU_UTIL"}
    assert len(util) == 8
    assert (util["5"]["job"], util["5"]["team"], util["5"]["rank"]) == ("12", "research", "5")
    assert util["0"]["job"] == "" and util["0"]["Hostname"] == "n7"
    states = {dict(k[1])["device"]: v for k, v in got.items() if k[0] == "node_infiniband_state_id"}
    assert len(states) == 8 and states["mlx5_3"] == 1  # recorded down (fixtures/README.md)
    assert any(n == "node_disk_reads_completed_total" for n, _ in got)


def test_a_collector_that_raises_becomes_an_error_count_and_the_scrape_still_answers(
    agent: AgentFixture,
) -> None:
    service, nvml, _ = agent

    def broken(*_: Any) -> int:
        raise RuntimeError("driver bug")

    nvml.nvmlDeviceGetCount = broken  # type: ignore[method-assign]
    url = service.start()
    status, _, body = get(f"{url}/metrics")
    got = samples(body)
    assert status == 200
    assert got[("tyard_collector_errors_total", frozenset({("collector", "gpu")}))] == 1
    assert any(n == "node_infiniband_state_id" for n, _ in got)  # the rest is served
    assert not any(n.startswith("DCGM_") for n, _ in got)


def test_missing_roots_and_an_unreachable_control_plane_never_fail_a_scrape(tmp_path: Path) -> None:
    control_plane = RecordingControlPlane(down=True)
    service = NodeAgent(
        AgentConfig(node="n7", proc_root=tmp_path / "no-proc", sys_root=tmp_path / "no-sys"),
        control_plane=control_plane,
        nvml=FakeNvml.with_gpus(1),
    )
    service.refresh_jobs()
    got = samples(service.scrape().decode())
    errors = {dict(k[1])["collector"]: v for k, v in got.items() if k[0].startswith("tyard_coll")}
    assert errors["agent"] >= 1  # reading the running jobs failed, counted
    assert errors.get("diskstats", 0) >= 1
    assert any(n == "DCGM_FI_DEV_GPU_UTIL" for n, _ in got)
    service.stop()


def test_a_fatal_xid_is_reported_once_as_a_drain_alert_naming_node_gpu_and_xid(
    agent: AgentFixture,
) -> None:
    service, nvml, control_plane = agent
    assert service.report() is None  # healthy: nothing to send
    nvml.gpus[2].xid_events.append(79)
    nvml.gpus[3].xid_events.append(31)  # an application fault (page fault): not fatal
    assert service.report() is not None
    assert service.report() is None  # the same event is not reported twice
    [alerts] = control_plane.reports
    assert alerts == [
        {
            "state": "firing",
            "labels": {
                "alertname": "GpuFatalXid",
                "health_action": "drain_node",
                "severity": "critical",
                "Hostname": "n7",
                "source": "tyard-agent",
                "gpu": "2",
                "xid": "79",
            },
        }
    ]
    nvml.gpus[2].xid_events.append(79)  # a second event of the same XID is news
    service.report()
    assert len(control_plane.reports) == 2


def test_each_heartbeat_carries_gpu_temperatures_xids_and_infiniband_ports(
    agent: AgentFixture, sysfs: Path
) -> None:
    service, nvml, control_plane = agent
    nvml.gpus[5].temperature_c = 91
    nvml.gpus[2].xid_events.append(79)
    nvml.gpus[3].xid_events.append(31)
    (sysfs / "class/infiniband/mlx5_1/ports/1/state").write_text("1: DOWN\n")
    nvml.gpus[4].util_gpu = 97
    service.refresh_jobs()  # job 12 holds GPUs 4-7 here, one rank each
    assert service.heartbeat()
    [sent] = control_plane.telemetry
    assert sent is not None
    gpus = {g["gpu"]: g for g in sent["gpus"]}
    assert len(gpus) == 8 and gpus[5]["temp_c"] == 91 and "memory_temp_c" in gpus[5]
    assert gpus[2]["xids"] == {"79": 1} and gpus[3]["xids"] == {"31": 1}
    assert "xids" not in gpus[0]  # fatal XIDs are counted from 0: only seen ones are sent
    assert (gpus[4]["job"], gpus[4]["rank"], gpus[4]["util_pct"]) == ("12", "4", 97)
    assert "job" not in gpus[0] and "util_pct" in gpus[0]  # idle: no owner
    ports = {(p["device"], p["port"]): p for p in sent["ib_ports"]}
    assert len(ports) == 8 and ports[("mlx5_1", "1")]["state"] == "DOWN"
    down = ports[("mlx5_3", "1")]  # recorded down (fixtures/README.md)
    assert down["errors"]["link_downed"] == 2 and down["errors"]["symbol_error"] == 117
    assert ports[("mlx5_0", "1")] | {"errors": {}} == {
        "device": "mlx5_0",
        "port": "1",
        "state": "ACTIVE",
        "physical_state": "LinkUp",
        "rate_gbps": 400.0,
        "errors": {},
    }
    assert "port_packets_received" not in down["errors"]  # traffic, not faults


def test_a_report_the_control_plane_did_not_get_is_sent_again(agent: AgentFixture) -> None:
    service, nvml, control_plane = agent
    control_plane.down = True
    nvml.gpus[6].xid_events.append(48)
    assert service.report() is None
    control_plane.down = False
    service.report()
    assert [a["labels"]["xid"] for a in control_plane.reports[0]] == ["48"]


def test_an_infiniband_port_that_leaves_active_is_reported_once_per_outage(
    agent: AgentFixture, sysfs: Path
) -> None:
    service, _, control_plane = agent
    state = sysfs / "class/infiniband/mlx5_5/ports/1/state"
    service.report()  # mlx5_3 was never ACTIVE (not cabled, as far as the agent knows): quiet
    state.write_text("1: DOWN\n")
    service.report()
    service.report()
    assert [
        (a["labels"]["alertname"], a["labels"]["device"]) for a in control_plane.reports[0]
    ] == [("InfinibandPortDown", "mlx5_5")]
    assert len(control_plane.reports) == 1
    state.write_text("4: ACTIVE\n")
    service.report()
    state.write_text("1: DOWN\n")
    service.report()
    assert len(control_plane.reports) == 2


def test_a_failing_health_check_command_is_reported_until_it_passes_again(
    sysfs: Path, tmp_path: Path
) -> None:
    flag = tmp_path / "healthy"
    script = tmp_path / "gpu-burn-check"
    script.write_text(
        f"#!{sys.executable}\nimport os, sys\nsys.exit(0 if os.path.exists({str(flag)!r}) else 3)\n"
    )
    script.chmod(0o755)
    control_plane = RecordingControlPlane()
    service = NodeAgent(
        AgentConfig(node="n7", sys_root=sysfs, proc_root=FIXTURES / "proc", checks=(str(script),)),
        control_plane=control_plane,
        nvml=FakeNvml.with_gpus(0),
    )
    service.report()
    service.report()
    (alert,) = control_plane.reports[0]
    assert alert["labels"]["check"] == str(script)  # the whole command: which check, exactly
    assert alert["labels"]["outcome"] == "exit code 3"
    assert len(control_plane.reports) == 1
    flag.touch()
    service.report()
    assert len(control_plane.reports) == 1


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        pytest.param(
            llama(),
            {4: GpuOwner("12", "research", "4"), 7: GpuOwner("12", "research", "7")},
            id="one process per GPU: the rank is the node's rank times its GPUs plus the local one",
        ),
        pytest.param(
            llama(per_node=1),
            {4: GpuOwner("12", "research", ""), 7: GpuOwner("12", "research", "")},
            id="one process driving several GPUs: the rank is left empty",
        ),
        pytest.param(llama(node="n8"), {}, id="a job on other nodes owns nothing here"),
    ],
)
def test_gpu_owners_come_from_the_placement(
    job: dict[str, Any], expected: dict[int, GpuOwner]
) -> None:
    owners = gpu_owners([job], "n7")
    assert {k: owners[k] for k in expected} == expected
    if not expected:
        assert owners == {}


def test_only_metrics_is_served(agent: AgentFixture) -> None:
    service, _, _ = agent
    url = service.start()
    with pytest.raises(urllib.error.HTTPError) as err:
        get(f"{url}/secrets")
    assert err.value.code == 404
    assert json.dumps(get(url)[2]).startswith('"tensoryard node agent')


def test_the_agent_serves_each_ranks_process_io_from_the_rank_files_of_its_jobs(
    tmp_path: Path, sysfs: Path
) -> None:
    """This test process plays rank 0 of job 12: RankStats writes its pid into the job's run
    dir; the agent (reading this machine's real /proc) serves its /proc/<pid>/io per rank."""
    run_dir = tmp_path / "runs" / "12"
    RankStats(run_dir, 0, 1).step(3, 0.5, 0.0)
    job = {**llama(), "run_dir": str(run_dir)}
    service = NodeAgent(
        AgentConfig(node="n7", port=0, proc_root=Path("/proc"), sys_root=sysfs),
        control_plane=RecordingControlPlane(jobs_answer=[job]),
        nvml=FakeNvml.with_gpus(8),
    )
    try:
        service.refresh_jobs()
        got = samples(service.scrape().decode())
    finally:
        service.stop()
    labels = frozenset({"job": "12", "team": "research", "rank": "0"}.items())
    assert got[("tyard_job_io_read_chars_total", labels)] > 0  # it read its own code at least
    errors = {dict(k[1]).get("collector"): v for k, v in got.items() if "collector_errors" in k[0]}
    assert errors["process_io"] == 0  # declared, and nothing failed


def test_every_report_carries_a_heartbeat_faults_or_not_and_an_unreachable_plane_is_counted(
    sysfs: Path,
) -> None:
    control_plane = RecordingControlPlane()
    service = NodeAgent(
        AgentConfig(node="n7", sys_root=sysfs, proc_root=FIXTURES / "proc"),
        control_plane=control_plane,
        nvml=FakeNvml.with_gpus(0),
    )
    assert service.report() is None  # no fault to send
    service.report()
    assert control_plane.heartbeats == ["n7", "n7"] and control_plane.reports == []
    control_plane.down = True
    assert service.heartbeat() is False  # logged and counted, never raised
