"""A fake of the NVML bindings (``pynvml``) for machines without GPUs, i.e. for tests.

It offers exactly the functions and constants ``tensoryard.agent.inventory`` calls, with the
same error type shape (``NVMLError`` carrying ``.value``), so the inventory code runs unchanged:

    nvml = FakeNvml.with_gpus(8, "NVIDIA H100 80GB HBM3")
    nvml.gpus[3].ecc_uncorrected = 2        # make GPU 3 unhealthy
    inventory = collect_inventory(nvml)

It also offers what the node agent's GPU collector (``tensoryard.observability.gpu``) reads:
utilisation, memory, power, energy, temperatures, clocks, throttle reasons, ECC, remapped rows,
NVLink error counters and throughput, violation times and XID events. Feed it recorded values
with ``FakeNvml.from_records`` (tests/unit/observability/fixtures/nvml_h100x8.json says where
its values come from); ``nvml.gpus[2].xid_events.append(79)`` queues an XID event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FakeEvent", "FakeFieldValue", "FakeGpu", "FakeMemoryInfo", "FakeNvml", "NVMLError"]

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_TIMEOUT: "Timeout",
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
    # What the GPU collector reads (units as NVML returns them).
    index: int = 0
    util_gpu: int = 0  # %
    util_memory: int = 0  # %
    memory_used_bytes: int = 0
    power_mw: int = 70_000
    energy_mj: int = 0
    temperature_c: int = 30
    memory_temperature_c: int | None = 35  # None: field not supported
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    throttle_reasons: int = 0  # nvmlClocksThrottleReason* bitmask
    ecc_corrected: int = 0  # volatile
    ecc_corrected_aggregate: int = 0
    ecc_uncorrected_aggregate: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    nvlink_links: int = 18  # active links; higher link indices answer NOT_SUPPORTED
    nvlink_errors: dict[int, dict[int, int]] = field(default_factory=dict)  # link -> counter
    nvlink_tx_kib: int | None = 0  # None: throughput fields not supported (no NVLink peers)
    nvlink_rx_kib: int | None = 0
    violation_ns: dict[int, int] = field(default_factory=dict)  # NVML_PERF_POLICY_* -> ns
    xid_events: list[int] = field(default_factory=list)  # pending XIDs, oldest first


@dataclass(frozen=True)
class FakeFieldValue:
    """Like pynvml's c_nvmlFieldValue_t: nvmlReturn, valueType and value.<member>."""

    fieldId: int
    nvmlReturn: int
    valueType: int
    value: Any


@dataclass(frozen=True)
class FakeValue:
    ullVal: int = 0
    uiVal: int = 0


@dataclass(frozen=True)
class FakeEvent:
    """Like pynvml's c_nvmlEventData_t."""

    device: FakeGpu
    eventType: int
    eventData: int


@dataclass(frozen=True)
class FakeViolationTime:
    referenceTime: int
    violationTime: int


@dataclass
class FakeEventSet:
    devices: list[FakeGpu] = field(default_factory=list)


