"""The software compatibility table: GPU architecture / driver / CUDA / PyTorch / NCCL.

Every row is a published fact; the URL next to each table is where it comes from. The table is
deliberately conservative: a driver must be at least the version the CUDA toolkit release
shipped with (CUDA's "minor version compatibility" lets older drivers of the same major run
some programs, with limits on PTX JIT, so it is not relied on here). A combination the table
does not know (a newer PyTorch, an unknown GPU) is rejected with the fix "add a row", never
guessed.

`check_stack` returns one FieldIssue per impossible pair; each message names both sides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tensoryard.errors import FieldIssue

__all__ = [
    "ARCH_CUDA_RANGE",
    "CUDA_MIN_DRIVER",
    "GPU_MODELS",
    "PYTORCH_CUDA_BUILDS",
    "GpuModel",
    "SoftwareStack",
    "Version",
    "check_stack",
    "gpu_model_info",
    "parse_version",
]

Version = tuple[int, ...]
_VERSION_RE = re.compile(r"^\s*v?(\d+(?:\.\d+){0,3})\s*$")


def parse_version(text: str) -> Version | None:
    """'570.133.20' -> (570, 133, 20); None when it is not dotted numbers."""
    match = _VERSION_RE.match(str(text))
    if match is None:
        return None
    return tuple(int(p) for p in match.group(1).split("."))


def _show(v: Version) -> str:
    return ".".join(str(p) for p in v)


def _show_driver(v: Version) -> str:
    """Driver versions pad every part after the first to two digits: 535.54.03."""
    return ".".join([str(v[0]), *(f"{p:02d}" for p in v[1:])])


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model the platform knows.

    Attributes:
        name: short model name the scheduler matches on (tensoryard.agent.inventory.gpu_model).
        architecture: NVIDIA architecture name.
        compute_capability: (major, minor).
        memory_gib: memory per GPU.
        nvlink_gbps: NVLink bandwidth per GPU, GB/s (both directions); 0 when none.
        busbw_floor_gbps: all-reduce bus bandwidth (GB/s) below which preflight fails an 8-GPU
            NVLink node; about 60% of the nccl-tests figures NVIDIA publishes for the platform.
    """

    name: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_gib: int
    nvlink_gbps: int
    busbw_floor_gbps: float


# Compute capabilities: https://developer.nvidia.com/cuda-gpus
# NVLink bandwidth per GPU: the product pages / datasheets
#   https://www.nvidia.com/en-us/data-center/a100/ (600 GB/s)
#   https://www.nvidia.com/en-us/data-center/h100/ and /h200/ (900 GB/s)
#   https://www.nvidia.com/en-us/data-center/dgx-b200/ (1.8 TB/s per GPU, NVLink 5)
#   https://www.nvidia.com/en-us/data-center/v100/ (300 GB/s)
# Bus-bandwidth floors are ours (about 60% of what a healthy 8-GPU NVSwitch node reaches in
# nccl-tests all_reduce_perf at large sizes); a node below them has a link or switch problem.
GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("V100", "Volta", (7, 0), 32, 300, 80.0),
        GpuModel("A100", "Ampere", (8, 0), 80, 600, 140.0),
        GpuModel("A10", "Ampere", (8, 6), 24, 0, 0.0),
        GpuModel("L4", "Ada", (8, 9), 24, 0, 0.0),
        GpuModel("L40S", "Ada", (8, 9), 48, 0, 0.0),
        GpuModel("H100", "Hopper", (9, 0), 80, 900, 270.0),
        GpuModel("H200", "Hopper", (9, 0), 141, 900, 270.0),
        GpuModel("B200", "Blackwell", (10, 0), 180, 1800, 480.0),
    )
}

