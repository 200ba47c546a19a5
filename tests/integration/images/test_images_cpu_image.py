"""The CPU image, built for real (debootstrap + umoci), checked in its rootfs and in containerd."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tensoryard import __version__
from tensoryard.images.builder import IMAGE_JSON, BuildResult, build, env_defaults
from tensoryard.images.matrix import default_matrix
from tensoryard.images.operate import built_rootfs, check_in_rootfs, push, push_source

pytestmark = pytest.mark.slow


def _config(archive: str) -> dict[str, object]:
    out = subprocess.run(
        ["skopeo", "inspect", "--config", f"oci-archive:{archive}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def test_an_unchanged_image_is_not_rebuilt(cpu_image: BuildResult) -> None:
    again = build(default_matrix().get("cpu"))
    assert again.cached
    assert (again.key, again.layers) == (cpu_image.key, cpu_image.layers)


def test_the_image_runs_as_a_non_root_user_with_labelled_env_defaults(
    cpu_image: BuildResult,
) -> None:
    config = _config(cpu_image.archive)
    inner = config["config"]
    assert isinstance(inner, dict)
    assert inner["User"] == "1000:1000"
    env = dict(item.split("=", 1) for item in inner["Env"])
    labels = inner["Labels"]
    for key, value in env_defaults().items():
        assert env[key] == value
        assert labels[f"org.tensoryard.env-default.{key}"] == value
    assert labels["org.tensoryard.torch"] == "2.13.0"
    assert "torch==2.13.0" in labels["org.tensoryard.python-packages"]
    assert config["created"] == "2026-01-01T00:00:00Z"


def test_the_image_records_its_packages_and_carries_this_tensoryard(
    cpu_image: BuildResult,
) -> None:
    _, rootfs = built_rootfs("cpu")
    manifest = json.loads((rootfs / IMAGE_JSON.lstrip("/")).read_text())
    packages = manifest["python_packages"]
    assert packages["torch"] == "2.13.0"
    assert packages["tensoryard"] == __version__
    assert "triton" not in packages  # pruned: torch imports and trains on the CPU without it
    assert any(p.startswith("python3=") for p in manifest["debian_packages"])


def test_check_passes_in_the_image_rootfs_with_a_gloo_all_reduce(cpu_image: BuildResult) -> None:
    _, rootfs = built_rootfs("cpu")
    findings = {f["check"]: f for f in check_in_rootfs(rootfs)}
    assert all(f["ok"] for f in findings.values()), findings
    assert findings["torch"]["detail"].startswith("2.13.0")
    assert findings["allreduce"]["detail"] == "gloo, 2 processes, sum 3"


def test_containerd_imports_the_archive_and_runs_the_check(
    cpu_image: BuildResult,
    containerd: Any,  # conftest.Containerd
) -> None:
    imported = containerd.ctr("images", "import", cpu_image.archive)
    assert imported.returncode == 0, imported.stderr
    listed = containerd.ctr("images", "ls", "-q")
    assert cpu_image.ref in listed.stdout.split(), listed.stdout
    run = containerd.ctr(
        "run",
        "--rm",
        "--net-host",
        cpu_image.ref,
        "tyard-images-check",
        "tyard",
        "images",
        "check",
        "--inside",
        "--json",
    )
    assert run.returncode == 0, run.stdout + run.stderr + containerd.tail()
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["ok"], report


def test_push_copies_the_image_with_skopeo(cpu_image: BuildResult, tmp_path: Path) -> None:
    # From the layout kept beside the archive: no multi-GB unpacking into TMPDIR first.
    assert push_source(Path(cpu_image.archive)).startswith("oci:")
    destination = push(Path(cpu_image.archive), f"oci:{tmp_path / 'layout'}:cpu")
    inspected = subprocess.run(
        ["skopeo", "inspect", destination], capture_output=True, text=True, check=True
    )
    assert json.loads(inspected.stdout)["Layers"] == cpu_image.layers
