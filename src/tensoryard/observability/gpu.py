"""GPU metrics through NVML, under the DCGM exporter's names, units and types.

Each series carries the DCGM exporter's labels (gpu, UUID, device, modelName, Hostname) plus the
job, team and rank that own the GPU (empty when idle) from the agent's GPU -> owner map. A node
without NVML, without a driver or without GPUs exports no GPU series at all. NVML is started
once, on the first scrape; a failed start is logged once and not retried (restart the agent
after installing a driver).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric

from tensoryard.observability import metrics as m
from tensoryard.observability.base import CollectorErrors, Family, family, log
from tensoryard.observability.nvml import load_nvml

__all__ = ["FATAL_XIDS", "THROTTLE_REASONS", "GpuCollector", "GpuOwner"]

NAME = "gpu"

# XIDs the alert rules treat as fatal (deploy/prometheus/rules/gpu.yml says why). Their counters
# start at 0 for every GPU so that increase() sees the first event, not only the second.
FATAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 94, 95, 119, 120, 140)

# nvmlClocksThrottleReason* bits -> reason label (NVML API reference, nvmlClocksEventReasons).
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Read in one nvmlDeviceGetFieldValues call per GPU, as DCGM does: (NVML field id, DCGM metric).
# A field the device does not support comes back with its own error code and is left out.
FIELDS = (
    (3, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),  # NVML_FI_DEV_ECC_SBE_VOL_TOTAL
    (4, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    (5, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    (6, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    (38, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),  # summed over all links by NVML
    (45, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    (52, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    (59, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    (82, "DCGM_FI_DEV_MEMORY_TEMP"),  # NVML_FI_DEV_MEMORY_TEMP
    (142, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),  # NVML_FI_DEV_REMAPPED_COR
    (143, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    (145, "DCGM_FI_DEV_ROW_REMAP_FAILURE"),  # NVML_FI_DEV_REMAPPED_FAILURE: 0 or 1
)
_NVLINK_TX, _NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, in KiB
_FIELD_IDS = [f for f, _ in FIELDS] + [_NVLINK_TX, _NVLINK_RX]


@dataclass(frozen=True)
class GpuOwner:
    """Who holds a GPU on this node right now."""

    job: str
    team: str
    rank: str


class _Lost(Exception):
    """The GPU stopped answering mid-scrape; skip the rest of it."""


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    model: str


class GpuCollector:
    """DCGM-named metrics for every GPU NVML lists."""

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        load: Callable[[], Any | None] = load_nvml,
        owners: Callable[[], Mapping[int, GpuOwner]] = dict,
        hostname: Callable[[], str] = socket.gethostname,
        errors: CollectorErrors | None = None,
    ) -> None:
        self._nvml: Any = nvml
        self._load = load
        self.owners = owners
        self.hostname = hostname()
        self.errors = errors if errors is not None else CollectorErrors()
        self._gpus: list[_Gpu] | None = None  # None: not started yet; []: no GPU
        self._events: Any = None
        self._xids: dict[tuple[int, int], int] = {}  # (gpu index, xid) -> count
        self._last_xid: dict[int, int] = {}
        self._lock = threading.Lock()

    # -- start ----------------------------------------------------------------------------------

    def _start(self) -> list[_Gpu]:
        if self._gpus is not None:
            return self._gpus
        self._gpus = []
        self._xids = {}
        nvml = self._nvml if self._nvml is not None else self._load()
        self._nvml = nvml
        if nvml is None:
            return self._gpus
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            log.info("no GPU metrics: NVML unavailable: %s", exc)
            return self._gpus
        for i in range(count):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                self._gpus.append(
                    _Gpu(i, h, _text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h)))
                )
            except nvml.NVMLError as exc:
                self.errors.record(NAME, f"GPU {i} at start", exc)
        self._register_xid_events()
        self._xids = {(g.index, xid): 0 for g in self._gpus for xid in FATAL_XIDS}
        return self._gpus

    def _register_xid_events(self) -> None:
        nvml = self._nvml
        try:
            self._events = nvml.nvmlEventSetCreate()
            for gpu in self._gpus or []:
                with contextlib.suppress(nvml.NVMLError):  # not supported: no XIDs from it
                    nvml.nvmlDeviceRegisterEvents(
                        gpu.handle, nvml.nvmlEventTypeXidCriticalError, self._events
                    )
        except nvml.NVMLError as exc:
            self.errors.record(NAME, "XID event registration", exc)
            self._events = None

    # -- scrape ---------------------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            gpus = self._start()
            if not gpus:
                return
            self._drain_xids()
            owners = self.owners()
            fams: dict[str, Family] = {d.name: family(d) for d in (*m.DCGM, *m.DCGM_EXTRA)}
            throttle = family(m.by_name("tyard_gpu_clock_throttle_active"))
            xids = family(m.by_name("tyard_gpu_xid_errors_total"))
            for gpu in gpus:
                owner = owners.get(gpu.index, GpuOwner("", "", ""))
                labels = [
                    str(gpu.index),
                    gpu.uuid,
                    f"nvidia{gpu.index}",
                    gpu.model,
                    self.hostname,
                    owner.job,
                    owner.team,
                    owner.rank,
                ]
                try:
                    self._one(gpu, labels, fams, throttle)
                except _Lost as exc:
                    self.errors.record(NAME, f"GPU {gpu.index}", exc.__cause__ or exc)
                if gpu.index in self._last_xid:
                    fams["DCGM_FI_DEV_XID_ERRORS"].add_metric(labels, self._last_xid[gpu.index])
                for (index, xid), n in sorted(self._xids.items()):
                    if index == gpu.index:
                        xids.add_metric([*labels, str(xid)], n)
        yield from fams.values()
        yield throttle
        yield xids

    def _drain_xids(self) -> None:
        nvml = self._nvml
        if self._events is None:
            return
        for _ in range(1000):  # bounded: a storm of events must not stall the scrape
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(nvml, "NVML_ERROR_TIMEOUT", 10):
                    self.errors.record(NAME, "XID event wait", exc)
                return
            try:
                index = int(nvml.nvmlDeviceGetIndex(event.device))
            except nvml.NVMLError as exc:
                self.errors.record(NAME, "XID event device", exc)
                continue
            xid = int(event.eventData)
            self._xids[(index, xid)] = self._xids.get((index, xid), 0) + 1
            self._last_xid[index] = xid

    def _q(self, fn: str, *args: Any) -> Any:
        """One NVML call: None when the device does not support it, _Lost on other errors."""
        nvml = self._nvml
        try:
            return getattr(nvml, fn)(*args)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise _Lost(f"{fn}: {exc}") from exc
        except AttributeError:  # an older binding without this function
            return None

    def _one(self, gpu: _Gpu, labels: list[str], fams: dict[str, Family], throttle: Family) -> None:
        nvml, h = self._nvml, gpu.handle

        def put(name: str, value: float | None) -> None:
            if value is not None:
                fams[name].add_metric(labels, value)

        util = self._q("nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            put("DCGM_FI_DEV_GPU_UTIL", util.gpu)
            put("DCGM_FI_DEV_MEM_COPY_UTIL", util.memory)
        mem = self._q("nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            put("DCGM_FI_DEV_FB_FREE", mem.free / 2**20)
            put("DCGM_FI_DEV_FB_USED", mem.used / 2**20)
        power = self._q("nvmlDeviceGetPowerUsage", h)
        put("DCGM_FI_DEV_POWER_USAGE", None if power is None else power / 1000)
        put(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            self._q("nvmlDeviceGetTotalEnergyConsumption", h),
        )
        put(
            "DCGM_FI_DEV_GPU_TEMP",
            self._q("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU),
        )
        put("DCGM_FI_DEV_SM_CLOCK", self._q("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM))
        put("DCGM_FI_DEV_MEM_CLOCK", self._q("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM))
        reasons = self._q("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            put("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", int(reasons))
            for bit, reason in THROTTLE_REASONS.items():
                throttle.add_metric([*labels, reason], 1 if int(reasons) & bit else 0)
        for policy, name in (
            ("NVML_PERF_POLICY_POWER", "DCGM_FI_DEV_POWER_VIOLATION"),
            ("NVML_PERF_POLICY_THERMAL", "DCGM_FI_DEV_THERMAL_VIOLATION"),
        ):
            v = self._q("nvmlDeviceGetViolationStatus", h, getattr(nvml, policy))
            put(name, None if v is None else v.violationTime)
        self._fields(h, put)

    def _fields(self, h: Any, put: Callable[[str, float | None], None]) -> None:
        values = self._q("nvmlDeviceGetFieldValues", h, _FIELD_IDS)
        if values is None:
            return
        got = {v.fieldId: _field(v) for v in values if v.nvmlReturn == 0}
        for field_id, name in FIELDS:
            put(name, got.get(field_id))
        if _NVLINK_TX in got and _NVLINK_RX in got:
            put("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", got[_NVLINK_TX] + got[_NVLINK_RX])

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """Read pending XID events (starting NVML on first use) and return how many of each
        (GPU index, XID) were seen since the start; the health loop polls this between
        scrapes. Fatal XIDs are always present (0 until one happens)."""
        with self._lock:
            if self._start():
                self._drain_xids()
            return dict(self._xids)

    def close(self) -> None:
        """Release the XID event set and NVML (the agent calls this on shutdown)."""
        nvml = self._nvml
        if nvml is None or not self._gpus:
            return
        with contextlib.suppress(nvml.NVMLError):
            if self._events is not None:
                nvml.nvmlEventSetFree(self._events)
            nvml.nvmlShutdown()
        self._gpus = None


def _field(value: Any) -> int:
    """A c_nvmlFieldValue_t's value as an int, by its valueType (1: uint, else ull)."""
    return int(value.value.uiVal if value.valueType == 1 else value.value.ullVal)


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