# First and last CUDA toolkit able to build for an architecture (None: still supported).
# - Ampere sm_80: CUDA 11.0; sm_86: CUDA 11.1 (CUDA 11.x release notes,
#   https://docs.nvidia.com/cuda/archive/11.1.0/cuda-toolkit-release-notes/index.html).
# - Ada sm_89 and Hopper sm_90: CUDA 11.8
#   (https://docs.nvidia.com/cuda/archive/11.8.0/cuda-toolkit-release-notes/index.html).
# - Blackwell sm_100: CUDA 12.8
#   (https://docs.nvidia.com/cuda/archive/12.8.0/cuda-toolkit-release-notes/index.html).
# - CUDA 13.0 removed Maxwell, Pascal and Volta from offline compilation and the libraries
#   (https://docs.nvidia.com/cuda/archive/13.0.0/cuda-toolkit-release-notes/index.html).
ARCH_CUDA_RANGE: dict[tuple[int, int], tuple[Version, Version | None]] = {
    (7, 0): ((9, 0), (12, 9)),
    (8, 0): ((11, 0), None),
    (8, 6): ((11, 1), None),
    (8, 9): ((11, 8), None),
    (9, 0): ((11, 8), None),
    (10, 0): ((12, 8), None),
}

# Minimum Linux x86_64 driver per CUDA toolkit release (the GA release of each minor version):
# "CUDA Toolkit and Corresponding Driver Versions",
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html (Table 3). The 11.x rows
# were checked against a copy of that table; the 12.x/13.0 rows were written from it without a
# copy at hand: re-check them there when adding a row.
CUDA_MIN_DRIVER: dict[Version, Version] = {
    (11, 0): (450, 51, 5),
    (11, 1): (455, 23),
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}

# CUDA builds of the official PyTorch wheels, and the NCCL they bundle (nvidia-nccl-cu12 pin).
# https://pytorch.org/get-started/previous-versions/ and the release notes at
# https://github.com/pytorch/pytorch/releases . Newer PyTorch releases need a row added here.
PYTORCH_CUDA_BUILDS: dict[Version, tuple[Version, ...]] = {
    (2, 1): ((11, 8), (12, 1)),
    (2, 2): ((11, 8), (12, 1)),
    (2, 3): ((11, 8), (12, 1)),
    (2, 4): ((11, 8), (12, 1), (12, 4)),
    (2, 5): ((11, 8), (12, 1), (12, 4)),
    (2, 6): ((11, 8), (12, 4), (12, 6)),
    (2, 7): ((11, 8), (12, 6), (12, 8)),
    (2, 8): ((12, 6), (12, 8), (12, 9)),
    (2, 9): ((12, 6), (12, 8), (13, 0)),
    # 2.10-2.13: the "Release Compatibility Matrix" of pytorch/pytorch RELEASE.md, stable and
    # experimental builds together; 13.2 builds are left out until CUDA_MIN_DRIVER has 13.2.
    (2, 10): ((12, 6), (12, 8), (13, 0)),
    (2, 11): ((12, 6), (12, 8), (13, 0)),
    (2, 12): ((12, 6), (13, 0)),
    (2, 13): ((12, 6), (13, 0)),
}

# NCCL: Blackwell (sm_100) support arrived in NCCL 2.25.1
# (https://docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-25-1.html); older NCCL has no
# kernels for it. Only hard incompatibilities are listed (slower paths are not rejected).
NCCL_MIN_FOR_ARCH: dict[tuple[int, int], Version] = {
    (10, 0): (2, 25, 1),
}


@dataclass(frozen=True, slots=True)
class SoftwareStack:
    """The versions a cluster runs (as written in the inventory)."""

    driver: str
    cuda: str
    pytorch: str
    nccl: str


def gpu_model_info(name: str) -> GpuModel | None:
    """The table row for a short model name, or None."""
    return GPU_MODELS.get(name)


def _major_minor(v: Version) -> Version:
    return v[:2] if len(v) >= 2 else (v[0], 0)


def _parse(field: str, text: str, issues: list[FieldIssue], example: str) -> Version | None:
    version = parse_version(text)
    if version is None:
        issues.append(
            FieldIssue(field, f"cannot read version {text!r}", f"write it like {example}")
        )
    return version


