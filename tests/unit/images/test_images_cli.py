"""`tyard images`: list, resolve and bad input, through the real CLI (no builds here)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app
from tensoryard.images.builder import _wheel_requires, env_defaults
from tensoryard.images.matrix import default_matrix
from tensoryard.images.operate import push_destination, resolve_manifest

TORCH_METADATA = """Metadata-Version: 2.1
Name: torch
Version: 2.13.0
Requires-Dist: filelock
Requires-Dist: cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"
Requires-Dist: nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"
Requires-Dist: nvidia-nccl-cu13=={nccl}; platform_system == "Linux"
Requires-Dist: triton==3.7.1; platform_system == "Linux" and python_version < "3.15"
Requires-Dist: cuda-bindings<14,>=13.0.3; platform_system == "Linux"
Requires-Dist: opt-einsum>=3.3; extra == "opt-einsum"
Requires-Dist: pywin32; platform_system == "Windows"
"""


def _torch_wheel(wheels: Path, *, nccl: str = "2.29.7", cuda: str = "13.0") -> Path:
    """A wheel file laid out like torch's (METADATA, torch/version.py) with chosen pins."""
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("torch-2.13.0.dist-info/METADATA", TORCH_METADATA.format(nccl=nccl))
        archive.writestr("torch/version.py", f"cuda: Optional[str] = '{cuda}'\n")
    return path


def test_requirements_are_read_for_linux_without_extras(tmp_path: Path) -> None:
    names = [r.name for r in _wheel_requires(_torch_wheel(tmp_path))]
    assert names == [
        "filelock",
        "cuda-toolkit",
        "nvidia-cudnn-cu13",
        "nvidia-nccl-cu13",
        "triton",
        "cuda-bindings",
    ]


def test_the_resolved_manifest_of_the_gpu_image_agrees_with_its_wheel(tmp_path: Path) -> None:
    _torch_wheel(tmp_path)
    report = resolve_manifest(default_matrix().get("pytorch-2.13-cu130"), tmp_path)
    assert report["problems"] == []
    assert report["resolved"]["nccl"] == "2.29.7"


def test_a_wheel_that_pins_another_nccl_is_reported(tmp_path: Path) -> None:
    _torch_wheel(tmp_path, nccl="2.30.7", cuda="13.2")
    report = resolve_manifest(default_matrix().get("pytorch-2.13-cu130"), tmp_path)
    assert any("pins nccl 2.30.7, the matrix says 2.29.7" in p for p in report["problems"])
    assert any("built for CUDA 13.2" in p for p in report["problems"])


def test_the_cpu_image_prunes_only_what_torch_requires(tmp_path: Path) -> None:
    _torch_wheel(tmp_path)
    assert resolve_manifest(default_matrix().get("cpu"), tmp_path)["problems"] == []


def test_cli_list_json_names_every_entry_with_its_reference() -> None:
    result = CliRunner().invoke(app, ["images", "list", "--json", "--registry", "r.example/ml"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == set(default_matrix().entries)
    assert rows["cpu"]["ref"].startswith("r.example/ml/cpu:")


def test_cli_resolve_exits_1_with_the_problem_when_the_wheel_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TYARD_IMAGES_CACHE", str(tmp_path))
    result = CliRunner().invoke(app, ["images", "resolve", "pytorch-2.13-cu130", "--json"])
    assert result.exit_code == 1
    assert "wheel is not in" in json.loads(result.stdout)["problems"][0]


def test_cli_refuses_an_unknown_image_with_exit_2_and_the_known_names() -> None:
    result = CliRunner().invoke(app, ["images", "build", "pytorch-2.13-cu12x"])
    assert result.exit_code != 0
    assert "no image 'pytorch-2.13-cu12x' in the matrix" in result.output
    assert "cpu" in result.output


def test_cli_refuses_a_bad_matrix_file_naming_the_entry(tmp_path: Path) -> None:
    bad = tmp_path / "m.yaml"
    bad.write_text("entries:\n  x:\n    torch: '2.13.0'\n    cuda: '11.8'\n    min_driver: '1'\n")
    result = CliRunner().invoke(app, ["images", "list", "--matrix", str(bad)])
    assert result.exit_code != 0
    assert "entries.x" in result.output and "no published CUDA 11.8 build" in result.output


def test_push_destinations() -> None:
    assert push_destination("cpu", "registry.example.com:5000/ml", "0.1.0") == (
        "docker://registry.example.com:5000/ml/cpu:0.1.0"
    )
    assert push_destination("cpu", "oci:/tmp/layout:cpu", "0.1.0") == "oci:/tmp/layout:cpu"


def test_cli_push_refuses_a_bad_registry_with_exit_2() -> None:
    result = CliRunner().invoke(app, ["images", "push", "cpu", "Registry Example/ml"])
    assert result.exit_code == 2
    assert "REGISTRY" in result.output and "whitespace" in result.output


def test_env_defaults_are_for_nccl_and_torch() -> None:
    defaults = env_defaults()
    assert defaults["NCCL_IB_TIMEOUT"] == "22"
    assert all(k.startswith(("NCCL_", "TORCH_", "PYTORCH_", "CUDA_")) for k in defaults)
