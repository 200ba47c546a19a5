"""The scheduler-quality benchmark's --quick mode runs every policy and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

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
        pytest.skip(f"shared traces are absent ({PHILLY}); clone ../shared to run this test")
    out = tmp_path / "quality.json"
    results_md = tmp_path / "RESULTS.md"
    code = _benchmark().main(
        ["--json", str(out), "--quick", "--workers", "1", "--results-md", str(results_md)]
    )
    assert code == 0
    payload = json.loads(out.read_text())
    assert set(payload["policies"]) == {
        "default",
        "fifo",
        "sjf-oracle",
        "tiresias-las",
        "kueue-like",
    }
    for metrics in payload["policies"].values():
        assert metrics["avg_jct_s"] > 0 and 0 < metrics["allocation"] <= 1
    fifo = payload["policies"]["fifo"]["avg_jct_s"]
    assert payload["ratios"]["default_over_fifo_avg_jct"] == pytest.approx(
        payload["policies"]["default"]["avg_jct_s"] / fifo
    )
    assert not results_md.exists()  # quick runs never touch RESULTS.md
