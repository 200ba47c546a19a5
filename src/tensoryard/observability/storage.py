"""Storage: block devices (/proc/diskstats), shared filesystems (/proc/mounts,
/proc/self/mountstats) and per-job process I/O (/proc/<pid>/io)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.metrics_core import Metric

from tensoryard.observability import metrics as m
from tensoryard.observability.base import CollectorErrors, family, read_text

__all__ = [
    "DEFAULT_IGNORED_DEVICES",
    "SHARED_FSTYPES",
    "DiskstatsCollector",
    "JobProcess",
    "MountsCollector",
    "ProcessIoCollector",
    "is_shared_fstype",
]

# node_exporter's default --collector.diskstats.device-exclude: partitions, ram, loop devices.
DEFAULT_IGNORED_DEVICES = re.compile(r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$")
SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's sector size
SHARED_FSTYPES = frozenset({"nfs", "nfs4", "lustre", "gpfs", "ceph", "cifs", "beegfs", "wekafs"})


def is_shared_fstype(fstype: str) -> bool:
    """Network and FUSE filesystems (JuiceFS mounts as fuse.juicefs), not fusectl."""
    return fstype in SHARED_FSTYPES or (fstype.startswith("fuse") and fstype != "fusectl")


class DiskstatsCollector:
    """Reads, writes, bytes and time per block device from `proc`/diskstats."""

    NAME = "diskstats"

    def __init__(
        self,
        proc: str | Path = "/proc",
        *,
        ignore: re.Pattern[str] = DEFAULT_IGNORED_DEVICES,
        errors: CollectorErrors | None = None,
    ) -> None:
        self.path = Path(proc) / "diskstats"
        self.ignore = ignore
        self.errors = errors if errors is not None else CollectorErrors()

    def collect(self) -> Iterable[Metric]:
        fams = {d.name: family(d) for d in m.DISK}
        try:
            text = read_text(self.path)
        except (OSError, UnicodeError) as exc:
            self.errors.record(self.NAME, str(self.path), exc)
            text = ""
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 14:
                self.errors.record(self.NAME, "malformed line", repr(line))
                continue
            device = fields[2]
            if self.ignore.match(device):
                continue
            try:
                v = [int(x) for x in fields[3:14]]
            except ValueError:
                self.errors.record(self.NAME, "malformed line", repr(line))
                continue
            for name, value in (
                ("node_disk_reads_completed_total", v[0]),
                ("node_disk_read_bytes_total", v[2] * SECTOR),
                ("node_disk_read_time_seconds_total", v[3] / 1000),
                ("node_disk_writes_completed_total", v[4]),
                ("node_disk_written_bytes_total", v[6] * SECTOR),
                ("node_disk_write_time_seconds_total", v[7] / 1000),
                ("node_disk_io_now", v[8]),
                ("node_disk_io_time_seconds_total", v[9] / 1000),
            ):
                fams[name].add_metric([device], value)
        yield from fams.values()


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda x: chr(int(x.group(1), 8)), field)


class MountsCollector:
    """Shared filesystems from `proc`/mounts, with NFS byte and RPC counters from
    `proc`/self/mountstats. Lustre, GPFS and FUSE mounts get tyard_mount_info only."""

    NAME = "mounts"

    def __init__(
        self, proc: str | Path = "/proc", *, errors: CollectorErrors | None = None
    ) -> None:
        self.proc = Path(proc)
        self.errors = errors if errors is not None else CollectorErrors()

    def collect(self) -> Iterable[Metric]:
        info = family(m.by_name("tyard_mount_info"))
        for export, mountpoint, fstype in self._mounts():
            info.add_metric([mountpoint, export, fstype], 1)
        yield info
        yield from self._nfs()

    def _read(self, path: Path) -> str:
        try:
            return read_text(path)
        except (OSError, UnicodeError) as exc:
            self.errors.record(self.NAME, str(path), exc)
            return ""

    def _mounts(self) -> list[tuple[str, str, str]]:
        out = []
        for line in self._read(self.proc / "mounts").splitlines():
            fields = line.split()
            if len(fields) < 3:
                self.errors.record(self.NAME, "malformed mounts line", repr(line))
                continue
            if is_shared_fstype(fields[2]):
                out.append((_unescape(fields[0]), _unescape(fields[1]), fields[2]))
        return out

    def _nfs(self) -> Iterable[Metric]:
        read, written = (
            family(m.by_name(n))
            for n in ("tyard_nfs_read_bytes_total", "tyard_nfs_write_bytes_total")
        )
        ops, timeouts, rtt = (
            family(m.by_name(n))
            for n in (
                "tyard_nfs_operations_total",
                "tyard_nfs_operation_timeouts_total",
                "tyard_nfs_operation_rtt_seconds_total",
            )
        )
        labels: list[str] | None = None
        in_ops = False
        for line in self._read(self.proc / "self" / "mountstats").splitlines():
            if line.startswith("device "):
                labels, in_ops = _nfs_device(line), False
                continue
            if labels is None:
                continue
            key, _, rest = line.strip().partition(":")
            try:
                if key == "bytes":
                    b = [int(x) for x in rest.split()]
                    read.add_metric(labels, b[0] + b[2])  # normal + O_DIRECT reads
                    written.add_metric(labels, b[1] + b[3])
                elif key == "per-op statistics":
                    in_ops = True
                elif in_ops and rest:
                    s = [int(x) for x in rest.split()]
                    if s[0]:
                        ops.add_metric([*labels, key], s[0])
                        timeouts.add_metric([*labels, key], s[2])
                        rtt.add_metric([*labels, key], s[6] / 1000)
            except (ValueError, IndexError):
                self.errors.record(self.NAME, "malformed mountstats line", repr(line))
        yield from (read, written, ops, timeouts, rtt)


_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (nfs4?)\b")


def _nfs_device(line: str) -> list[str] | None:
    """[mountpoint, export] of an NFS 'device ...' line; None for other filesystems."""
    match = _DEVICE.match(line)
    return [_unescape(match.group(2)), _unescape(match.group(1))] if match else None


@dataclass(frozen=True)
class JobProcess:
    """A process of a job's rank on this node, as the agent knows it."""

    pid: int
    job: str
    team: str
    rank: str


