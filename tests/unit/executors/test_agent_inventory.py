"""Machine inventory through NVML (faked: there are no GPUs here)."""

from __future__ import annotations

import os

import pytest

from tensoryard.agent.fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml
from tensoryard.agent.inventory import collect_inventory, gpu_model


def test_without_nvml_the_machine_has_cpu_slots_and_memory_but_no_gpus() -> None:
    inv = collect_inventory(load=lambda: None, hostname=lambda: "node-1")
    assert inv.hostname == "node-1"
    assert inv.cpu_slots == len(os.sched_getaffinity(0))
    assert inv.memory_bytes > 0
    assert inv.gpus == [] and inv.nvml_error == ""


def test_nvml_lists_every_gpu_with_uuid_model_and_memory() -> None:
    nvml = FakeNvml.with_gpus(8, "NVIDIA H100 80GB HBM3")
    inv = collect_inventory(nvml)
    assert [g.index for g in inv.gpus] == list(range(8))
    assert {g.model for g in inv.gpus} == {"H100"}
    assert len({g.uuid for g in inv.gpus}) == 8
    assert all(g.memory_bytes == 80 * 1024**3 and g.healthy for g in inv.gpus)
    assert not nvml.initialized  # NVML was shut down again


def test_a_driver_that_is_not_loaded_means_no_gpus_with_the_reason() -> None:
    nvml = FakeNvml.with_gpus(2)
    nvml.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    inv = collect_inventory(nvml)
    assert inv.gpus == []
    assert inv.nvml_error == "NVML unavailable: Driver Not Loaded"


def test_the_real_nvml_module_without_a_driver_reports_no_gpus() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    inv = collect_inventory(pynvml)
    if inv.gpus:
        pytest.skip("this machine has GPUs; the no-driver path cannot be checked here")
    assert inv.nvml_error.startswith("NVML unavailable")


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ({"ecc_uncorrected": 2}, "2 uncorrected ECC error(s) since the last driver load"),
        ({"retired_pages_pending": True}, "retired memory pages pending: reset the GPU"),
        ({"lost": True}, "GPU is lost"),
    ],
    ids=[
        "uncorrected ecc errors make a gpu unhealthy",
        "pages waiting for retirement make a gpu unhealthy",
        "a gpu that fell off the bus is unhealthy",
    ],
)
def test_faulty_gpus_are_reported_unhealthy_with_the_reason(
    fault: dict[str, object], reason: str
) -> None:
    nvml = FakeNvml.with_gpus(4)
    for name, value in fault.items():
        setattr(nvml.gpus[2], name, value)
    inv = collect_inventory(nvml)
    assert [g.index for g in inv.healthy_gpus] == [0, 1, 3]
    assert not inv.gpus[2].healthy
    assert inv.gpus[2].health_reason == reason


def test_a_gpu_without_ecc_support_is_still_healthy() -> None:
    nvml = FakeNvml.with_gpus(1, "NVIDIA GeForce RTX 4090")
    nvml.gpus[0].ecc_uncorrected = None
    inv = collect_inventory(nvml)
    assert inv.gpus[0].healthy and inv.gpus[0].model == "4090"


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA RTX A6000", "A6000"),
    ],
    ids=[
        "h100 with memory and hbm suffix",
        "h200 plain",
        "a100 with form factor",
        "a10g keeps its letter",
        "l40s keeps its letter",
        "tesla t4",
        "tesla v100",
        "gb200 superchip",
        "rtx a6000 workstation card",
    ],
)
def test_gpu_models_are_shortened_for_scheduling(name: str, model: str) -> None:
    assert gpu_model(name) == model
