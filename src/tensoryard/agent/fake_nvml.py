"""A fake of the NVML bindings (``pynvml``) for machines without GPUs, i.e. for tests.

It offers exactly the functions and constants ``tensoryard.agent.inventory`` calls, with the
same error type shape (``NVMLError`` carrying ``.value``), so the inventory code runs unchanged:

    nvml = FakeNvml.with_gpus(8, "NVIDIA H100 80GB HBM3")
    nvml.gpus[3].ecc_uncorrected = 2        # make GPU 3 unhealthy
    inventory = collect_inventory(nvml)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FakeGpu", "FakeMemoryInfo", "FakeNvml", "NVMLError"]

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    """Like pynvml.NVMLError: `.value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(_MESSAGES.get(value, f"NVML error {value}"))


@dataclass(frozen=True)
class FakeMemoryInfo:
    total: int
    free: int
    used: int


@dataclass
class FakeGpu:
    """One fake device; change its fields to simulate faults."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_bytes: int = 80 * 1024**3
    ecc_uncorrected: int | None = 0  # None: ECC not supported on this device
    retired_pages_pending: bool = False
    lost: bool = False  # every query fails with GPU_IS_LOST


@dataclass
class FakeNvml:
    """The subset of `pynvml` that tensoryard uses, backed by a list of FakeGpu."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: int | None = None  # e.g. NVML_ERROR_DRIVER_NOT_LOADED: nvmlInit fails
    initialized: bool = False
    init_calls: int = 0

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1

    @classmethod
    def with_gpus(cls, count: int, name: str = "NVIDIA H100 80GB HBM3") -> FakeNvml:
        """`count` identical healthy GPUs of product `name`."""
        return cls(
            gpus=[
                FakeGpu(name=name, uuid=f"GPU-fake-{i:04d}-0000-0000-000000000000")
                for i in range(count)
            ]
        )

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check_init()
        gpu = self.gpus[index]
        self._check_lost(gpu)
        return gpu

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._check_lost(handle)
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._check_lost(handle)
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> FakeMemoryInfo:
        self._check_lost(handle)
        return FakeMemoryInfo(total=handle.memory_bytes, free=handle.memory_bytes, used=0)

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeGpu, error_type: int, counter_type: int
    ) -> int:
        self._check_lost(handle)
        if handle.ecc_uncorrected is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.ecc_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeGpu) -> int:
        self._check_lost(handle)
        return self.NVML_FEATURE_ENABLED if handle.retired_pages_pending else 0

    def _check_init(self) -> None:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _check_lost(self, gpu: Any) -> None:
        if getattr(gpu, "lost", False):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