def check_stack(
    stack: SoftwareStack, gpu_models: list[str], *, prefix: str = "cluster.software"
) -> list[FieldIssue]:
    """Every impossible combination in `stack` for these GPU models (empty list: compatible)."""
    issues: list[FieldIssue] = []
    driver = _parse(f"{prefix}.driver", stack.driver, issues, "'570.133.20'")
    cuda = _parse(f"{prefix}.cuda", stack.cuda, issues, "'12.8'")
    torch = _parse(f"{prefix}.pytorch", stack.pytorch, issues, "'2.7'")
    nccl = _parse(f"{prefix}.nccl", stack.nccl, issues, "'2.26.2'")
    if cuda is not None:
        cuda = _major_minor(cuda)
        if driver is not None:
            _check_driver(prefix, driver, cuda, issues)
        if torch is not None:
            _check_pytorch(prefix, _major_minor(torch), cuda, issues)
        for model in gpu_models:
            _check_arch(prefix, model, cuda, nccl, issues)
    return issues


def _check_driver(prefix: str, driver: Version, cuda: Version, issues: list[FieldIssue]) -> None:
    need = CUDA_MIN_DRIVER.get(cuda)
    if need is None:
        known = ", ".join(_show(v) for v in CUDA_MIN_DRIVER)
        issues.append(
            FieldIssue(
                f"{prefix}.cuda",
                f"CUDA {_show(cuda)} is not in the compatibility table (known: {known})",
                "pick a listed CUDA release, or add its minimum driver to "
                "tensoryard.cluster.compat.CUDA_MIN_DRIVER citing NVIDIA's release notes",
            )
        )
        return
    if driver < need:
        ok = [_show(c) for c, d in CUDA_MIN_DRIVER.items() if d <= driver]
        issues.append(
            FieldIssue(
                f"{prefix}.driver",
                f"driver {_show_driver(driver)} is too old for CUDA {_show(cuda)}, which needs "
                f"driver >= {_show_driver(need)}",
                f"upgrade the driver to {_show_driver(need)} or newer, or use CUDA "
                f"{ok[-1] if ok else '(none fits)'} or older",
            )
        )


def _check_pytorch(prefix: str, torch: Version, cuda: Version, issues: list[FieldIssue]) -> None:
    builds = PYTORCH_CUDA_BUILDS.get(torch)
    if builds is None:
        known = ", ".join(_show(v) for v in PYTORCH_CUDA_BUILDS)
        issues.append(
            FieldIssue(
                f"{prefix}.pytorch",
                f"PyTorch {_show(torch)} is not in the compatibility table (known: {known})",
                "pick a listed release, or add a row to "
                "tensoryard.cluster.compat.PYTORCH_CUDA_BUILDS citing its release notes",
            )
        )
        return
    if cuda not in builds:
        shown = ", ".join(_show(b) for b in builds)
        issues.append(
            FieldIssue(
                f"{prefix}.pytorch",
                f"PyTorch {_show(torch)} has no wheel built for CUDA {_show(cuda)} "
                f"(its CUDA builds: {shown})",
                f"use CUDA {shown.split(', ')[-1]} or pick a PyTorch release built for "
                f"CUDA {_show(cuda)}",
            )
        )


def _check_arch(
    prefix: str, model: str, cuda: Version, nccl: Version | None, issues: list[FieldIssue]
) -> None:
    info = GPU_MODELS.get(model)
    if info is None:
        return  # unknown models are reported by the inventory, where the field is known
    low, high = ARCH_CUDA_RANGE[info.compute_capability]
    major, minor = info.compute_capability
    where = f"{model} ({info.architecture}, sm_{major}{minor})"
    if cuda < low:
        issues.append(
            FieldIssue(
                f"{prefix}.cuda",
                f"CUDA {_show(cuda)} cannot build for {where}, which needs CUDA >= {_show(low)}",
                f"use CUDA {_show(low)} or newer",
            )
        )
    if high is not None and cuda > high:
        issues.append(
            FieldIssue(
                f"{prefix}.cuda",
                f"CUDA {_show(cuda)} dropped {where}; the last CUDA for it is {_show(high)}",
                f"use CUDA {_show(high)} or older on these nodes",
            )
        )
    need = NCCL_MIN_FOR_ARCH.get(info.compute_capability)
    if nccl is not None and need is not None and nccl < need:
        issues.append(
            FieldIssue(
                f"{prefix}.nccl",
                f"NCCL {_show(nccl)} is too old for {where}, which needs NCCL >= {_show(need)}",
                f"upgrade NCCL to {_show(need)} or newer",
            )
        )