@dataclass(frozen=True)
class _Utilization:
    gpu: int
    memory: int


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
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_AGGREGATE_ECC = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_NVLINK_ERROR_DL_REPLAY = 0
    NVML_NVLINK_ERROR_DL_RECOVERY = 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
    NVML_NVLINK_ERROR_DL_CRC_DATA = 3
    NVML_PERF_POLICY_POWER = 0
    NVML_PERF_POLICY_THERMAL = 1
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
    NVML_SUCCESS = 0
    nvmlEventTypeXidCriticalError = 0x8

    @classmethod
    def with_gpus(cls, count: int, name: str = "NVIDIA H100 80GB HBM3") -> FakeNvml:
        """`count` identical healthy GPUs of product `name`."""
        return cls(
            gpus=[
                FakeGpu(name=name, uuid=f"GPU-fake-{i:04d}-0000-0000-000000000000", index=i)
                for i in range(count)
            ]
        )

    @classmethod
    def from_records(cls, records: list[dict[str, Any]]) -> FakeNvml:
        """GPUs from recorded per-device values (keys are FakeGpu field names)."""
        gpus = []
        for i, record in enumerate(records):
            values = dict(record)
            if "nvlink_errors" in values:
                values["nvlink_errors"] = {
                    int(link): {int(c): int(v) for c, v in counters.items()}
                    for link, counters in values["nvlink_errors"].items()
                }
            if "violation_ns" in values:
                values["violation_ns"] = {int(k): int(v) for k, v in values["violation_ns"].items()}
            if "remapped_rows" in values:
                values["remapped_rows"] = tuple(values["remapped_rows"])
            gpus.append(FakeGpu(index=i, **values))
        return cls(gpus=gpus)

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
        used = handle.memory_used_bytes
        return FakeMemoryInfo(total=handle.memory_bytes, free=handle.memory_bytes - used, used=used)

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeGpu, error_type: int, counter_type: int
    ) -> int:
        self._check_lost(handle)
        if handle.ecc_uncorrected is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        aggregate = counter_type == self.NVML_AGGREGATE_ECC
        if error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return handle.ecc_corrected_aggregate if aggregate else handle.ecc_corrected
        return handle.ecc_uncorrected_aggregate if aggregate else handle.ecc_uncorrected

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        self._check_lost(handle)
        return handle.index

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        self._check_lost(handle)
        return _Utilization(gpu=handle.util_gpu, memory=handle.util_memory)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._check_lost(handle)
        return handle.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        self._check_lost(handle)
        return handle.energy_mj

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._check_lost(handle)
        return handle.temperature_c

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock: int) -> int:
        self._check_lost(handle)
        return handle.sm_clock_mhz if clock == self.NVML_CLOCK_SM else handle.mem_clock_mhz

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        self._check_lost(handle)
        return handle.throttle_reasons

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu) -> tuple[int, int, int, int]:
        self._check_lost(handle)
        return handle.remapped_rows

    def nvmlDeviceGetViolationStatus(self, handle: FakeGpu, policy: int) -> FakeViolationTime:
        self._check_lost(handle)
        return FakeViolationTime(referenceTime=0, violationTime=handle.violation_ns.get(policy, 0))

    def nvmlDeviceGetNvLinkState(self, handle: FakeGpu, link: int) -> int:
        self._check_lost(handle)
        if link >= handle.nvlink_links:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeGpu, link: int, counter: int) -> int:
        self._check_lost(handle)
        if link >= handle.nvlink_links:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.nvlink_errors.get(link, {}).get(counter, 0)

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, field_ids: list[int]) -> list[Any]:
        self._check_lost(handle)
        ecc_supported = handle.ecc_uncorrected is not None
        links = [handle.nvlink_errors.get(i, {}) for i in range(handle.nvlink_links)]

        def nvlink(counter: int) -> int | None:
            return sum(c.get(counter, 0) for c in links) if handle.nvlink_links else None

        corr, unc, _pending, failure = handle.remapped_rows
        known = {
            3: handle.ecc_corrected if ecc_supported else None,
            4: handle.ecc_uncorrected,
            5: handle.ecc_corrected_aggregate if ecc_supported else None,
            6: handle.ecc_uncorrected_aggregate if ecc_supported else None,
            38: nvlink(self.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            45: nvlink(self.NVML_NVLINK_ERROR_DL_CRC_DATA),
            52: nvlink(self.NVML_NVLINK_ERROR_DL_REPLAY),
            59: nvlink(self.NVML_NVLINK_ERROR_DL_RECOVERY),
            self.NVML_FI_DEV_MEMORY_TEMP: handle.memory_temperature_c,
            self.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: handle.nvlink_tx_kib,
            self.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: handle.nvlink_rx_kib,
            142: corr,
            143: unc,
            145: 1 if failure else 0,
        }
        out = []
        for fid in field_ids:
            value = known.get(fid)
            ret = NVML_ERROR_NOT_SUPPORTED if value is None else 0
            out.append(
                FakeFieldValue(
                    fid, ret, self.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, FakeValue(ullVal=value or 0)
                )
            )
        return out

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check_init()
        return FakeEventSet()

    def nvmlDeviceRegisterEvents(
        self, handle: FakeGpu, types: int, event_set: FakeEventSet
    ) -> None:
        self._check_lost(handle)
        event_set.devices.append(handle)

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> FakeEvent:
        for gpu in event_set.devices:
            if gpu.xid_events:
                return FakeEvent(gpu, self.nvmlEventTypeXidCriticalError, gpu.xid_events.pop(0))
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        event_set.devices.clear()

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeGpu) -> int:
        self._check_lost(handle)
        return self.NVML_FEATURE_ENABLED if handle.retired_pages_pending else 0

    def _check_init(self) -> None:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _check_lost(self, gpu: Any) -> None:
        if getattr(gpu, "lost", False):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)


# -- recording a real device --------------------------------------------------------------------


