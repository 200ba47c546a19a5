from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.shared_data import missing_shared

from tensoryard.observability import metrics as m

SHARED = Path(__file__).resolve().parents[4] / "shared"
DCGM_CSV = SHARED / "reference" / "dcgm-exporter_default-counters.csv"


def _dcgm_reference() -> dict[str, str]:
    """DCGM field -> Prometheus type from the exporter's CSV, enabled or commented out."""
    if not DCGM_CSV.exists():
        missing_shared(f"needs ../shared ({DCGM_CSV} is absent): the DCGM exporter's counter list")
    out = {}
    for line in DCGM_CSV.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^#?\s*(DCGM_[A-Z0-9_]+)\s*,\s*([a-z]+)\s*,", line)
        if match:
            out[match.group(1)] = match.group(2)
    return out


@pytest.mark.shared
def test_gpu_metric_names_and_types_are_the_dcgm_exporters():
    reference = _dcgm_reference()
    for d in m.DCGM:
        assert d.name in reference, f"{d.name} is not in the DCGM exporter's counter list"
        assert d.type == reference[d.name], f"{d.name}: ours {d.type}, DCGM's {reference[d.name]}"


@pytest.mark.shared
def test_the_one_extra_dcgm_field_is_not_in_the_csv_and_says_so():
    reference = _dcgm_reference()
    assert [d.name for d in m.DCGM_EXTRA if d.name not in reference] == [
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    ]


def test_names_are_unique_and_counters_end_in_total_unless_dcgm():
    names = [d.name for d in m.ALL]
    assert len(names) == len(set(names))
    for d in m.ALL:
        if d.type == "counter" and not d.name.startswith("DCGM_"):
            assert d.name.endswith("_total"), d.name


def test_histograms_expose_their_series_names():
    assert {"tyard_pending_seconds_bucket", "tyard_scheduler_cycle_seconds_count"} <= m.names()
