"""The fake NVML against a real device: values recorded on an H200 (fixtures/recorded-h200,
see fixtures/README.md) fed to FakeNvml must make the GPU collector print what it printed on
that machine from real NVML, series for series."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tensoryard.agent.fake_nvml import FakeNvml, record_devices
from tensoryard.observability.gpu import GpuCollector
from tensoryard.observability.nccl import NcclLogStats

RECORDED = Path(__file__).resolve().parent / "fixtures" / "recorded-h200"
# Values that do not move between two readings a moment apart on an idle-to-busy GPU.
STEADY = {
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _exposition(nvml: FakeNvml) -> str:
    registry = CollectorRegistry()
    collector = GpuCollector(nvml, hostname=lambda: "vm")  # the recording machine's name
    registry.register(collector)
    return generate_latest(registry).decode()


def test_the_fake_fed_with_an_h200_recording_prints_what_the_real_device_printed() -> None:
    doc = json.loads((RECORDED / "nvml_h200x1_load.json").read_text(encoding="utf-8"))
    real = _samples((RECORDED / "gpu_collector_h200x1_load.prom").read_text(encoding="utf-8"))
    fake = _samples(_exposition(FakeNvml.from_records(doc["gpus"])))
    assert sorted(fake) == sorted(real)  # the same series, labels included
    for key, value in real.items():
        if key[0] in STEADY:
            assert fake[key] == value, key
    # an H200 without NVLink peers reports no NVLink series; its HBM3e reports a temperature
    names = {name for name, _ in real}
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in names
    assert "DCGM_FI_DEV_MEMORY_TEMP" in names


def test_recording_the_fake_gives_back_its_records() -> None:
    """The recorder reads every FakeGpu field through NVML calls; on the fake, it must give
    back exactly the records the fake was built from (so a real recording is complete)."""
    for name in ("nvml_h200x1_load.json", "nvml_h200x1_idle.json"):
        doc = json.loads((RECORDED / name).read_text(encoding="utf-8"))
        nvml = FakeNvml.from_records(doc["gpus"])
        nvml.nvmlInit()
        records, _ = record_devices(nvml)
        assert records == doc["gpus"], name
    assert doc["not_supported"] == {"0": ["nvmlDeviceGetRetiredPagesPendingStatus: Not Supported"]}


def test_real_nccl_2_28_init_lines_are_read_without_a_malformed_line() -> None:
    stats = NcclLogStats()
    for line in (RECORDED / "nccl-2.28.9-vm-1497.log").read_text(encoding="utf-8").splitlines():
        stats.feed(line)
    assert (stats.init_complete, stats.warnings, stats.errors, stats.malformed) == (1, 0, 0, 0)
