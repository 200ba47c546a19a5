"""Writes the Grafana dashboards in this folder (run `python deploy/grafana/build.py` after an
edit; a test checks the JSON files are what this script writes). Import them into Grafana with a
Prometheus data source named by the `datasource` variable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RATE = "$__rate_interval"
# GPUs a job holds: the agent's series carry team; on Kubernetes the DCGM exporter's series
# joined to platform pods (deploy/prometheus/rules/k8s.yml) do.
OWNED_UTIL = 'DCGM_FI_DEV_GPU_UTIL{team!=""} or tyard:DCGM_FI_DEV_GPU_UTIL:by_job'


def panel(
    title: str,
    *exprs: tuple[str, str],
    unit: str = "short",
    kind: str = "timeseries",
    stack: bool = False,
) -> dict[str, Any]:
    """One panel; exprs are (PromQL, legend) pairs."""
    out: dict[str, Any] = {
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(exprs)
        ],
    }
    if stack:
        out["fieldConfig"]["defaults"]["custom"] = {
            "stacking": {"mode": "normal"},
            "fillOpacity": 30,
        }
    return out


def variable(name: str, query: str, *, multi: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "multi": multi,
        "includeAll": multi,
    }


def dashboard(
    uid: str, title: str, panels: list[dict[str, Any]], variables: list[dict[str, Any]]
) -> dict[str, Any]:
    for i, p in enumerate(panels):
        p["id"] = i + 1
        p["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    source = {"name": "datasource", "type": "datasource", "query": "prometheus"}
    return {
        "uid": uid,
        "title": title,
        "tags": ["tensoryard"],
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [source, *variables]},
        "panels": panels,
    }


def cluster() -> dict[str, Any]:
    return dashboard(
        "tyard-cluster",
        "tensoryard / cluster",
        [
            panel(
                "GPUs in use by team",
                ("sum by (team) (tyard_team_gpus_used)", "{{team}}"),
                stack=True,
            ),
            panel(
                "Quota: nominal, borrowed, lent",
                ("sum by (team) (tyard_team_gpus_nominal)", "{{team}} nominal"),
                ("sum by (team) (tyard_team_gpus_borrowed)", "{{team}} borrowed"),
                ("sum by (team) (tyard_team_gpus_lent)", "{{team}} lent"),
            ),
            panel(
                "GPU utilisation",
                ("avg(DCGM_FI_DEV_GPU_UTIL)", "all GPUs"),
                # owned GPUs: the agent's series, or (Kubernetes) the DCGM exporter's joined
                (f"avg by (team) ({OWNED_UTIL})", "{{team}}"),
                unit="percent",
            ),
            panel(
                "Allocated GPUs",
                (f"count({OWNED_UTIL})", "allocated"),
                ("count(DCGM_FI_DEV_GPU_UTIL)", "all"),
            ),
            panel("Queue length by team", ("sum by (team) (tyard_queue_length)", "{{team}}")),
            panel("Jobs by state", ("sum by (state) (tyard_jobs)", "{{state}}"), stack=True),
            panel(
                "Time pending before admission (p50, p90)",
                (
                    "histogram_quantile(0.5, sum by (le, team) "
                    f"(rate(tyard_pending_seconds_bucket[{RATE}])))",
                    "{{team}} p50",
                ),
                (
                    "histogram_quantile(0.9, sum by (le, team) "
                    f"(rate(tyard_pending_seconds_bucket[{RATE}])))",
                    "{{team}} p90",
                ),
                unit="s",
            ),
            panel(
                "Scheduler pass duration (p99)",
                (
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(tyard_scheduler_cycle_seconds_bucket[{RATE}])))",
                    "p99",
                ),
                unit="s",
            ),
            panel(
                "Admissions and preemptions per hour",
                ("sum by (team) (increase(tyard_admissions_total[1h]))", "{{team}} admitted"),
                ("sum by (team) (increase(tyard_preemptions_total[1h]))", "{{team}} preempted"),
            ),
            panel(
                "GPU hours lost to preemption (24 h)",
                ("sum by (team) (increase(tyard_preemption_gpu_hours_total[24h]))", "{{team}}"),
            ),
            panel(
                "Restarts by reason (1 h)",
                ("sum by (reason) (increase(tyard_restarts_total[1h]))", "{{reason}}"),
            ),
        ],
        [variable("team", "label_values(tyard_team_gpus_nominal, team)", multi=True)],
    )


def job() -> dict[str, Any]:
    sel = 'job="$job"'
    return dashboard(
        "tyard-job",
        "tensoryard / job",
        [
            panel("Loss", (f"tyard_job_loss{{{sel}}}", "loss")),
            panel(
                "Step time",
                (f"tyard_job_step_time_seconds{{{sel}}}", "job"),
                (f"tyard_job_rank_step_time_seconds{{{sel}}}", "rank {{rank}}"),
                unit="s",
            ),
            panel("Tokens per second", (f"tyard_job_tokens_per_second{{{sel}}}", "tokens/s")),
            panel("Goodput", (f"tyard_job_goodput{{{sel}}}", "goodput"), unit="percentunit"),
            panel(
                "GPU utilisation per rank",
                (f"DCGM_FI_DEV_GPU_UTIL{{{sel}}}", "rank {{rank}}"),
                (f"tyard:DCGM_FI_DEV_GPU_UTIL:by_job{{{sel}}}", "rank {{rank}} GPU {{gpu}}"),
                unit="percent",
            ),
            panel(
                "GPU memory used per rank",
                (f"DCGM_FI_DEV_FB_USED{{{sel}}}", "rank {{rank}}"),
                (f"tyard:DCGM_FI_DEV_FB_USED:by_job{{{sel}}}", "rank {{rank}} GPU {{gpu}}"),
                unit="mbytes",
            ),
            panel(
                "GPU power per rank",
                (f"DCGM_FI_DEV_POWER_USAGE{{{sel}}}", "rank {{rank}}"),
                (f"tyard:DCGM_FI_DEV_POWER_USAGE:by_job{{{sel}}}", "rank {{rank}} GPU {{gpu}}"),
                unit="watt",
            ),
            panel(
                "Data-loader wait per rank",
                (f"tyard_job_data_wait_seconds{{{sel}}}", "rank {{rank}}"),
                unit="s",
            ),
            panel(
                "NCCL timeouts and warnings",
                (
                    "sum by (rank, op) "
                    f"(increase(tyard_nccl_collective_timeouts_total{{{sel}}}[1h]))",
                    "timeout rank {{rank}} {{op}}",
                ),
                (
                    f"sum by (host) (increase(tyard_nccl_warnings_total{{{sel}}}[1h]))",
                    "warnings {{host}}",
                ),
            ),
            panel(
                "NCCL bus bandwidth (NCCL Inspector plugin, when the job loads it)",
                (
                    f"tyard_nccl_inspector_bus_bandwidth_gbps{{{sel}}}",
                    "rank {{rank}} {{collective}} last",
                ),
                (
                    "sum by (collective) "
                    f"(rate(tyard_nccl_inspector_bytes_total{{{sel}}}[{RATE}]))"
                    " / sum by (collective) "
                    f"(rate(tyard_nccl_inspector_exec_seconds_total{{{sel}}}[{RATE}])) / 1e9",
                    "{{collective}} algorithm GB/s (mean)",
                ),
                unit="GBs",
            ),
            panel(
                "Checkpoint, step and heartbeat age",
                (f"tyard_job_last_checkpoint_age_seconds{{{sel}}}", "since checkpoint"),
                (f"tyard_job_last_step_age_seconds{{{sel}}}", "since step"),
                (f"tyard_job_heartbeat_age_seconds{{{sel}}}", "since heartbeat"),
                unit="s",
            ),
            panel(
                "Storage read per rank",
                (f"rate(tyard_job_io_read_bytes_total{{{sel}}}[{RATE}])", "rank {{rank}} disk"),
                (f"rate(tyard_job_io_read_chars_total{{{sel}}}[{RATE}])", "rank {{rank}} all"),
                unit="Bps",
            ),
        ],
        [variable("job", "label_values(tyard_job_step_time_seconds, job)")],
    )


def node() -> dict[str, Any]:
    gpu, inst = 'Hostname="$node"', 'instance=~"$node(:[0-9]+)?"'
    return dashboard(
        "tyard-node",
        "tensoryard / node",
        [
            panel(
                "XID events (1 h)",
                (
                    f"increase(tyard_gpu_xid_errors_total{{{gpu}}}[1h]) > 0",
                    "GPU {{gpu}} XID {{xid}}",
                ),
                (f"DCGM_FI_DEV_XID_ERRORS{{{gpu}}} > 0", "GPU {{gpu}} last XID"),
            ),
            panel(
                "ECC errors",
                (f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{gpu}}}", "GPU {{gpu}} SBE"),
                (f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{gpu}}}", "GPU {{gpu}} DBE"),
                (f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{gpu}}}", "GPU {{gpu}} rows remapped"),
                (f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{gpu}}}", "GPU {{gpu}} remap failed"),
            ),
            panel(
                "GPU and memory temperature",
                (f"DCGM_FI_DEV_GPU_TEMP{{{gpu}}}", "GPU {{gpu}}"),
                (f"DCGM_FI_DEV_MEMORY_TEMP{{{gpu}}}", "GPU {{gpu}} HBM"),
                unit="celsius",
            ),
            panel("Power", (f"DCGM_FI_DEV_POWER_USAGE{{{gpu}}}", "GPU {{gpu}}"), unit="watt"),
            panel(
                "Clock throttling",
                (f"tyard_gpu_clock_throttle_active{{{gpu}}} == 1", "GPU {{gpu}} {{reason}}"),
                (f"DCGM_FI_DEV_SM_CLOCK{{{gpu}}}", "GPU {{gpu}} SM MHz"),
            ),
            panel(
                "NVLink errors (rate)",
                (
                    f"rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{gpu}}}[{RATE}])",
                    "GPU {{gpu}} CRC flit",
                ),
                (
                    f"rate(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{{gpu}}}[{RATE}])",
                    "GPU {{gpu}} replay",
                ),
                (
                    f"rate(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{gpu}}}[{RATE}])",
                    "GPU {{gpu}} recovery",
                ),
            ),
            panel(
                "InfiniBand traffic",
                (
                    f"rate(node_infiniband_port_data_transmitted_bytes_total{{{inst}}}[{RATE}])",
                    "{{device}} tx",
                ),
                (
                    f"rate(node_infiniband_port_data_received_bytes_total{{{inst}}}[{RATE}])",
                    "{{device}} rx",
                ),
                unit="Bps",
            ),
            panel(
                "InfiniBand errors (1 h) and port state",
                (
                    f"increase(node_infiniband_symbol_error_total{{{inst}}}[1h])",
                    "{{device}} symbol",
                ),
                (f"increase(node_infiniband_link_downed_total{{{inst}}}[1h])", "{{device}} downed"),
                (f"node_infiniband_state_id{{{inst}}}", "{{device}} state (4 active)"),
            ),
            panel(
                "Disk throughput",
                (f"rate(node_disk_read_bytes_total{{{inst}}}[{RATE}])", "{{device}} read"),
                (f"rate(node_disk_written_bytes_total{{{inst}}}[{RATE}])", "{{device}} write"),
                unit="Bps",
            ),
            panel(
                "Filesystem free",
                (
                    f"node_filesystem_avail_bytes{{{inst}}} / node_filesystem_size_bytes{{{inst}}}",
                    "{{mountpoint}}",
                ),
                unit="percentunit",
            ),
            panel(
                "Agent collector errors (1 h)",
                (f"increase(tyard_collector_errors_total{{{inst}}}[1h])", "{{collector}}"),
            ),
        ],
        [variable("node", "label_values(DCGM_FI_DEV_GPU_TEMP, Hostname)")],
    )


def main() -> None:
    for name, build in (("cluster", cluster), ("job", job), ("node", node)):
        text = json.dumps(build(), indent=2, sort_keys=True) + "\n"
        (HERE / f"tensoryard-{name}.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