def record_devices(nvml: Any) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Read every value FakeGpu holds from real NVML bindings (``pynvml``), one record per GPU,
    in the form `FakeNvml.from_records` takes; also which calls each GPU did not support.

    Run on a GPU machine with ``python -m tensoryard.agent.fake_nvml --record PATH``; the
    recorded file then feeds the tests (the GPU collector's output from the fake is compared
    with its output from the real device, recorded in the same run)."""
    records: list[dict[str, Any]] = []
    unsupported: dict[str, list[str]] = {}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        missing: list[str] = []

        def q(fn: str, *args: Any, _h: Any = h, _missing: list[str] = missing) -> Any:
            try:
                return getattr(nvml, fn)(_h, *args)
            except nvml.NVMLError as exc:
                _missing.append(f"{fn}{list(args) if args else ''}: {exc}")
                return None
            except AttributeError:
                _missing.append(f"{fn}: not in these bindings")
                return None

        def text(value: Any) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        mem = q("nvmlDeviceGetMemoryInfo")
        util = q("nvmlDeviceGetUtilizationRates")
        rec: dict[str, Any] = {
            "name": text(nvml.nvmlDeviceGetName(h)),
            "uuid": text(nvml.nvmlDeviceGetUUID(h)),
            "memory_bytes": int(mem.total) if mem is not None else 0,
            "memory_used_bytes": int(mem.used) if mem is not None else 0,
            "util_gpu": int(util.gpu) if util is not None else 0,
            "util_memory": int(util.memory) if util is not None else 0,
        }
        for key, fn, args in (
            ("power_mw", "nvmlDeviceGetPowerUsage", ()),
            ("energy_mj", "nvmlDeviceGetTotalEnergyConsumption", ()),
            ("temperature_c", "nvmlDeviceGetTemperature", (nvml.NVML_TEMPERATURE_GPU,)),
            ("sm_clock_mhz", "nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_SM,)),
            ("mem_clock_mhz", "nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_MEM,)),
            ("throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", ()),
        ):
            value = q(fn, *args)
            if value is not None:
                rec[key] = int(value)
        ecc = {}
        for key, etype, ctype in (
            ("ecc_corrected", 0, 0),
            ("ecc_corrected_aggregate", 0, 1),
            ("ecc_uncorrected", 1, 0),
            ("ecc_uncorrected_aggregate", 1, 1),
        ):
            ecc[key] = q("nvmlDeviceGetTotalEccErrors", etype, ctype)
        if ecc["ecc_uncorrected"] is None:
            rec["ecc_uncorrected"] = None  # the fake then answers NOT_SUPPORTED for ECC
        else:
            rec.update({k: int(v or 0) for k, v in ecc.items()})
        rows = q("nvmlDeviceGetRemappedRows")
        if rows is not None:
            rec["remapped_rows"] = [int(v) for v in rows][:4]
        pending = q("nvmlDeviceGetRetiredPagesPendingStatus")
        rec["retired_pages_pending"] = bool(pending) if pending is not None else False
        links = 0
        errors: dict[str, dict[str, int]] = {}
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(h, link)
            except nvml.NVMLError:
                break
            if int(state) != int(getattr(nvml, "NVML_FEATURE_ENABLED", 1)):
                break
            links += 1
            counters = {}
            for counter in range(4):  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA
                try:
                    value = int(nvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))
                except nvml.NVMLError:
                    continue
                if value:
                    counters[str(counter)] = value
            if counters:
                errors[str(link)] = counters
        rec["nvlink_links"] = links
        rec["nvlink_errors"] = errors
        fields = q("nvmlDeviceGetFieldValues", [82, 138, 139])
        got = {}
        for value in fields or []:
            if int(value.nvmlReturn) == 0:
                got[int(value.fieldId)] = int(value.value.ullVal or value.value.uiVal)
        rec["memory_temperature_c"] = got.get(82)
        rec["nvlink_tx_kib"] = got.get(138)  # None: not supported on this device
        rec["nvlink_rx_kib"] = got.get(139)
        violations = {}
        for policy in (0, 1):  # NVML_PERF_POLICY_POWER, _THERMAL
            v = q("nvmlDeviceGetViolationStatus", policy)
            if v is not None:
                violations[str(policy)] = int(v.violationTime)
        rec["violation_ns"] = violations
        records.append(rec)
        unsupported[str(index)] = missing
    return records, unsupported


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import datetime as dt
    import json
    import platform

    parser = argparse.ArgumentParser(description="Record this machine's GPUs for FakeNvml.")
    parser.add_argument("--record", required=True, help="write the records (JSON) here")
    args = parser.parse_args(argv)
    import pynvml  # nvidia-ml-py: only on a GPU machine

    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        records, unsupported = record_devices(pynvml)
    finally:
        pynvml.nvmlShutdown()
    doc = {
        "source": (
            f"Recorded from a real device by `python -m tensoryard.agent.fake_nvml --record` on "
            f"{dt.date.today().isoformat()} ({platform.node()}, driver "
            f"{driver.decode() if isinstance(driver, bytes) else driver}); values as NVML "
            "returned them, idle or under the load the recording ran beside."
        ),
        "not_supported": unsupported,
        "gpus": records,
    }
    with open(args.record, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"recorded {len(records)} GPU(s) to {args.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
