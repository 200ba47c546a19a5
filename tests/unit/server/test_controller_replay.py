"""Every decision of the control loop over scripted scenarios equals the recorded baseline.

The baseline (``controller_baseline.json``) was recorded with ``controller_log.py`` from the
controller as it was at commit f881557, one class in ``server/controller.py``, before it was
split by concern into ``server/control/``. A change that alters any job's states, reasons,
placements, why-pending, events or what is launched, cancelled or killed in these scenarios
fails here. If a change of behaviour is intended, re-record the baseline in its own commit
and say why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from controller_log import BASELINE, SCENARIOS, run

RECORD = os.environ.get("TYARD_RECORD_CONTROLLER_BASELINE") == "1"


@pytest.mark.parametrize("name", sorted(SCENARIOS), ids=lambda n: f"{n} decides as recorded")
def test_controller_decisions_match_the_recorded_baseline(
    name: str, migrated_sqlite_url: str, tmp_path: Path
) -> None:
    log = json.loads(json.dumps(run(name, migrated_sqlite_url, tmp_path)))
    if RECORD:
        recorded = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
        recorded[name] = log
        BASELINE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    expected = json.loads(BASELINE.read_text())[name]
    for i, (got, want) in enumerate(zip(log, expected, strict=False)):
        assert got == want, f"entry {i} ({want.get('step')} at t={want.get('t')}) differs"
    assert len(log) == len(expected)
