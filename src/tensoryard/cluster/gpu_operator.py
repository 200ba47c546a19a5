"""NVIDIA GPU Operator (and Network Operator) Helm values, and the DCGM exporter metric list.

Keys follow the GPU Operator chart's values.yaml
(https://github.com/NVIDIA/gpu-operator/blob/main/deployments/gpu-operator/values.yaml) and its
docs (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html):

- ``driver.enabled: false`` when the node image ships the driver ("pre-installed drivers");
- ``toolkit.env`` CONTAINERD_* so the toolkit configures containerd's ``nvidia`` runtime;
- ``dcgmExporter.config.name`` + ``DCGM_EXPORTER_COLLECTORS`` point the exporter at our
  metrics ConfigMap ("Custom metrics config" in the GPU telemetry docs); pod mapping
  (``pod``/``namespace``/``container`` labels) is on by default with ``DCGM_EXPORTER_KUBERNETES``;
- ``mig.strategy`` single|mixed (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html);
- ``driver.rdma.enabled`` for GPUDirect RDMA, with the Network Operator providing the MOFED
  driver (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-rdma.html).

Fabric Manager: on NVSwitch systems the operator's driver container starts
``nvidia-fabricmanager`` itself; with a pre-installed driver the node image must run it
(https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html). The plan says
which applies, and `tyard cluster preflight` checks it is running.
"""

from __future__ import annotations

from typing import Any

from tensoryard.cluster.inventory import Inventory
from tensoryard.cluster.labels import GPU_TAINT
from tensoryard.observability import metrics as platform_metrics

__all__ = [
    "DCGM_CONFIGMAP",
    "DCGM_DEFAULT_COUNTERS",
    "dcgm_configmap",
    "dcgm_counters",
    "dcgm_csv",
    "gpu_operator_values",
    "network_operator_values",
]

DCGM_CONFIGMAP = "tensoryard-dcgm-metrics"
DCGM_CSV_KEY = "dcgm-metrics.csv"

# NVIDIA/dcgm-exporter etc/default-counters.csv at d5e5f510a1b6b393f39a43293ccd9dc985defc79
# (the same list as ../shared/reference/dcgm-exporter_default-counters.csv; a test compares).
DCGM_DEFAULT_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus."),
)


def dcgm_counters() -> list[tuple[str, str, str]]:
    """The exporter's defaults plus every DCGM field the platform's metrics and alert rules
    use (tensoryard.observability.metrics.DCGM and DCGM_EXTRA), without duplicates."""
    rows = list(DCGM_DEFAULT_COUNTERS)
    seen = {name for name, _, _ in rows}
    for d in (*platform_metrics.DCGM, *platform_metrics.DCGM_EXTRA):
        if d.name not in seen:
            rows.append((d.name, d.type, d.help))
            seen.add(d.name)
    return rows


def dcgm_csv() -> str:
    """The exporter's collectors file (``name, type, help`` per line)."""
    head = "# DCGM exporter collectors written by `tyard cluster plan`.\n"
    return head + "".join(f"{n}, {k}, {h}\n" for n, k, h in dcgm_counters())


def dcgm_configmap(namespace: str = "gpu-operator") -> dict[str, Any]:
    """The ConfigMap `dcgmExporter.config.name` names."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": DCGM_CONFIGMAP, "namespace": namespace},
        "data": {DCGM_CSV_KEY: dcgm_csv()},
    }


def gpu_operator_values(inventory: Inventory) -> dict[str, Any]:
    """Helm values for the `nvidia/gpu-operator` chart."""
    settings = inventory.cluster
    driver: dict[str, Any] = {"enabled": not settings.driver_preinstalled}
    if not settings.driver_preinstalled:
        driver["version"] = settings.software.driver
    if inventory.has_ib:
        driver["rdma"] = {"enabled": True, "useHostMofed": False}
    toleration = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}
    values: dict[str, Any] = {
        "driver": driver,
        "toolkit": {
            "enabled": True,
            "env": [
                {"name": "CONTAINERD_CONFIG", "value": "/etc/containerd/config.toml"},
                {"name": "CONTAINERD_SOCKET", "value": "/run/containerd/containerd.sock"},
                {"name": "CONTAINERD_RUNTIME_CLASS", "value": "nvidia"},
                {"name": "CONTAINERD_SET_AS_DEFAULT", "value": "true"},
            ],
        },
        "devicePlugin": {"enabled": True},
        "gfd": {"enabled": True},
        "nfd": {"enabled": True},
        "dcgmExporter": {
            "enabled": True,
            "config": {"name": DCGM_CONFIGMAP},
            "env": [
                {"name": "DCGM_EXPORTER_COLLECTORS", "value": f"/etc/dcgm-exporter/{DCGM_CSV_KEY}"},
                {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
                {"name": "DCGM_EXPORTER_INTERVAL", "value": "15000"},
            ],
            # honorLabels: the exporter's pod/namespace (the GPU's workload) stay pod/namespace
            # (the recording rules join both shapes; deploy/prometheus/rules/k8s.yml)
            "serviceMonitor": {"enabled": True, "interval": "15s", "honorLabels": True},
        },
        "mig": {"strategy": "single" if settings.mig_strategy == "none" else settings.mig_strategy},
        "migManager": {"enabled": settings.mig_strategy != "none"},
        "daemonsets": {"tolerations": [toleration]},
    }
    return values


def network_operator_values(inventory: Inventory) -> dict[str, Any] | None:
    """Helm values for `nvidia/network-operator` (MOFED + RDMA shared device plugin), or None
    without InfiniBand. https://docs.nvidia.com/networking/display/kubernetes2510/index.html"""
    if not inventory.has_ib:
        return None
    return {
        "nfd": {"enabled": False},  # the GPU Operator's NFD already labels the nodes
        "deployCR": True,
        "ofedDriver": {"deploy": True},
        "rdmaSharedDevicePlugin": {
            "deploy": True,
            # Mellanox (vendor 15b3) InfiniBand ports; selectors, not names, so one value
            # file fits nodes whose HCAs enumerate differently.
            "resources": [{"name": "rdma_ib", "vendors": ["15b3"], "linkTypes": ["infiniband"]}],
        },
        "sriovDevicePlugin": {"deploy": False},
    }
