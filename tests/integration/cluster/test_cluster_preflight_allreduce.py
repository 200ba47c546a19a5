"""The preflight all-reduce for real: 2 processes, torch.distributed with gloo on the CPU."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app
from tensoryard.cluster.preflight import Expectations, check_allreduce, run_allreduce

pytest.importorskip("torch")


@pytest.mark.slow
def test_two_gloo_processes_all_reduce_correctly_and_report_bus_bandwidth() -> None:
    result = run_allreduce(world_size=2, size_bytes=4 * 1024 * 1024, iters=3, backend="gloo")
    assert result.correct
    assert result.backend == "gloo" and result.world_size == 2
    assert result.size_bytes == 4 * 1024 * 1024
    assert result.seconds_per_iter > 0
    # two ranks: busbw = algbw * 2 * (2 - 1) / 2
    assert result.busbw_gbps == pytest.approx(result.algbw_gbps)
    check = check_allreduce(Expectations(), run=run_allreduce, size_bytes=1024 * 1024)
    assert check.status == "pass" and "no floor" in check.message


@pytest.mark.slow
def test_the_cli_runs_the_cpu_allreduce_and_prints_a_json_report() -> None:
    args = ["cluster", "preflight", "--procs", "2", "--size-mb", "1", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    allreduce = next(c for c in report["checks"] if c["name"] == "allreduce")
    assert allreduce["status"] == "pass"
    assert allreduce["details"]["backend"] == "gloo" and allreduce["details"]["correct"] is True
