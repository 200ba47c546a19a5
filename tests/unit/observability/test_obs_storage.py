from __future__ import annotations

import os
from pathlib import Path

from _scrape import scrape, value

from tensoryard.observability.base import CollectorErrors
from tensoryard.observability.storage import (
    DiskstatsCollector,
    JobProcess,
    MountsCollector,
    ProcessIoCollector,
)

ERRORS = "tyard_collector_errors_total"


def _devices(samples, name: str) -> set[str]:
    return {dict(ls)["device"] for n, ls in samples if n == name}


def test_diskstats_of_the_recorded_tree_in_bytes_and_seconds(fixtures: Path):
    s = scrape(DiskstatsCollector(fixtures / "proc"))
    # partitions and loop devices are left out, as node_exporter does by default
    assert _devices(s, "node_disk_reads_completed_total") == {"nvme0n1", "nvme1n1", "dm-0"}
    assert value(s, "node_disk_reads_completed_total", device="nvme0n1") == 2847162
    assert value(s, "node_disk_read_bytes_total", device="nvme0n1") == 412395120 * 512
    assert value(s, "node_disk_written_bytes_total", device="nvme0n1") == 1836547200 * 512
    assert value(s, "node_disk_write_time_seconds_total", device="nvme0n1") == 4512.360
    assert value(s, "node_disk_io_now", device="nvme1n1") == 2
    assert value(s, "node_disk_io_time_seconds_total", device="dm-0") == 0.001


def test_malformed_diskstats_lines_are_counted(tmp_path: Path, fixtures: Path):
    (tmp_path / "diskstats").write_text(
        (fixtures / "proc/diskstats").read_text()
        + " 8 0 sda 1 2\n 8 16 sdb x y z 1 2 3 4 5 6 7 8\n"
    )
    errors = CollectorErrors()
    s = scrape(DiskstatsCollector(tmp_path, errors=errors), errors)
    assert value(s, ERRORS, collector="diskstats") == 2
    assert value(s, "node_disk_reads_completed_total", device="nvme0n1") == 2847162


def test_a_missing_proc_is_an_error_and_an_empty_answer(tmp_path: Path):
    errors = CollectorErrors()
    s = scrape(DiskstatsCollector(tmp_path / "none", errors=errors), errors)
    assert value(s, ERRORS, collector="diskstats") == 1


def test_this_machines_diskstats_match_its_proc():
    s = scrape(DiskstatsCollector("/proc"))
    rows = [line.split() for line in Path("/proc/diskstats").read_text().splitlines()]
    whole = {r[2]: int(r[3]) for r in rows if not r[2].startswith("loop")}
    seen = _devices(s, "node_disk_reads_completed_total")
    assert seen and seen <= set(whole)
    for device in seen:  # counters only grow between the two reads
        assert value(s, "node_disk_reads_completed_total", device=device) >= whole[device]


def test_shared_filesystems_and_nfs_counters_from_the_recorded_tree(fixtures: Path):
    s = scrape(MountsCollector(fixtures / "proc"))
    mounts = {dict(ls)["mountpoint"]: dict(ls)["fstype"] for n, ls in s if n == "tyard_mount_info"}
    assert mounts == {
        "/mnt/datasets": "nfs4",
        "/lustre/scratch": "lustre",
        "/mnt/ckpt store": "fuse.juicefs",
        "/gpfs/gpfs1": "gpfs",
    }
    nfs = {"mountpoint": "/mnt/datasets", "export": "10.0.0.5:/export/datasets"}
    assert value(s, "tyard_nfs_read_bytes_total", **nfs) == 981237123072 + 2147483648
    assert value(s, "tyard_nfs_write_bytes_total", **nfs) == 1048576
    assert value(s, "tyard_nfs_operations_total", operation="READ", **nfs) == 468001
    assert value(s, "tyard_nfs_operation_timeouts_total", operation="READ", **nfs) == 3
    assert value(s, "tyard_nfs_operation_rtt_seconds_total", operation="READ", **nfs) == 3128.842
    ops = {dict(ls)["operation"] for n, ls in s if n == "tyard_nfs_operations_total"}
    assert ops == {"NULL", "READ", "WRITE", "GETATTR"}  # COMMIT never ran


def test_this_machines_mounts_are_read_without_errors():
    errors = CollectorErrors()
    s = scrape(MountsCollector("/proc", errors=errors), errors)
    shared = [
        line
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[2].startswith(("nfs", "fuse.", "lustre", "gpfs"))
    ]
    assert len([k for k in s if k[0] == "tyard_mount_info"]) == len(shared)
    assert errors.count("mounts") == 0


def test_process_io_is_summed_per_rank(fixtures: Path):
    procs = [
        JobProcess(4242, "llama-7b", "research", "0"),
        JobProcess(4243, "llama-7b", "research", "0"),  # a data-loader worker of rank 0
        JobProcess(999999, "llama-7b", "research", "1"),  # exited: skipped, not an error
    ]
    errors = CollectorErrors()
    s = scrape(ProcessIoCollector(lambda: procs, fixtures / "proc", errors=errors), errors)
    rank0 = {"job": "llama-7b", "team": "research", "rank": "0"}
    assert value(s, "tyard_job_io_read_bytes_total", **rank0) == 41943040000 + 512
    assert value(s, "tyard_job_io_written_chars_total", **rank0) == 1048576 + 2000
    assert not [k for k in s if dict(k[1]).get("rank") == "1"]
    assert errors.count("process_io") == 0


def test_this_processes_real_io_counters_grow_when_it_writes(tmp_path: Path):
    me = [JobProcess(os.getpid(), "self", "t", "0")]
    collector = ProcessIoCollector(lambda: me)
    before = value(scrape(collector), "tyard_job_io_written_chars_total", job="self")
    (tmp_path / "blob").write_bytes(b"x" * 1_000_000)
    after = value(scrape(collector), "tyard_job_io_written_chars_total", job="self")
    assert after - before >= 1_000_000
