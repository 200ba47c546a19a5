"""What the node agent sends with each heartbeat for the console's Nodes page: each GPU's
temperatures, utilisation and the XIDs NVML reported since the agent started (and the job and
rank holding it), each InfiniBand port's state, rate and error counters.

Built from the metric families of the agent's own GPU and InfiniBand collectors (the numbers
its /metrics serves), so the page and Prometheus never disagree. A summary, not a time series:
the control plane keeps the last one per node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.metrics_core import Metric

__all__ = ["IB_ERROR_COUNTERS", "node_telemetry"]

IB_ERROR_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "port_errors_received",
    "port_receive_remote_physical_errors",
    "port_discards_transmitted",
    "excessive_buffer_overrun_errors",
)
"""node_exporter's names (less `_total`) of the port counters that count faults."""

_IB_STATE = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_IB_PHYSICAL = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "Training", 5: "LinkUp", 6: "Recovery"}
_GPU_VALUES = {
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_MEMORY_TEMP": "memory_temp_c",
    "DCGM_FI_DEV_GPU_UTIL": "util_pct",
}
_IB = "node_infiniband_"


def node_telemetry(families: Iterable[Metric]) -> dict[str, Any]:
    """``{"gpus": [{"gpu", "temp_c", "memory_temp_c", "util_pct", "job", "rank", "xids":
    {xid: count}}], "ib_ports":
    [{"device", "port", "state", "physical_state", "rate_gbps", "errors": {name: count}}]}``,
    sorted; a value the collectors did not report is left out."""
    gpus: dict[int, dict[str, Any]] = {}
    ports: dict[tuple[str, str], dict[str, Any]] = {}
    for fam in families:
        for s in fam.samples:
            if s.name in _GPU_VALUES:
                gpu = gpus.setdefault(int(s.labels["gpu"]), {})
                gpu[_GPU_VALUES[s.name]] = s.value
                if s.labels.get("job"):  # the job and rank holding it (the agent's placements)
                    gpu["job"], gpu["rank"] = s.labels["job"], s.labels.get("rank", "")
            elif s.name == "tyard_gpu_xid_errors_total" and s.value > 0:
                gpu = gpus.setdefault(int(s.labels["gpu"]), {})
                gpu.setdefault("xids", {})[s.labels["xid"]] = int(s.value)
            elif s.name.startswith(_IB) and "port" in s.labels:
                key = (s.labels["device"], s.labels["port"])
                port = ports.setdefault(key, {"device": key[0], "port": key[1], "errors": {}})
                _port_value(port, s.name.removeprefix(_IB), s.value)
    return {
        "gpus": [{"gpu": index, **values} for index, values in sorted(gpus.items())],
        "ib_ports": [ports[key] for key in sorted(ports)],
    }


def _port_value(port: dict[str, Any], name: str, value: float) -> None:
    if name == "state_id":
        port["state"] = _IB_STATE.get(int(value), str(int(value)))
    elif name == "physical_state_id":
        port["physical_state"] = _IB_PHYSICAL.get(int(value), str(int(value)))
    elif name == "rate_bytes_per_second":
        port["rate_gbps"] = round(value * 8 / 1e9, 3)
    elif name.removesuffix("_total") in IB_ERROR_COUNTERS:
        port["errors"][name.removesuffix("_total")] = int(value)
