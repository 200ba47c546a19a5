"""What this machine offers to jobs: CPU slots, memory, and GPUs (through NVML when present).

NVML is optional: the ``nvidia-ml-py`` module (imported as ``pynvml``) is loaded lazily, and a
machine without it, without a driver or without GPUs simply has no GPUs. Tests pass
``tensoryard.agent.fake_nvml.FakeNvml`` instead of the real module.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from tensoryard.observability.nvml import load_nvml

__all__ = ["GpuInfo", "Inventory", "collect_inventory", "gpu_model"]


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it."""

    index: int
    uuid: str
    name: str  # full product name, like "NVIDIA H100 80GB HBM3"
    model: str  # short model the scheduler matches on, like "H100"
    memory_bytes: int
    healthy: bool = True
    health_reason: str = ""  # why it is unhealthy, for `tyard describe` and drain decisions


@dataclass(frozen=True)
class Inventory:
    """This machine's capacity for jobs."""

    hostname: str
    cpu_slots: int  # cores this process may use (affinity), not all cores of the machine
    memory_bytes: int
    gpus: list[GpuInfo] = field(default_factory=list)
    nvml_error: str = ""  # why GPUs could not be listed, when NVML is present but failed

    @property
    def healthy_gpus(self) -> list[GpuInfo]:
        return [g for g in self.gpus if g.healthy]


def collect_inventory(
    nvml: Any | None = None,
    *,
    load: Callable[[], Any | None] = load_nvml,
    hostname: Callable[[], str] = socket.gethostname,
) -> Inventory:
    """Inventory of this machine; `nvml` defaults to the real bindings when installed."""
    module = nvml if nvml is not None else load()
    gpus: list[GpuInfo] = []
    error = ""
    if module is not None:
        gpus, error = _nvml_gpus(module)
    return Inventory(
        hostname=hostname(),
        cpu_slots=_cpu_slots(),
        memory_bytes=int(psutil.virtual_memory().total),
        gpus=gpus,
        nvml_error=error,
    )


def _cpu_slots() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _nvml_gpus(nvml: Any) -> tuple[list[GpuInfo], str]:
    """GPUs through NVML; ([], reason) when there is no driver or NVML fails to start."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        # No driver (LibraryNotFound) or no GPU (DriverNotLoaded) is an ordinary CPU machine.
        return [], f"NVML unavailable: {_text(exc)}"
    try:
        count = int(nvml.nvmlDeviceGetCount())
        return [_one_gpu(nvml, i) for i in range(count)], ""
    except nvml.NVMLError as exc:
        return [], f"NVML failed to list GPUs: {_text(exc)}"
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _one_gpu(nvml: Any, index: int) -> GpuInfo:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(nvml.nvmlDeviceGetName(handle))
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except nvml.NVMLError as exc:
        # A GPU that cannot even be queried (fallen off the bus, lost) is unhealthy.
        return GpuInfo(index, "", "", "", 0, healthy=False, health_reason=_text(exc))
    healthy, reason = _health(nvml, handle)
    return GpuInfo(index, uuid, name, gpu_model(name), memory, healthy, reason)


def _health(nvml: Any, handle: Any) -> tuple[bool, str]:
    """Unhealthy on uncorrected ECC errors or pages waiting for retirement."""
    try:
        ecc = int(
            nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
        )
        if ecc > 0:
            return False, f"{ecc} uncorrected ECC error(s) since the last driver load"
    except nvml.NVMLError as exc:
        if not _not_supported(nvml, exc):
            return False, f"ECC query failed: {_text(exc)}"
    try:
        if int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)) == nvml.NVML_FEATURE_ENABLED:
            return False, "retired memory pages pending: reset the GPU"
    except nvml.NVMLError as exc:
        if not _not_supported(nvml, exc):
            return False, f"retired-pages query failed: {_text(exc)}"
    return True, ""


def _not_supported(nvml: Any, exc: Exception) -> bool:
    return bool(getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED)


_MODEL = re.compile(r"\b([A-Z]{1,3}\d{1,4}[A-Z]?)\b")


def gpu_model(name: str) -> str:
    """Short model from NVML's product name: 'NVIDIA H100 80GB HBM3' -> 'H100'."""
    cleaned = name.replace("NVIDIA", "").replace("Tesla", "").strip()
    match = _MODEL.search(cleaned)
    if match:
        return match.group(1)
    tokens = cleaned.split()
    with_digits = [t for t in tokens if any(c.isdigit() for c in t)]
    return (with_digits or tokens or [name])[0]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
