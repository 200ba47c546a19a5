"""The throughput benchmark runs end to end in its quick mode and reports what it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_the_throughput_benchmark_quick_run_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    before = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "scheduler_throughput.py"),
            "--json",
            str(out),
            "--quick",
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    assert result["admissions_per_s"] > 0
    assert result["cycle_ms_p99"] >= result["cycle_ms_p50"] > 0
    assert set(result["cost_per_cycle_ms"]) == {"1000", "5000"}
    assert "ratios" not in result  # no peer runs here, so no ratio to one
    assert result["command"].startswith("python benchmarks/scheduler_throughput.py")
    for level in result["levels"].values():
        assert level["admissions"] > 0
        # the rate counts steady-state cycles only; the initial fill is reported apart
        assert level["admissions_per_s"] == pytest.approx(
            level["steady_admissions"] / level["steady_schedule_s"]
        )
        assert level["admissions"] >= level["fill_admissions"] + level["steady_admissions"]
        assert 0 < level["steady_gpu_utilization"] <= 1
        assert level["pending_reasons_read"] > 0 or level["pending"] <= level["admissions"]
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8") == before
