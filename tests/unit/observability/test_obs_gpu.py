from __future__ import annotations

from _scrape import names, scrape, value

from tensoryard.agent.fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml
from tensoryard.observability import metrics as m
from tensoryard.observability.base import CollectorErrors
from tensoryard.observability.gpu import GpuCollector, GpuOwner

ERRORS = "tyard_collector_errors_total"


def _collector(nvml: FakeNvml, **kw) -> GpuCollector:
    return GpuCollector(nvml, hostname=lambda: "node7", **kw)


def test_every_gpu_gets_the_dcgm_metrics_in_dcgm_units(h100x8: FakeNvml):
    s = scrape(_collector(h100x8))
    gpus = {dict(ls)["gpu"] for n, ls in s if n == "DCGM_FI_DEV_GPU_UTIL"}
    assert gpus == {str(i) for i in range(8)}
    g0 = {"gpu": "0", "Hostname": "node7", "modelName": "NVIDIA H100 80GB HBM3"}
    assert value(s, "DCGM_FI_DEV_GPU_UTIL", **g0) == 98
    assert value(s, "DCGM_FI_DEV_POWER_USAGE", **g0) == 672.31  # W from NVML's mW
    assert value(s, "DCGM_FI_DEV_FB_USED", **g0) == 76 * 1024  # MiB
    assert value(s, "DCGM_FI_DEV_FB_FREE", **g0) == 85520809984 / 2**20 - 76 * 1024
    assert value(s, "DCGM_FI_DEV_GPU_TEMP", **g0) == 62
    assert value(s, "DCGM_FI_DEV_MEMORY_TEMP", **g0) == 70
    assert value(s, "DCGM_FI_DEV_SM_CLOCK", **g0) == 1980
    assert value(s, "DCGM_FI_DEV_MEM_CLOCK", **g0) == 2619
    assert value(s, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", **g0) == 9_182_736_123 + 9_180_112_001
    known = {d.name for d in (*m.DCGM, *m.DCGM_EXTRA, *m.GPU_TYARD)}
    assert names(s) <= known
    assert value(s, "DCGM_FI_DEV_GPU_UTIL", gpu="3", device="nvidia3") == 100


def test_faulty_gpus_show_their_faults(h100x8: FakeNvml):
    s = scrape(_collector(h100x8))
    assert value(s, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="5") == 2
    assert value(s, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", gpu="5") == 57
    assert value(s, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="5") == 2
    assert value(s, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="5") == 1
    assert value(s, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="0") == 0
    # NVLink counters are summed over the GPU's links
    assert value(s, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu="2") == 31
    assert value(s, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", gpu="2") == 5
    assert value(s, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", gpu="2") == 2
    assert value(s, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", gpu="2") == 1
    assert value(s, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu="6") == 0x40
    hot = {"gpu": "6", "reason": "hw_thermal_slowdown"}
    assert value(s, "tyard_gpu_clock_throttle_active", **hot) == 1
    assert value(s, "tyard_gpu_clock_throttle_active", gpu="0", reason="hw_thermal_slowdown") == 0
    assert value(s, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="6") == 38_511_000_000


def test_gpus_carry_the_job_team_and_rank_that_hold_them(h100x8: FakeNvml):
    owners = {i: GpuOwner("llama-70b", "research", str(8 + i)) for i in range(4)}
    s = scrape(_collector(h100x8, owners=lambda: owners))
    assert value(s, "DCGM_FI_DEV_GPU_UTIL", gpu="2", job="llama-70b", rank="10") == 99
    assert value(s, "DCGM_FI_DEV_GPU_UTIL", gpu="4", job="", team="", rank="") == 96


def test_xid_events_become_a_last_value_gauge_and_a_counter_per_xid(h100x8: FakeNvml):
    collector = _collector(h100x8)
    scrape(collector)  # starts NVML and registers for XID events
    h100x8.gpus[1].xid_events += [79, 13, 79]
    s = scrape(collector)
    assert value(s, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 79
    assert value(s, "tyard_gpu_xid_errors_total", gpu="1", xid="79") == 2
    assert value(s, "tyard_gpu_xid_errors_total", gpu="1", xid="13") == 1
    # fatal XIDs start at 0 on every GPU, so the alert's increase() sees the first one
    assert value(s, "tyard_gpu_xid_errors_total", gpu="0", xid="79") == 0
    assert value(s, "tyard_gpu_xid_errors_total", gpu="0", xid="48") == 0
    assert not [k for k in s if k[0] == "DCGM_FI_DEV_XID_ERRORS" and dict(k[1])["gpu"] == "0"]


def test_a_node_without_nvml_exports_no_gpu_series():
    errors = CollectorErrors()
    s = scrape(GpuCollector(None, load=lambda: None, errors=errors), errors)
    assert not [k for k in s if k[0] != ERRORS]
    assert errors.count("gpu") == 0


def test_a_node_without_a_driver_exports_no_gpu_series():
    nvml = FakeNvml.with_gpus(8)
    nvml.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    errors = CollectorErrors()
    s = scrape(GpuCollector(nvml, errors=errors), errors)
    assert not [k for k in s if k[0] != ERRORS]


def test_a_gpu_lost_mid_scrape_is_counted_and_the_others_answer(h100x8: FakeNvml):
    errors = CollectorErrors()
    collector = _collector(h100x8, errors=errors)
    scrape(collector)
    h100x8.gpus[4].lost = True
    s = scrape(collector, errors)
    assert value(s, ERRORS, collector="gpu") == 1
    assert {dict(ls)["gpu"] for n, ls in s if n == "DCGM_FI_DEV_GPU_UTIL"} == {
        "0",
        "1",
        "2",
        "3",
        "5",
        "6",
        "7",
    }


def test_unsupported_queries_are_left_out_without_errors():
    nvml = FakeNvml.with_gpus(1, "NVIDIA GeForce RTX 4090")
    nvml.gpus[0].memory_temperature_c = None
    nvml.gpus[0].ecc_uncorrected = None
    nvml.gpus[0].nvlink_links = 0
    errors = CollectorErrors()
    s = scrape(_collector(nvml, errors=errors), errors)
    got = names(s)
    assert "DCGM_FI_DEV_GPU_TEMP" in got
    assert not got & {
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    }
    assert errors.count("gpu") == 0
