"""Smoke run of benchmarks/data_loader.py: tensoryard and the memcpy limit on a tiny corpus.

Peers are left out (`--only tensoryard,memcpy`) so CI never builds their venvs; the full run
with every peer is `python benchmarks/data_loader.py` (JSON in benchmarks/results/).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "data_loader.py"


@pytest.mark.slow
def test_the_quick_benchmark_writes_every_measurement_for_tensoryard_and_memcpy(
    tmp_path: Path,
) -> None:
    out = tmp_path / "data_loader.json"
    results_md = ROOT / "benchmarks" / "RESULTS.md"
    before = results_md.read_text() if results_md.exists() else None
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--json",
            str(out),
            "--quick",
            "--only",
            "tensoryard,memcpy",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())

    for key in ("tokens_per_s", "tokens_per_s_2workers", "ttfb_s", "peak_rss_mb"):
        for loader in ("tensoryard", "memcpy"):
            assert result[key][loader] > 0, (key, loader)
    assert result["resume_ms"]["tensoryard"] > 0
    arms = result["tokens_per_s_by_workers"]
    assert sorted(arms, key=int) == ["0", "2", "4", "8"]
    assert all(arms[n]["tensoryard"] > 0 for n in arms)
    assert arms["0"]["tensoryard"] == result["tokens_per_s"]["tensoryard"]
    assert result["ratios"]["by_workers"]["8"]["vs_best_peer"] is None  # no peer in this run
    shards = result["ttfb_by_shards"]["tensoryard"]
    assert len(shards) == 2 and all(v > 0 for v in shards.values())
    assert result["ratios"]["vs_memcpy_separate_runs"] == pytest.approx(
        result["tokens_per_s"]["tensoryard"] / result["tokens_per_s"]["memcpy"]
    )
    duel = result["duel_tensoryard_vs_memcpy"]
    assert len(duel["ratios"]) == 2 and all(r > 0 for r in duel["ratios"])
    assert result["ratios"]["vs_memcpy"] == pytest.approx(duel["median_ratio"])
    assert result["ratios"]["vs_best_peer"] is None  # no peer in this run
    assert set(result["goals"].values()) <= {"met", "not met", "n/a"}
    assert result["errors"] == {}
    # A quick run never rewrites the recorded full-run line.
    assert (results_md.read_text() if results_md.exists() else None) == before
