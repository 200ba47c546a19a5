"""Which torch, CUDA, cuDNN, NCCL, Python and driver versions go together.

Sources (the tests in ``tests/unit/images`` check the tables against them):

* PyPI's torch wheels, https://pypi.org/simple/torch/ : each Linux wheel's ``METADATA`` pins the
  CUDA libraries it loads (``nvidia-nccl-cu1x==...``, ``nvidia-cudnn-cu1x==...``) and its
  ``torch/version.py`` names its CUDA; the Python tags come from the file names. Recorded by
  ``images/tools/pypi_torch_wheels.py`` into ``tests/unit/images/pypi_torch_wheels.json``.
* PyTorch's release compatibility matrix (the other CUDA builds on download.pytorch.org),
  https://github.com/pytorch/pytorch/blob/main/RELEASE.md#release-compatibility-matrix
  (2.4 to 2.9; later releases are listed here only with their PyPI build).
* NVIDIA's CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions" and
  "Minimum Required Driver Version for CUDA Minor Version Compatibility",
  https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html

A combination absent from these tables is refused: the message says what is known instead.
Pure functions; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CUDA_FAMILY_MIN_DRIVER",
    "CUDA_TOOLKIT_MIN_DRIVER",
    "PYPI_TORCH",
    "TORCH_INDEX_CUDA",
    "Combination",
    "PypiTorch",
    "incompatibilities",
    "torch_cuda_builds",
    "version_tuple",
]


@dataclass(frozen=True)
class PypiTorch:
    """What one torch release's PyPI (Linux x86_64) wheel carries and pins."""

    cuda: str
    nccl: str
    cudnn: str
    pythons: tuple[str, ...]


# torch release -> its PyPI wheel (from the wheels' METADATA; see the module docstring).
PYPI_TORCH: dict[str, PypiTorch] = {
    "2.4.1": PypiTorch("12.1", "2.20.5", "9.1.0.70", ("3.8", "3.9", "3.10", "3.11", "3.12")),
    "2.5.1": PypiTorch("12.4", "2.21.5", "9.1.0.70", ("3.9", "3.10", "3.11", "3.12", "3.13")),
    "2.6.0": PypiTorch("12.4", "2.21.5", "9.1.0.70", ("3.9", "3.10", "3.11", "3.12", "3.13")),
    "2.7.1": PypiTorch("12.6", "2.26.2", "9.5.1.17", ("3.9", "3.10", "3.11", "3.12", "3.13")),
    "2.8.0": PypiTorch("12.8", "2.27.3", "9.10.2.21", ("3.9", "3.10", "3.11", "3.12", "3.13")),
    "2.9.1": PypiTorch("12.8", "2.27.5", "9.10.2.21", ("3.10", "3.11", "3.12", "3.13", "3.14")),
    "2.10.0": PypiTorch("12.8", "2.27.5", "9.10.2.21", ("3.10", "3.11", "3.12", "3.13", "3.14")),
    "2.11.0": PypiTorch("13.0", "2.28.9", "9.19.0.56", ("3.10", "3.11", "3.12", "3.13", "3.14")),
    "2.12.1": PypiTorch("13.0", "2.29.7", "9.20.0.48", ("3.10", "3.11", "3.12", "3.13", "3.14")),
    "2.13.0": PypiTorch("13.0", "2.29.7", "9.20.0.48", ("3.10", "3.11", "3.12", "3.13", "3.14")),
    "2.14.1": PypiTorch("13.0", "2.30.7", "9.24.0.43", ("3.10", "3.11", "3.12", "3.13", "3.14")),
    "2.15.0": PypiTorch("13.2", "2.30.7", "9.26.0.51", ("3.11", "3.12", "3.13", "3.14", "3.15")),
}

# torch minor release -> the CUDA builds PyTorch publishes on download.pytorch.org (RELEASE.md).
TORCH_INDEX_CUDA: dict[str, tuple[str, ...]] = {
    "2.4": ("11.8", "12.1", "12.4"),
    "2.5": ("11.8", "12.1", "12.4"),
    "2.6": ("11.8", "12.4", "12.6"),
    "2.7": ("11.8", "12.6", "12.8"),
    "2.8": ("12.6", "12.8", "12.9"),
    "2.9": ("12.6", "12.8", "13.0"),
}

# CUDA release -> the Linux driver its toolkit release (GA) requires.
CUDA_TOOLKIT_MIN_DRIVER: dict[str, str] = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

# CUDA major -> the lowest driver that runs any release of it (minor version compatibility,
# without the features that need the release's own driver, such as PTX JIT of newer code).
CUDA_FAMILY_MIN_DRIVER: dict[str, str] = {
    "11": "450.80.02",
    "12": "525.60.13",
    "13": "580.65.06",
}


