"""Preflight checks against recorded command outputs (see recorded/README.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app
from tensoryard.cluster.compat import SoftwareStack
from tensoryard.cluster.preflight import (
    AllReduceResult,
    CheckResult,
    CommandResult,
    Expectations,
    PreflightReport,
    RecordedRunner,
    TorchVersions,
    check_allreduce,
    post_report,
    run_preflight,
)
from tensoryard.cluster.preflight.checks import (
    GPU_QUERY,
    REMAP_QUERY,
    check_ecc,
    check_fabric_manager,
    check_infiniband,
    check_nvlink,
    check_topology,
    check_versions,
)
from tensoryard.cluster.preflight.parsers import parse_ibstat, parse_nvlink_status, parse_topology
from tensoryard.errors import TensoryardError

RECORDED = Path(__file__).parent / "recorded"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "cluster" / "inventory.yaml"
HGX = Expectations(
    gpu_model="H100",
    gpu_count=8,
    interconnect="nvswitch",
    ib_hcas=("mlx5_7",),
    ib_rate_gbps=200,
    software=SoftwareStack(driver="570.124.06", cuda="12.8", pytorch="2.7", nccl="2.26.2"),
)
TORCH_OK = TorchVersions(pytorch="2.7.1", cuda="12.8", nccl="2.26.2")


def _cmd(argv: list[str]) -> str:
    return " ".join(argv)


def _runner(**overrides: str) -> RecordedRunner:
    files = {
        _cmd(GPU_QUERY): "gpu_query_h100_constructed.txt",
        _cmd(REMAP_QUERY): "remapped_rows_ok_constructed.txt",
        "nvidia-smi topo -m": "topo_dgx_h100.txt",
        "nvidia-smi nvlink --status": "nvlink_h100_constructed.txt",
        "nvidia-smi -q": "smi_q_fabric_ok_constructed.txt",
        "ibstat": "ibstat_gpud_mlx5_7.txt",
    }
    runner = RecordedRunner.from_files(RECORDED, files | overrides)
    runner.outputs["systemctl is-active nvidia-fabricmanager"] = CommandResult(0, "active\n")
    return runner


def _no_allreduce(expect: Expectations) -> CheckResult:
    return CheckResult("allreduce", "skip", "left out in this test")


def test_a_healthy_hgx_node_passes_every_check() -> None:
    report = run_preflight(
        HGX,
        node="hgx-a01",
        runner=_runner(),
        torch_info=lambda: TORCH_OK,
        allreduce=_no_allreduce,
    )
    statuses = {c.name: c.status for c in report.checks}
    assert statuses == {
        "gpus": "pass",
        "versions": "pass",
        "fabric_manager": "pass",
        "topology": "pass",
        "nvlink": "pass",
        "ecc": "pass",
        "infiniband": "pass",
        "allreduce": "skip",
    }, [c.message for c in report.checks]
    assert report.ok
    data = report.as_dict()
    assert json.loads(json.dumps(data))["node"] == "hgx-a01"


def test_the_topology_parser_reads_real_matrices() -> None:
    four = parse_topology((RECORDED / "topo_4x_h100_nv6.txt").read_text())
    assert len(four) == 12 and set(four.values()) == {"NV6"}
    eight = parse_topology((RECORDED / "topo_dgx_h100.txt").read_text())
    assert len(eight) == 56 and set(eight.values()) == {"NV18"}


def test_a_gpu_pair_off_nvlink_fails_topology_naming_the_pair() -> None:
    runner = _runner(**{"nvidia-smi topo -m": "topo_4x_h100_lost_link.txt"})
    result = check_topology(runner, Expectations(interconnect="nvlink"))
    assert result.status == "fail"
    assert "GPU2-GPU3" in result.message
    assert check_topology(runner, Expectations(interconnect="none")).status == "pass"


def test_inactive_nvlinks_fail_naming_gpu_and_links() -> None:
    text = (RECORDED / "nvlink_v100_inactive.txt").read_text()
    assert parse_nvlink_status(text) == {3: [25.781, 25.781, 25.781, None, 25.781, None]}
    runner = _runner(**{"nvidia-smi nvlink --status": "nvlink_v100_inactive.txt"})
    result = check_nvlink(runner, Expectations(interconnect="nvlink"))
    assert result.status == "fail" and "GPU 3: links [3, 5]" in result.message


def test_a_port_down_fails_infiniband_and_names_the_port() -> None:
    ports = parse_ibstat((RECORDED / "ibstat_rdma_core_mlx4.txt").read_text())
    assert [(p.port, p.state, p.rate) for p in ports] == [(1, "Down", 10), (2, "Active", 56)]
    runner = _runner(ibstat="ibstat_rdma_core_mlx4.txt")
    result = check_infiniband(runner, Expectations(ib_hcas=("mlx4_0",), ib_rate_gbps=56))
    assert result.status == "fail" and "mlx4_0 port 1 is Down/Disabled" in result.message


def test_a_port_at_the_wrong_rate_or_a_missing_hca_fails() -> None:
    runner = _runner()
    slow = check_infiniband(runner, Expectations(ib_hcas=("mlx5_7",), ib_rate_gbps=400))
    assert slow.status == "fail" and "runs at 200 Gb/s, expected 400" in slow.message
    missing = check_infiniband(runner, Expectations(ib_hcas=("mlx5_7", "mlx5_8"), ib_rate_gbps=200))
    assert missing.status == "fail" and "mlx5_8 missing" in missing.message
    assert check_infiniband(runner, Expectations()).status == "skip"


def test_a_pending_row_remap_fails_ecc() -> None:
    runner = _runner(**{_cmd(REMAP_QUERY): "remapped_rows_pending_constructed.txt"})
    result = check_ecc(runner, HGX)
    assert result.status == "fail" and "00000000:BB:00.0 has a row remap pending" in result.message


def test_fabric_manager_not_ready_fails_on_nvswitch_only() -> None:
    runner = _runner(**{"nvidia-smi -q": "smi_q_fabric_in_progress_constructed.txt"})
    result = check_fabric_manager(runner, HGX)
    assert result.status == "fail" and "In Progress" in result.message
    assert check_fabric_manager(runner, Expectations(interconnect="nvlink")).status == "skip"
    bare = RecordedRunner(
        {"systemctl is-active nvidia-fabricmanager": CommandResult(3, "failed\n")}
    )
    stopped = check_fabric_manager(bare, HGX)
    assert stopped.status == "fail" and "nvidia-fabricmanager is failed" in stopped.message


@pytest.mark.parametrize(
    ("torch", "expected"),
    [
        pytest.param(
            TorchVersions("2.7.1", "12.8", "2.26.2"), "pass", id="the inventory's stack passes"
        ),
        pytest.param(
            TorchVersions("2.7.1", "12.6", "2.26.2"),
            "fail",
            id="a CUDA build other than the inventory's fails",
        ),
        pytest.param(TorchVersions("2.7.1", None, None), "fail", id="a CPU-only PyTorch fails"),
    ],
)
def test_versions_are_checked_against_the_table_and_the_inventory(
    torch: TorchVersions, expected: str
) -> None:
    assert check_versions(_runner(), HGX, lambda: torch).status == expected


def test_an_old_driver_for_the_jobs_cuda_names_both() -> None:
    runner = RecordedRunner(
        {_cmd(GPU_QUERY): CommandResult(0, "0, NVIDIA H100 80GB HBM3, 535.54.03, Enabled, 0\n")}
    )
    result = check_versions(runner, Expectations(), lambda: TORCH_OK)
    assert result.status == "fail"
    assert "driver 535.54.03 is too old for CUDA 12.8" in result.message


def test_missing_nvidia_smi_is_a_skip_on_a_cpu_node_and_a_failure_on_a_gpu_node() -> None:
    empty = RecordedRunner({})
    cpu = run_preflight(Expectations(), runner=empty, allreduce=None)
    assert cpu.ok and {c.status for c in cpu.checks} == {"skip"}
    gpu = run_preflight(HGX, runner=empty, torch_info=lambda: TORCH_OK, allreduce=None)
    failed = {c.name for c in gpu.checks if c.status == "fail"}
    assert {"gpus", "versions", "topology", "nvlink", "ecc", "infiniband"} <= failed
    assert not gpu.ok


def _result(busbw: float, *, backend: str = "nccl", world: int = 8) -> AllReduceResult:
    return AllReduceResult(backend, world, 2**26, 5, 0.001, busbw, busbw, True)


@pytest.mark.parametrize(
    ("busbw", "status"),
    [
        pytest.param(350.0, "pass", id="above the H100 floor"),
        pytest.param(120.0, "fail", id="below the H100 floor"),
    ],
)
def test_nccl_bus_bandwidth_is_held_to_the_model_floor(busbw: float, status: str) -> None:
    result = check_allreduce(HGX, run=lambda **_: _result(busbw))
    assert result.status == status
    assert result.details["floor_gbps"] == 270.0


def test_a_crashed_allreduce_is_a_failed_check_not_a_crash() -> None:
    def boom(**_: Any) -> AllReduceResult:
        raise RuntimeError("process 1 terminated with exit code 1")

    result = check_allreduce(HGX, run=boom)
    assert result.status == "fail" and "exit code 1" in result.message


class _Sink(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Sink.received.append((self.headers.get("Authorization", ""), json.loads(body)))
        self.send_response(204 if self.path == "/ok" else 500)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def sink() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_report_is_posted_as_json_with_the_token(sink: str) -> None:
    report = PreflightReport(node="hgx-a01", checks=[CheckResult("gpus", "fail", "3 GPUs")])
    assert post_report(report, f"{sink}/ok", token="t0k") == 204
    auth, body = _Sink.received[-1]
    assert auth == "Bearer t0k" and body["ok"] is False and body["checks"][0]["name"] == "gpus"
    with pytest.raises(TensoryardError, match="HTTP 500"):
        post_report(report, f"{sink}/broken")


def test_the_cli_rejects_a_node_missing_from_the_inventory() -> None:
    args = ["cluster", "preflight", "--inventory", str(EXAMPLE), "--node", "nope", "--no-allreduce"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "node 'nope' is not in the inventory" in result.output


def test_the_cli_fails_a_listed_gpu_node_that_has_no_nvidia_smi(tmp_path: Path) -> None:
    # This machine has no GPU and no nvidia-smi: for an inventory GPU node that is a failure.
    args = [
        "cluster",
        "preflight",
        "--inventory",
        str(EXAMPLE),
        "--node",
        "hgx-a01",
        "--no-allreduce",
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert {c["name"]: c["status"] for c in report["checks"]}["gpus"] == "fail"


# -- a real single-GPU H200 machine (recorded/h200_1gpu, see recorded/README.md) --------------

H200_RECORD = RECORDED / "h200_1gpu"
H200_TORCH = TorchVersions(pytorch="2.11.0", cuda="13.0", nccl="2.28.9")  # as that machine had


def test_a_recorded_h200_run_replays_to_the_report_the_machine_gave() -> None:
    """`tyard cluster preflight --record` on a real H200: replaying its commands gives the
    report that machine printed, check by check (the all-reduce is not a command)."""
    real = json.loads((H200_RECORD / "report.json").read_text(encoding="utf-8"))
    runner = RecordedRunner.from_record(H200_RECORD)
    replay = run_preflight(
        Expectations(),
        node=real["node"],
        runner=runner,
        torch_info=lambda: H200_TORCH,
        allreduce=None,
    )
    want = [(c["name"], c["status"], c["message"]) for c in real["checks"]]
    got = [(c.name, c.status, c.message) for c in replay.checks]
    assert got == want[: len(got)]
    assert [c for c in want[len(got) :] if c[0] != "allreduce"] == []
    assert ("gpus", "pass", "1 x H200") in got
    assert ("versions", "pass", "driver 580.159.04, cuda 13.0, pytorch 2.11.0, nccl 2.28.9") in got
    # the all-reduce on that machine: NCCL on its one GPU, right, with no bus to measure
    allreduce = real["checks"][-1]
    assert allreduce["status"] == "pass" and allreduce["details"]["backend"] == "nccl"
    assert allreduce["details"]["world_size"] == 1 and allreduce["details"]["correct"]


def test_real_nvidia_smi_q_of_a_single_h200_has_no_fabric_to_wait_for() -> None:
    from tensoryard.cluster.preflight.parsers import parse_fabric_state

    text = (H200_RECORD / "smi_q.txt").read_text(encoding="utf-8")
    assert parse_fabric_state(text) == [("N/A", "N/A")]
    runner = RecordedRunner({"nvidia-smi -q": CommandResult(0, text)})
    h200 = Expectations(gpu_model="H200", gpu_count=1, interconnect="none")
    assert check_fabric_manager(runner, h200).status == "skip"


def test_one_gpu_allreduce_passes_as_an_nccl_smoke_test() -> None:
    result = check_allreduce(HGX, run=lambda **_: _result(0.0, world=1))
    assert result.status == "pass" and "one GPU" in result.message


def test_recording_runner_keeps_what_replays_exactly(tmp_path: Path) -> None:
    from tensoryard.cluster.preflight import RecordingRunner

    inner = _runner()
    inner.outputs["ibstat"] = CommandResult(3, "partial\n", "ibpanic: no mlx5_3\n")
    recording = RecordingRunner(tmp_path / "rec", inner)
    first = run_preflight(HGX, runner=recording, torch_info=lambda: TORCH_OK, allreduce=None)
    replay = RecordedRunner.from_record(tmp_path / "rec")
    second = run_preflight(HGX, runner=replay, torch_info=lambda: TORCH_OK, allreduce=None)
    assert [c.as_dict() for c in second.checks] == [c.as_dict() for c in first.checks]
    assert replay(["ibstat"]) == CommandResult(3, "partial\n", "ibpanic: no mlx5_3\n")
