"""The README's first command: `tyard demo --json` runs end to end and prints its summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import _kill_leftovers, tyard

pytestmark = pytest.mark.slow


def test_the_demo_survives_the_injected_failure_and_prints_a_json_summary(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    result = tyard("demo", "--json", "--home", str(home), timeout=600)
    try:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        for key in ("job_id", "state", "restarts", "initial_loss", "final_loss", "steps"):
            assert key in summary
        assert summary["state"] == "SUCCEEDED"
        assert summary["restarts"] == 1
        assert summary["final_loss"] < 0.8 * summary["initial_loss"]
        assert summary["steps"] == 240
        assert 0 < summary["goodput"] < 1
        assert summary["wall_s"] > 0
        assert "-> RESTARTING" in result.stdout
    finally:
        _kill_leftovers(home)
