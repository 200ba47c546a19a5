from __future__ import annotations

from pathlib import Path

from _scrape import names, scrape, value
from prometheus_client import REGISTRY

from tensoryard.observability import (
    CollectorErrors,
    GpuOwner,
    JobProcess,
    NcclLogSource,
    agent_registry,
    node_collectors,
)
from tensoryard.observability.registry import render


def test_the_agent_registry_holds_every_node_collector_and_one_error_counter(
    fixtures: Path, h100x8, tmp_path: Path
):
    errors = CollectorErrors()
    (tmp_path / "nccl").mkdir()
    (tmp_path / "nccl" / "nccl-node7-1.log").write_text("node7:1:1 [0] NCCL WARN oops\n")
    collectors = node_collectors(
        proc=fixtures / "proc",
        sys=fixtures / "sys",
        nvml=h100x8,
        gpu_owners=lambda: {0: GpuOwner("llama", "research", "0")},
        job_processes=lambda: [JobProcess(4242, "llama", "research", "0")],
        nccl_sources=lambda: [NcclLogSource(tmp_path / "nccl", "llama", "research")],
        errors=errors,
    )
    assert collectors[-1] is errors
    s = scrape(*collectors)
    assert {
        "node_infiniband_state_id",
        "node_disk_reads_completed_total",
        "tyard_mount_info",
        "tyard_job_io_read_bytes_total",
        "DCGM_FI_DEV_GPU_UTIL",
        "tyard_nccl_warnings_total",
    } <= names(s)
    assert value(s, "DCGM_FI_DEV_GPU_UTIL", gpu="0", job="llama") == 98
    assert not [k for k in s if k[0] == "tyard_collector_errors_total"]


def test_the_agent_registry_is_its_own_not_the_global_one(fixtures: Path):
    before = set(REGISTRY._collector_to_names)
    registry = agent_registry(
        node_collectors(proc=fixtures / "proc", sys=fixtures / "sys", nvml=None)
    )
    assert registry is not REGISTRY
    assert set(REGISTRY._collector_to_names) == before


def test_errors_of_one_scrape_show_in_that_scrape(tmp_path: Path):
    registry = agent_registry(node_collectors(proc=tmp_path / "no-proc", sys=tmp_path, nvml=None))
    text = render(registry).decode()
    assert 'tyard_collector_errors_total{collector="diskstats"} 1' in text
    assert 'tyard_collector_errors_total{collector="mounts"} 2' in text


def test_the_exposition_escapes_label_values():
    errors = CollectorErrors()
    errors.record('we"ird\\name\n', "x", "y")
    text = render(agent_registry([errors])).decode()
    assert 'collector="we\\"ird\\\\name\\n"} 1' in text