_IO_FIELDS = {
    "read_bytes": "tyard_job_io_read_bytes_total",
    "write_bytes": "tyard_job_io_written_bytes_total",
    "rchar": "tyard_job_io_read_chars_total",
    "wchar": "tyard_job_io_written_chars_total",
}


class ProcessIoCollector:
    """/proc/<pid>/io of the processes `processes()` names, summed per (job, team, rank).

    A process that exits between the listing and the read is skipped without counting an
    error (jobs end all the time); unreadable or malformed io files are counted.
    """

    NAME = "process_io"

    def __init__(
        self,
        processes: Callable[[], Sequence[JobProcess]],
        proc: str | Path = "/proc",
        *,
        errors: CollectorErrors | None = None,
    ) -> None:
        self.processes = processes
        self.proc = Path(proc)
        self.errors = errors if errors is not None else CollectorErrors()

    def collect(self) -> Iterable[Metric]:
        totals: dict[tuple[str, str, str], dict[str, int]] = {}
        for p in self.processes():
            values = self._io(p.pid)
            if values is None:
                continue
            into = totals.setdefault((p.job, p.team, p.rank), dict.fromkeys(_IO_FIELDS, 0))
            for key in _IO_FIELDS:
                into[key] += values.get(key, 0)
        fams = {key: family(m.by_name(name)) for key, name in _IO_FIELDS.items()}
        for labels, values in sorted(totals.items()):
            for key, value in values.items():
                fams[key].add_metric(list(labels), value)
        yield from fams.values()

    def _io(self, pid: int) -> dict[str, int] | None:
        path = self.proc / str(pid) / "io"
        try:
            text = read_text(path)
        except (FileNotFoundError, ProcessLookupError):
            return None
        except (OSError, UnicodeError) as exc:
            self.errors.record(self.NAME, str(path), exc)
            return None
        values = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            try:
                values[key.strip()] = int(value)
            except ValueError:
                self.errors.record(self.NAME, f"malformed line in {path}", repr(line))
        return values
