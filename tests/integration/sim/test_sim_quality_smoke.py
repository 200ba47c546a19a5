"""The scheduler-quality benchmark's --quick mode runs every policy and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from tests.shared_data import missing_shared

REPO = Path(__file__).resolve().parents[3]
PHILLY = REPO.parent / "shared" / "traces" / "philly" / "philly.csv"


def _benchmark() -> ModuleType:
    path = REPO / "benchmarks" / "scheduler_quality.py"
    spec = importlib.util.spec_from_file_location("scheduler_quality_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.shared
def test_the_quick_quality_benchmark_compares_every_policy(tmp_path: Path) -> None:
    if not PHILLY.exists():
        missing_shared(f"shared traces are absent ({PHILLY}); clone ../shared to run this test")
    out = tmp_path / "quality.json"
    results_md = tmp_path / "RESULTS.md"
    code = _benchmark().main(
        ["--json", str(out), "--quick", "--workers", "1", "--results-md", str(results_md)]
    )
    assert code == 0
    payload = json.loads(out.read_text())
    assert {(tuple(r["window"]), r["config"]) for r in payload["runs"]} == {
        ((40_000, 40_300), "multi-team"),
        ((40_000, 40_300), "single-team"),
    }
    for run in payload["runs"]:
        assert set(run["policies"]) == {
            "default",
            "fifo",
            "sjf-oracle",
            "srtf-oracle",
            "tiresias-las",
            "kueue-like",
        }
        for metrics in run["policies"].values():
            assert metrics["avg_jct_s"] > 0 and 0 < metrics["allocation"] <= 1
        srtf = run["policies"]["srtf-oracle"]["avg_jct_s"]
        assert run["ratios"]["default_over_srtf_oracle_avg_jct"] == pytest.approx(
            run["policies"]["default"]["avg_jct_s"] / srtf
        )
        assert run["goals"]["avg_jct_within_10pct_of_srtf_oracle"] == (
            run["ratios"]["default_over_srtf_oracle_avg_jct"] <= 1.10
        )
        assert ("no_team_below_entitlement_over_10_min" in run["goals"]) == (
            run["config"] == "multi-team"
        )
        assert 0 <= run["policies"]["default"]["estimator_accuracy"]["coverage"] <= 1
    assert not results_md.exists()  # quick runs never touch RESULTS.md
