"""The compatibility table against published combinations, and the matrix checked by it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensoryard.errors import ConfigError
from tensoryard.images.compat import (
    CUDA_FAMILY_MIN_DRIVER,
    CUDA_TOOLKIT_MIN_DRIVER,
    PYPI_TORCH,
    Combination,
    incompatibilities,
    torch_cuda_builds,
    version_tuple,
)
from tensoryard.images.matrix import default_matrix, load_matrix, parse_matrix

# Recorded from PyPI by images/tools/pypi_torch_wheels.py (each wheel's METADATA and version.py).
PUBLISHED = json.loads((Path(__file__).with_name("pypi_torch_wheels.json")).read_text())["wheels"]


@pytest.mark.parametrize("wheel", PUBLISHED, ids=[f"torch {w['torch']}" for w in PUBLISHED])
def test_the_table_matches_what_the_pypi_wheel_pins(wheel: dict[str, object]) -> None:
    row = PYPI_TORCH[str(wheel["torch"])]
    assert row.cuda == wheel["cuda"]
    assert row.nccl == wheel["nccl"]
    assert row.cudnn == wheel["cudnn"]
    assert [f"cp{p.replace('.', '')}" for p in row.pythons] == wheel["python_tags"]


@pytest.mark.parametrize("wheel", PUBLISHED, ids=[f"torch {w['torch']}" for w in PUBLISHED])
def test_every_published_pypi_wheel_is_accepted(wheel: dict[str, object]) -> None:
    cuda = str(wheel["cuda"])
    combo = Combination(
        torch=str(wheel["torch"]),
        python="3.11",
        cuda=cuda,
        nccl=str(wheel["nccl"]),
        cudnn=str(wheel["cudnn"]),
        min_driver=CUDA_TOOLKIT_MIN_DRIVER.get(cuda, "999.0"),
    )
    assert incompatibilities(combo) == []


# Published builds from PyTorch's RELEASE.md compatibility matrix (download.pytorch.org).
RELEASE_MD = [("2.4.1", "11.8"), ("2.6.0", "12.6"), ("2.7.1", "11.8"), ("2.9.1", "13.0")]


@pytest.mark.parametrize(("torch", "cuda"), RELEASE_MD, ids=[f"{t}+cu{c}" for t, c in RELEASE_MD])
def test_a_published_download_pytorch_org_build_is_accepted(torch: str, cuda: str) -> None:
    combo = Combination(torch, "3.11", cuda, min_driver=CUDA_TOOLKIT_MIN_DRIVER[cuda])
    assert incompatibilities(combo) == []


IMPOSSIBLE = {
    "torch 2.13 built for CUDA 11.8 (never published)": (
        Combination("2.13.0", "3.11", "11.8", min_driver="520.61.05"),
        "no published CUDA 11.8 build",
    ),
    "torch 2.8 for CUDA 11.8 (dropped in 2.8)": (
        Combination("2.8.0", "3.11", "11.8", min_driver="520.61.05"),
        "no published CUDA 11.8 build",
    ),
    "torch 2.13 with an NCCL it does not pin": (
        Combination("2.13.0", "3.11", "13.0", nccl="2.27.5", min_driver="580.65.06"),
        "pins NCCL 2.29.7, not 2.27.5",
    ),
    "torch 2.13 with a cuDNN it does not pin": (
        Combination("2.13.0", "3.11", "13.0", cudnn="9.10.2.21", min_driver="580.65.06"),
        "pins cuDNN 9.20.0.48",
    ),
    "CUDA 13.0 on an R570 driver": (
        Combination("2.13.0", "3.11", "13.0", min_driver="570.86.10"),
        "below what CUDA 13.0 needs",
    ),
    "CUDA 12.8 on an R520 driver": (
        Combination("2.10.0", "3.11", "12.8", min_driver="520.61.05"),
        "CUDA 12.x needs driver >= 525.60.13",
    ),
    "a CUDA image without a minimum driver": (
        Combination("2.13.0", "3.11", "13.0"),
        "without min_driver",
    ),
    "torch 2.13 on Python 3.9": (
        Combination("2.13.0", "3.9", None),
        "no wheel for Python 3.9",
    ),
    "torch 2.4 on Python 3.13": (
        Combination("2.4.1", "3.13", "12.1", min_driver="530.30.02"),
        "no wheel for Python 3.13",
    ),
    "an unknown torch release": (Combination("1.13.1", "3.11", None), "not in the compatibility"),
    "a CPU image that declares NCCL": (
        Combination("2.13.0", "3.11", None, nccl="2.29.7"),
        "CPU image (cuda: null) declares nccl",
    ),
}


@pytest.mark.parametrize(
    ("combo", "reason"), list(IMPOSSIBLE.values()), ids=[f"refuses {k}" for k in IMPOSSIBLE]
)
def test_an_impossible_combination_is_refused_with_its_reason(
    combo: Combination, reason: str
) -> None:
    reasons = incompatibilities(combo)
    assert any(reason in r for r in reasons), reasons


def test_the_cuda_builds_of_a_release_join_both_sources() -> None:
    assert torch_cuda_builds("2.9.1") == ("12.6", "12.8", "13.0")
    assert torch_cuda_builds("2.13.0") == ("13.0",)


def test_driver_tables_agree_with_each_other() -> None:
    for cuda, driver in CUDA_TOOLKIT_MIN_DRIVER.items():
        family_floor = CUDA_FAMILY_MIN_DRIVER[cuda.split(".")[0]]
        assert version_tuple(driver) >= version_tuple(family_floor), cuda


def test_the_shipped_matrix_is_valid_and_pins_the_project_torch() -> None:
    matrix = default_matrix()
    assert matrix.get("cpu").torch == "2.13.0"
    assert matrix.get("cpu").cuda is None
    gpu = matrix.get("pytorch-2.13-cu130")
    assert (gpu.cuda, gpu.nccl, gpu.cudnn) == ("13.0", "2.29.7", "9.20.0.48")
    assert matrix.get("control-plane").torch is None


def test_the_repo_matrix_file_is_the_shipped_one() -> None:
    repo_file = Path(__file__).parents[3] / "images" / "matrix.yaml"
    assert load_matrix(repo_file) == default_matrix()


def test_an_impossible_matrix_entry_is_refused_naming_it() -> None:
    raw = {
        "entries": {
            "pytorch-2.13-cu118": {
                "torch": "2.13.0",
                "python": "3.11",
                "cuda": "11.8",
                "min_driver": "520.61.05",
                "gpu": True,
            }
        }
    }
    with pytest.raises(ConfigError) as err:
        parse_matrix(raw, "m.yaml")
    assert "entries.pytorch-2.13-cu118" in str(err.value)
    assert "no published CUDA 11.8 build" in str(err.value)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"flavour": "inference"}, "flavour"),
        ({"torch": "2.13.0", "colour": "red"}, "unknown field(s) colour"),
        ({"torch": "2.13.0", "layers": {"deepspeed": "1"}}, "layers: unknown deepspeed"),
        ({"torch": "2.13.0", "gpu": True}, "gpu: true needs a CUDA image"),
        ({"flavour": "train", "torch": None}, "a train image needs torch"),
        (
            {"torch": "2.13.0", "cuda": "13.0", "min_driver": "580.65.06", "prune_unlinked": True},
            "prune_unlinked: only for CPU images",
        ),
    ],
    ids=[
        "an unknown flavour",
        "an unknown field",
        "an unknown layer",
        "a GPU image without CUDA",
        "a train image without torch",
        "pruning CUDA files from a GPU image",
    ],
)
def test_a_malformed_entry_names_the_field(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_matrix({"entries": {"x": entry}})
    assert "entries.x" in str(err.value)
    assert message in str(err.value)
