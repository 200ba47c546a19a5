"""The compatibility table rejects impossible combinations, naming both sides."""

from __future__ import annotations

import pytest

from tensoryard.cluster.compat import (
    ARCH_CUDA_RANGE,
    CUDA_MIN_DRIVER,
    GPU_MODELS,
    PYTORCH_CUDA_BUILDS,
    SoftwareStack,
    check_stack,
    parse_version,
)

GOOD = SoftwareStack(driver="570.133.20", cuda="12.8", pytorch="2.7", nccl="2.26.2")


def _stack(**changes: str) -> SoftwareStack:
    values = {"driver": GOOD.driver, "cuda": GOOD.cuda, "pytorch": GOOD.pytorch, "nccl": GOOD.nccl}
    return SoftwareStack(**(values | changes))


def test_a_current_hopper_and_blackwell_stack_is_accepted() -> None:
    assert check_stack(GOOD, ["H100", "B200", "L40S", "A100"]) == []


@pytest.mark.parametrize(
    ("changes", "models", "field", "both_sides"),
    [
        pytest.param(
            {"driver": "535.54.03"},
            ["H100"],
            "driver",
            ("driver 535.54.03", "CUDA 12.8"),
            id="a 535 driver cannot run CUDA 12.8",
        ),
        pytest.param(
            {"cuda": "12.4", "driver": "550.54.14", "pytorch": "2.5"},
            ["B200"],
            "cuda",
            ("CUDA 12.4", "B200 (Blackwell"),
            id="Blackwell needs CUDA 12.8",
        ),
        pytest.param(
            {"cuda": "13.0", "driver": "580.65.06", "pytorch": "2.9"},
            ["V100"],
            "cuda",
            ("CUDA 13.0", "V100 (Volta"),
            id="CUDA 13 dropped Volta",
        ),
        pytest.param(
            {"pytorch": "2.3"},
            ["H100"],
            "pytorch",
            ("PyTorch 2.3", "CUDA 12.8"),
            id="PyTorch 2.3 has no CUDA 12.8 wheel",
        ),
        pytest.param(
            {"nccl": "2.21.5"},
            ["B200"],
            "nccl",
            ("NCCL 2.21.5", "B200"),
            id="Blackwell needs NCCL 2.25",
        ),
    ],
)
def test_an_impossible_combination_names_both_sides(
    changes: dict[str, str], models: list[str], field: str, both_sides: tuple[str, str]
) -> None:
    issues = check_stack(_stack(**changes), models)
    assert [i.path for i in issues] == [f"cluster.software.{field}"]
    assert all(side in issues[0].message for side in both_sides), issues[0].message
    assert issues[0].fix


def test_versions_the_table_does_not_know_are_rejected_not_guessed() -> None:
    issues = check_stack(_stack(pytorch="2.99", cuda="12.7"), ["H100"])
    messages = " | ".join(i.message for i in issues)
    assert "CUDA 12.7 is not in the compatibility table" in messages
    assert "PyTorch 2.99 is not in the compatibility table" in messages


def test_unreadable_versions_name_the_field_and_the_form() -> None:
    issues = check_stack(_stack(driver="latest"), ["H100"])
    assert issues[0].path == "cluster.software.driver"
    assert "'570.133.20'" in issues[0].fix


def test_the_table_is_internally_consistent() -> None:
    assert parse_version("570.26") == (570, 26)
    for model in GPU_MODELS.values():
        assert model.compute_capability in ARCH_CUDA_RANGE, model.name
    drivers = list(CUDA_MIN_DRIVER.values())
    assert drivers == sorted(drivers), "newer CUDA never needs an older driver"
    for torch, builds in PYTORCH_CUDA_BUILDS.items():
        assert all(b in CUDA_MIN_DRIVER for b in builds), torch
