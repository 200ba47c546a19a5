"""Every metric name tensoryard's node agent and in-job runtime export, in one place.

Alert rules and dashboards (deploy/prometheus, deploy/grafana) may use only these names, the
DCGM exporter's (``DCGM_FI_*``), node_exporter's (``node_*``), Prometheus' own ``up``, and the
control plane's (``CONTROL_PLANE`` below, exported by ``tensoryard.server``); a test checks it.

Naming: where node_exporter already has a metric for the same file, the agent uses its name and
labels unchanged (InfiniBand: node_exporter 1.5's ``infiniband`` collector; disks: its
``diskstats`` collector), so dashboards written for node_exporter work on either. GPU metrics use
the DCGM exporter's names, units and types (NVIDIA/dcgm-exporter etc/default-counters.csv).
Everything else is ``tyard_*``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALL",
    "COLLECTOR_ERRORS",
    "CONTROL_PLANE",
    "DCGM",
    "DCGM_EXTRA",
    "DCGM_JOINED",
    "DISK",
    "GPU_TYARD",
    "IB",
    "IB_HW_COUNTER",
    "JOB_DATA_WAIT",
    "JOB_IO",
    "JOB_RANK_STEP_TIME",
    "K8S_PODS",
    "MOUNT",
    "NCCL",
    "SERVING_ENGINE",
    "MetricDef",
    "by_name",
    "names",
]


@dataclass(frozen=True)
class MetricDef:
    """One metric: its full name (counters end in _total), type, help text and labels."""

    name: str
    type: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()


def _defs(kind: str, labels: tuple[str, ...], rows: list[tuple[str, str]]) -> tuple[MetricDef, ...]:
    return tuple(MetricDef(name, kind, help_, labels) for name, help_ in rows)


COLLECTOR_ERRORS = MetricDef(
    "tyard_collector_errors_total",
    "counter",
    "Errors a node collector met while scraping (missing root, unreadable or malformed file, "
    "device gone); the scrape still answers.",
    ("collector",),
)

# --- InfiniBand: node_exporter 1.5 names, labels device and port ------------------------------
_PORT = ("device", "port")
# (node_exporter name suffix, sysfs counter file, multiplier)
IB_COUNTER_FILES: tuple[tuple[str, str, int], ...] = (
    ("excessive_buffer_overrun_errors_total", "excessive_buffer_overrun_errors", 1),
    ("link_downed_total", "link_downed", 1),
    ("link_error_recovery_total", "link_error_recovery", 1),
    ("local_link_integrity_errors_total", "local_link_integrity_errors", 1),
    ("multicast_packets_received_total", "multicast_rcv_packets", 1),
    ("multicast_packets_transmitted_total", "multicast_xmit_packets", 1),
    ("port_constraint_errors_received_total", "port_rcv_constraint_errors", 1),
    ("port_constraint_errors_transmitted_total", "port_xmit_constraint_errors", 1),
    ("port_data_received_bytes_total", "port_rcv_data", 4),  # 4-byte words
    ("port_data_transmitted_bytes_total", "port_xmit_data", 4),
    ("port_discards_transmitted_total", "port_xmit_discards", 1),
    ("port_errors_received_total", "port_rcv_errors", 1),
    ("port_packets_received_total", "port_rcv_packets", 1),
    ("port_packets_transmitted_total", "port_xmit_packets", 1),
    ("port_receive_remote_physical_errors_total", "port_rcv_remote_physical_errors", 1),
    ("port_receive_switch_relay_errors_total", "port_rcv_switch_relay_errors", 1),
    ("port_transmit_wait_total", "port_xmit_wait", 1),
    ("symbol_error_total", "symbol_error", 1),
    ("unicast_packets_received_total", "unicast_rcv_packets", 1),
    ("unicast_packets_transmitted_total", "unicast_xmit_packets", 1),
    ("vl15_dropped_total", "VL15_dropped", 1),
)
IB = (
    *(
        MetricDef(
            f"node_infiniband_{suffix}",
            "counter",
            f"InfiniBand port counter {file}"
            + (" (sysfs counts 4-byte words; here bytes)" if mult == 4 else ""),
            _PORT,
        )
        for suffix, file, mult in IB_COUNTER_FILES
    ),
    MetricDef(
        "node_infiniband_state_id",
        "gauge",
        "Port state (1 down, 2 init, 3 armed, 4 active, 5 active defer)",
        _PORT,
    ),
    MetricDef(
        "node_infiniband_physical_state_id",
        "gauge",
        "Physical port state (2 polling, 3 disabled, 5 link up, 6 link error recovery)",
        _PORT,
    ),
    MetricDef("node_infiniband_rate_bytes_per_second", "gauge", "Port signalling rate", _PORT),
    MetricDef(
        "node_infiniband_info",
        "gauge",
        "HCA identity",
        ("board_id", "device", "firmware_version", "hca_type"),
    ),
)
IB_HW_COUNTER = MetricDef(
    "tyard_ib_hw_counter_total",
    "counter",
    "Driver (hw_counters) counter of an RDMA port, e.g. out_of_buffer, local_ack_timeout_err",
    ("device", "port", "counter"),
)

# --- Disks: node_exporter's diskstats names, label device -------------------------------------
DISK = (
    *_defs(
        "counter",
        ("device",),
        [
            ("node_disk_reads_completed_total", "Reads completed"),
            ("node_disk_read_bytes_total", "Bytes read"),
            ("node_disk_read_time_seconds_total", "Time spent reading"),
            ("node_disk_writes_completed_total", "Writes completed"),
            ("node_disk_written_bytes_total", "Bytes written"),
            ("node_disk_write_time_seconds_total", "Time spent writing"),
            ("node_disk_io_time_seconds_total", "Time spent doing I/O"),
        ],
    ),
    MetricDef("node_disk_io_now", "gauge", "I/Os in progress", ("device",)),
)

# --- Shared filesystems (NFS, Lustre, GPFS, JuiceFS, other FUSE) ------------------------------
_MNT = ("mountpoint", "export")
MOUNT = (
    MetricDef(
        "tyard_mount_info",
        "gauge",
        "A network or FUSE filesystem mounted on this node",
        ("mountpoint", "export", "fstype"),
    ),
    *_defs(
        "counter",
        _MNT,
        [
            ("tyard_nfs_read_bytes_total", "Bytes read by applications through this NFS mount"),
            ("tyard_nfs_write_bytes_total", "Bytes written by applications through this NFS mount"),
        ],
    ),
    *_defs(
        "counter",
        (*_MNT, "operation"),
        [
            ("tyard_nfs_operations_total", "NFS RPC operations sent"),
            ("tyard_nfs_operation_timeouts_total", "NFS RPC operations that timed out"),
            ("tyard_nfs_operation_rtt_seconds_total", "Total round-trip time of NFS RPCs"),
        ],
    ),
)

# --- Per-job process I/O (/proc/<pid>/io summed over a rank's processes) ----------------------
_RANK = ("job", "team", "rank")
JOB_IO = _defs(
    "counter",
    _RANK,
    [
        (
            "tyard_job_io_read_bytes_total",
            "Bytes a rank's processes caused to be read from storage",
        ),
        ("tyard_job_io_written_bytes_total", "Bytes a rank's processes caused to be written"),
        (
            "tyard_job_io_read_chars_total",
            "Bytes a rank's processes read through read()-like calls",
        ),
        (
            "tyard_job_io_written_chars_total",
            "Bytes a rank's processes wrote via write()-like calls",
        ),
    ],
)

# --- GPUs: DCGM exporter names (see module docstring) ----------------------------------------
_GPU = ("gpu", "UUID", "device", "modelName", "Hostname", "job", "team", "rank")
DCGM = (
    *_defs(
        "gauge",
        _GPU,
        [
            ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
            ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),
            ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
            ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
            ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
            ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
            ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
            ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
            ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed"),
        ],
    ),
    *_defs(
        "counter",
        _GPU,
        [
            (
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "Total energy consumption since boot (in mJ).",
            ),
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors."),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors."),
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors."),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors."),
            (
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                "Number of remapped rows for correctable errors",
            ),
            (
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "Number of remapped rows for uncorrectable errors",
            ),
            (
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                "Total number of NVLink flow-control CRC errors.",
            ),
            (
                "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                "Total number of NVLink data CRC errors.",
            ),
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries."),
            (
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                "Total number of NVLink recovery errors.",
            ),
            (
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                "Total NVLink data (tx+rx, all links) in KiB, from NVML's THROUGHPUT_DATA fields.",
            ),
            (
                "DCGM_FI_DEV_POWER_VIOLATION",
                "Throttling duration due to power constraints (in ns).",
            ),
            (
                "DCGM_FI_DEV_THERMAL_VIOLATION",
                "Throttling duration due to thermal constraints (in ns).",
            ),
        ],
    ),
)
# A DCGM field (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, id 112) the exporter's default CSV leaves out.
DCGM_EXTRA = (
    MetricDef(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons (NVML bitmask).",
        _GPU,
    ),
)
GPU_TYARD = (
    MetricDef(
        "tyard_gpu_clock_throttle_active",
        "gauge",
        "1 while this clock throttle reason is active (PromQL has no bitwise AND)",
        (*_GPU, "reason"),
    ),
    MetricDef(
        "tyard_gpu_xid_errors_total",
        "counter",
        "XID events NVML reported for this GPU since the agent started",
        (*_GPU, "xid"),
    ),
)

# --- NCCL logs ---------------------------------------------------------------------------------
_NCCL = ("job", "team", "host")
NCCL = (
    *_defs(
        "counter",
        _NCCL,
        [
            (
                "tyard_nccl_init_complete_total",
                "NCCL communicators initialised (Init COMPLETE lines)",
            ),
            ("tyard_nccl_warnings_total", "NCCL WARN lines"),
            (
                "tyard_nccl_malformed_lines_total",
                "NCCL-looking log lines the parser could not read",
            ),
        ],
    ),
    MetricDef(
        "tyard_nccl_collective_timeouts_total",
        "counter",
        "Collective timeouts (PyTorch watchdog or NCCL) by operation",
        (*_NCCL, "rank", "op"),
    ),
)
# NCCL Inspector (profiler plugin) records: one per collective per communicator; the rank is
# the communicator's, the collective one of NCCL's few names (bounded labels)
_INSPECTOR = ("job", "team", "rank", "collective")
NCCL_INSPECTOR = (
    MetricDef(
        "tyard_nccl_inspector_collectives_total",
        "counter",
        "Collectives the NCCL Inspector plugin recorded",
        _INSPECTOR,
    ),
    MetricDef(
        "tyard_nccl_inspector_bytes_total",
        "counter",
        "Message bytes of the recorded collectives (coll_msg_size_bytes)",
        _INSPECTOR,
    ),
    MetricDef(
        "tyard_nccl_inspector_exec_seconds_total",
        "counter",
        "Execution time of the recorded collectives (coll_exec_time_us)",
        _INSPECTOR,
    ),
    MetricDef(
        "tyard_nccl_inspector_bus_bandwidth_gbps",
        "gauge",
        "Bus bandwidth of the last recorded collective of this kind in GB/s (coll_busbw_gbs)",
        _INSPECTOR,
    ),
)

# --- In-job runtime (exported by tensoryard.runtime, defined here for rules and dashboards) ----
JOB_DATA_WAIT = MetricDef(
    "tyard_job_data_wait_seconds",
    "gauge",
    "Seconds the last training step of this rank waited for its batch from the data loader",
    _RANK,
)
JOB_RANK_STEP_TIME = MetricDef(
    "tyard_job_rank_step_time_seconds",
    "gauge",
    "Duration of this rank's last training step (straggler detection)",
    _RANK,
)
JOB_COLLECTIVE_BUSBW = MetricDef(
    "tyard_job_collective_busbw_gbps",
    "gauge",
    "Bus bandwidth of this rank's last all-reduce probe in GB/s (opt-in: "
    "TYARD_COLLECTIVE_PROBE_EVERY steps)",
    _RANK,
)

# --- Control plane (exported by tensoryard.server /metrics; names agreed with its owner) -------
_JOB = ("job", "team")
CONTROL_PLANE = (
    MetricDef("tyard_jobs", "gauge", "Jobs by state", ("state", "team")),
    MetricDef("tyard_queue_length", "gauge", "Pending jobs", ("team",)),
    MetricDef("tyard_pending_seconds", "histogram", "Time jobs waited before admission", ("team",)),
    *_defs(
        "gauge",
        ("team",),
        [
            ("tyard_team_gpus_nominal", "GPUs the team's quota guarantees"),
            ("tyard_team_gpus_used", "GPUs the team's running jobs hold"),
            (
                "tyard_team_gpus_borrowed",
                "GPUs used beyond nominal quota, borrowed from the cohort",
            ),
            ("tyard_team_gpus_lent", "Nominal GPUs of the team used by others"),
        ],
    ),
    MetricDef("tyard_scheduler_cycle_seconds", "histogram", "Scheduling pass duration"),
    *_defs(
        "counter",
        ("team",),
        [
            ("tyard_admissions_total", "Jobs admitted"),
            ("tyard_preemptions_total", "Jobs preempted"),
            ("tyard_preemption_gpu_hours_total", "GPU hours of work lost to preemption"),
        ],
    ),
    MetricDef(
        "tyard_job_badput_seconds",
        "gauge",
        "Seconds lost by kind (docs/goodput.md)",
        ("job", "team", "kind"),
    ),
    MetricDef("tyard_restarts_total", "counter", "Job restarts", ("team", "reason")),
    MetricDef(
        "tyard_node_state",
        "gauge",
        "1 for the node's cordon state (ready, cordoned, draining), 0 for the others",
        ("node", "state"),
    ),
    *_defs(
        "gauge",
        _JOB,
        [
            ("tyard_job_step_time_seconds", "Last training step duration"),
            ("tyard_job_tokens_per_second", "Training throughput"),
            ("tyard_job_loss", "Last training loss"),
            ("tyard_job_goodput", "Fraction of wall time spent on productive steps"),
            ("tyard_job_allocated_seconds", "Seconds the job's attempts held resources"),
            ("tyard_job_productive_seconds", "Seconds in training steps that were kept"),
            ("tyard_job_allocated_goodput", "Productive seconds / allocated seconds"),
            (
                "tyard_job_last_checkpoint_age_seconds",
                "Seconds since the last committed checkpoint",
            ),
            ("tyard_job_last_step_age_seconds", "Seconds since the last completed step"),
            ("tyard_job_heartbeat_age_seconds", "Seconds since the job's last heartbeat"),
            (
                "tyard_job_pending_eta_overdue_seconds",
                "How far a pending job is past its start ETA",
            ),
        ],
    ),
)

# --- Platform pods on Kubernetes (the control plane's PodCollector, executors/kubernetes) ------
_POD = ("job", "team", "rank", "namespace", "pod")
K8S_PODS = (
    MetricDef(
        "tyard_k8s_pods_observed",
        "gauge",
        "1 when the control plane could read its pods from Kubernetes",
    ),
    MetricDef("tyard_k8s_pods", "gauge", "Pods of platform jobs by phase", ("phase",)),
    MetricDef(
        "tyard_k8s_pod_info",
        "gauge",
        "1 per live pod of a platform job (the pod -> job map DCGM series are joined with)",
        ("job", "team", "attempt", "rank", "namespace", "pod", "node"),
    ),
    MetricDef("tyard_k8s_pod_phase", "gauge", "1 per live pod, by phase", (*_POD, "phase")),
    MetricDef(
        "tyard_k8s_pod_container_restarts", "gauge", "Container restarts of a live pod", _POD
    ),
    MetricDef(
        "tyard_k8s_pod_oom_killed",
        "gauge",
        "1 when a live pod's container last ended OOMKilled",
        _POD,
    ),
    MetricDef(
        "tyard_k8s_pods_waiting", "gauge", "Pending pods by why they do not run", ("reason",)
    ),
    MetricDef(
        "tyard_k8s_pods_failed", "gauge", "Failed pods kept by their owner, by why", ("reason",)
    ),
)

# --- Recording rules (deploy/prometheus/rules/k8s.yml): DCGM exporter series joined to jobs ----
DCGM_JOINED = tuple(
    MetricDef(
        f"tyard:{name}:by_job",
        "gauge",
        f"The DCGM exporter's {name} of GPUs held by platform pods, labelled job, team, rank",
        ("job", "team", "rank", "gpu", "Hostname", "namespace", "pod"),
    )
    for name in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
    )
)

# GPU serving engines' own metrics, scraped from their pods (serving/engine_scrape.py)
SERVING_ENGINE: tuple[MetricDef, ...] = (
    *_defs(
        "gauge",
        ("deployment", "pod"),
        [
            (
                "tyard_serving_engine_scrape_ok",
                "1 when the last scrape of the engine's /metrics answered and parsed.",
            ),
            (
                "tyard_serving_engine_kv_usage_ratio",
                "KV-cache use of the engine, 0..1 (engine's own metric).",
            ),
            (
                "tyard_serving_engine_prefix_hit_ratio",
                "Prefix-cache hit ratio of the engine (engine's own metric).",
            ),
            (
                "tyard_serving_engine_running_requests",
                "Requests the engine is running (engine's own metric).",
            ),
            (
                "tyard_serving_engine_waiting_requests",
                "Requests waiting in the engine's queue (engine's own metric).",
            ),
        ],
    ),
    MetricDef(
        "tyard_serving_engine_metric_missing",
        "gauge",
        "1 for each contract metric the engine's /metrics lacks (renamed or disabled).",
        ("deployment", "pod", "metric"),
    ),
)

ALL: tuple[MetricDef, ...] = (
    COLLECTOR_ERRORS,
    *IB,
    IB_HW_COUNTER,
    *DISK,
    *MOUNT,
    *JOB_IO,
    *DCGM,
    *DCGM_EXTRA,
    *GPU_TYARD,
    *NCCL,
    *NCCL_INSPECTOR,
    JOB_DATA_WAIT,
    JOB_RANK_STEP_TIME,
    JOB_COLLECTIVE_BUSBW,
    *CONTROL_PLANE,
    *K8S_PODS,
    *DCGM_JOINED,
    *SERVING_ENGINE,
)


def names() -> frozenset[str]:
    """Every metric name above, as PromQL sees it (histograms with their series suffixes)."""
    out: set[str] = set()
    for d in ALL:
        out.add(d.name)
        if d.type == "histogram":
            out.update(f"{d.name}_{s}" for s in ("bucket", "sum", "count"))
    return frozenset(out)


def by_name(name: str) -> MetricDef:
    """The definition called `name` (KeyError names the unknown metric)."""
    return _BY_NAME[name]


_BY_NAME = {d.name: d for d in ALL}