@dataclass(frozen=True)
class Combination:
    """One image's versions, as the matrix declares them. ``cuda=None``: a CPU image."""

    torch: str
    python: str
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    min_driver: str | None = None


def version_tuple(text: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6). Raises ValueError on anything but dotted integers."""
    parts = text.strip().split(".")
    if not text.strip() or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a dotted version such as 580.65.06")
    return tuple(int(p) for p in parts)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def torch_cuda_builds(torch: str) -> tuple[str, ...]:
    """Every CUDA build known to be published for this torch release, sorted."""
    builds = set(TORCH_INDEX_CUDA.get(_minor(torch), ()))
    if torch in PYPI_TORCH:
        builds.add(PYPI_TORCH[torch].cuda)
    return tuple(sorted(builds, key=version_tuple))


def incompatibilities(combo: Combination) -> list[str]:
    """Every reason this combination cannot work; empty when it is a published one."""
    if combo.torch not in PYPI_TORCH and _minor(combo.torch) not in TORCH_INDEX_CUDA:
        known = ", ".join(PYPI_TORCH)
        return [f"torch {combo.torch} is not in the compatibility table (known: {known})"]
    reasons = _python_reasons(combo)
    if combo.cuda is None:
        return reasons + _cpu_reasons(combo)
    reasons += _cuda_reasons(combo)
    reasons += _pin_reasons(combo)
    reasons += _driver_reasons(combo)
    return reasons


def _python_reasons(combo: Combination) -> list[str]:
    wheel = PYPI_TORCH.get(combo.torch)
    if wheel is not None and combo.python not in wheel.pythons:
        return [
            f"torch {combo.torch} publishes no wheel for Python {combo.python} "
            f"(it has {', '.join(wheel.pythons)})"
        ]
    return []


def _cpu_reasons(combo: Combination) -> list[str]:
    if combo.torch not in PYPI_TORCH:
        return [f"torch {combo.torch}: the CPU image installs PyPI's wheel, which is not recorded"]
    extra = [f for f in ("cudnn", "nccl", "min_driver") if getattr(combo, f) is not None]
    if extra:
        return [f"a CPU image (cuda: null) declares {', '.join(extra)}; remove them or set cuda"]
    return []


def _cuda_reasons(combo: Combination) -> list[str]:
    assert combo.cuda is not None
    builds = torch_cuda_builds(combo.torch)
    if combo.cuda not in builds:
        return [
            f"torch {combo.torch} has no published CUDA {combo.cuda} build "
            f"(published: {', '.join(builds) or 'none recorded'})"
        ]
    return []


def _pin_reasons(combo: Combination) -> list[str]:
    """NCCL and cuDNN are checked where the pins are recorded: PyPI's own build."""
    wheel = PYPI_TORCH.get(combo.torch)
    if wheel is None or wheel.cuda != combo.cuda:
        if combo.nccl or combo.cudnn:
            return [
                f"torch {combo.torch}+cu{combo.cuda.replace('.', '') if combo.cuda else ''}: "
                "its NCCL and cuDNN pins are not recorded (only PyPI's build's are); "
                "use PyPI's build or leave nccl and cudnn out"
            ]
        return []
    reasons = []
    if combo.nccl is not None and combo.nccl != wheel.nccl:
        reasons.append(f"torch {combo.torch} pins NCCL {wheel.nccl}, not {combo.nccl}")
    if combo.cudnn is not None and combo.cudnn != wheel.cudnn:
        reasons.append(f"torch {combo.torch} pins cuDNN {wheel.cudnn}, not {combo.cudnn}")
    return reasons


def _driver_reasons(combo: Combination) -> list[str]:
    assert combo.cuda is not None
    if combo.min_driver is None:
        return [f"CUDA {combo.cuda} image without min_driver: set it (the CUDA release needs one)"]
    family = combo.cuda.split(".")[0]
    floor = CUDA_FAMILY_MIN_DRIVER.get(family)
    if floor is None:
        return [f"CUDA {combo.cuda}: no driver requirement recorded for CUDA {family}.x"]
    try:
        declared = version_tuple(combo.min_driver)
    except ValueError as exc:
        return [f"min_driver: {exc}"]
    if declared < version_tuple(floor):
        return [
            f"min_driver {combo.min_driver} is below what CUDA {combo.cuda} needs "
            f"(CUDA {family}.x needs driver >= {floor}; "
            f"the {combo.cuda} toolkit release lists "
            f">= {CUDA_TOOLKIT_MIN_DRIVER.get(combo.cuda, floor)})"
        ]
    return []
