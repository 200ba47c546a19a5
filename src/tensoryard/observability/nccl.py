"""NCCL debug output and PyTorch watchdog lines -> counters and events; and the env a job needs
to leave that output (and PyTorch's flight-recorder dumps) in its run directory.

The parser never raises: a line that looks like NCCL output but cannot be read is counted as
malformed; unrelated lines are ignored.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.metrics_core import Metric

from tensoryard.observability import metrics as m
from tensoryard.observability.base import CollectorErrors, family

__all__ = [
    "InspectorStats",
    "NcclEvent",
    "NcclLogCollector",
    "NcclLogSource",
    "NcclLogStats",
    "nccl_debug_env",
    "parse_line",
]

# "<host>:<pid>:<tid> [<cuda dev>] NCCL <LEVEL> <message>" (NCCL's debug.cc prefix)
_NCCL = re.compile(
    r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL "
    r"(?P<level>INFO|WARN|ERROR|TRACE|ABORT) ?(?P<msg>.*)$"
)
_NCCL_ANY = re.compile(r"\bNCCL (INFO|WARN|ERROR|TRACE|ABORT)\b")
_COMM = re.compile(r"\brank (?P<rank>\d+) nranks (?P<nranks>\d+)\b")
# PyTorch ProcessGroupNCCL: "[Rank 3] Watchdog caught collective operation timeout:
#   WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, ... Timeout(ms)=600000) ran for 600012 milliseconds"
_WATCHDOG = "Watchdog caught collective operation timeout"
_TORCH_RANK = re.compile(r"\[Rank (?P<rank>\d+)\]")
_OPTYPE = re.compile(r"OpType=(?P<op>[A-Z_]+)")
_SEQ = re.compile(r"SeqNum=(?P<seq>\d+)")
_RAN_FOR = re.compile(r"ran for (?P<ms>\d+) milliseconds")


@dataclass(frozen=True)
class NcclEvent:
    """One meaningful line: kind is init_complete | warn | error | collective_timeout."""

    kind: str
    host: str = ""
    rank: str = ""
    op: str = ""
    seq: int | None = None
    ran_for_s: float | None = None
    message: str = ""


def parse_line(line: str) -> NcclEvent | bool | None:
    """An NcclEvent for a meaningful line, None for an ordinary or unrelated one, and False
    for a line that looks like NCCL/watchdog output but cannot be read (malformed)."""
    if _WATCHDOG in line:
        op, seq, ran = _OPTYPE.search(line), _SEQ.search(line), _RAN_FOR.search(line)
        rank = _TORCH_RANK.search(line)
        if op is None:
            return False
        return NcclEvent(
            "collective_timeout",
            rank=rank.group("rank") if rank else "",
            op=op.group("op"),
            seq=int(seq.group("seq")) if seq else None,
            ran_for_s=int(ran.group("ms")) / 1000 if ran else None,
            message=line.strip(),
        )
    match = _NCCL.match(line.strip())
    if match is None:
        return False if _NCCL_ANY.search(line) else None
    level, msg, host = match.group("level"), match.group("msg"), match.group("host")
    if level == "INFO" and msg.endswith("Init COMPLETE"):
        comm = _COMM.search(msg)
        return NcclEvent(
            "init_complete", host=host, rank=comm.group("rank") if comm else "", message=msg
        )
    if level == "WARN":
        kind = "collective_timeout" if "timeout" in msg.lower() else "warn"
        return NcclEvent(kind, host=host, message=msg)
    if level in ("ERROR", "ABORT"):
        return NcclEvent("error", host=host, message=msg)
    return None


@dataclass
class NcclLogStats:
    """Counts from the lines fed so far, plus the last few events for `tyard describe`."""

    init_complete: int = 0
    warnings: int = 0
    errors: int = 0
    malformed: int = 0
    timeouts: dict[tuple[str, str], int] = field(default_factory=dict)  # (rank, op) -> n
    recent: list[NcclEvent] = field(default_factory=list)
    keep: int = 20

    def feed(self, line: str) -> NcclEvent | None:
        event = parse_line(line)
        if event is False:
            self.malformed += 1
            return None
        if not isinstance(event, NcclEvent):
            return None
        if event.kind == "init_complete":
            self.init_complete += 1
        elif event.kind == "warn":
            self.warnings += 1
        elif event.kind == "error":
            self.errors += 1
        else:
            key = (event.rank, event.op or "unknown")
            self.timeouts[key] = self.timeouts.get(key, 0) + 1
            self.warnings += event.host != ""  # an NCCL WARN line that reports a timeout
        if event.kind != "init_complete":
            self.recent = [*self.recent, event][-self.keep :]
        return event


@dataclass
class InspectorStats:
    """NCCL Inspector records of one (job, team, communicator rank, collective)."""

    collectives: int = 0
    bytes: int = 0
    exec_s: float = 0.0
    last_busbw_gbps: float = 0.0


@dataclass(frozen=True)
class NcclLogSource:
    """Where a job's NCCL/stderr logs lie on this node."""

    directory: Path
    job: str
    team: str


class NcclLogCollector:
    """Tails every *.log file in each source directory (from where it stopped last scrape)."""

    NAME = "nccl"

    def __init__(
        self,
        sources: Callable[[], Iterable[NcclLogSource]],
        *,
        errors: CollectorErrors | None = None,
    ) -> None:
        self.sources = sources
        self.errors = errors if errors is not None else CollectorErrors()
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self._stats: dict[tuple[str, str, str], NcclLogStats] = {}  # job, team, host
        self._inspector: dict[tuple[str, str, str, str], InspectorStats] = {}
        self._inspector_partial: dict[Path, str] = {}

    def collect(self) -> Iterable[Metric]:
        for source in self.sources():
            self._read_source(source)
            self._read_inspector(source)
        yield from self._inspector_families()
        names = (
            "tyard_nccl_init_complete_total",
            "tyard_nccl_warnings_total",
            "tyard_nccl_malformed_lines_total",
            "tyard_nccl_collective_timeouts_total",
        )
        init, warn, bad, timeouts = (family(m.by_name(n)) for n in names)
        for key, stats in sorted(self._stats.items()):
            init.add_metric(list(key), stats.init_complete)
            warn.add_metric(list(key), stats.warnings)
            bad.add_metric(list(key), stats.malformed)
            for (rank, op), n in sorted(stats.timeouts.items()):
                timeouts.add_metric([*key, rank, op], n)
        yield from (init, warn, bad, timeouts)

    def _read_source(self, source: NcclLogSource) -> None:
        try:
            files = sorted(p for p in source.directory.iterdir() if p.suffix == ".log")
        except FileNotFoundError:
            return  # the job has not written any yet
        except OSError as exc:
            self.errors.record(self.NAME, str(source.directory), exc)
            return
        for path in files:
            host = _host_of(path.stem)
            stats = self._stats.setdefault((source.job, source.team, host), NcclLogStats())
            for line in self._new_lines(path):
                stats.feed(line)

    def _read_inspector(self, source: NcclLogSource) -> None:
        """NCCL Inspector's JSON records (one object per collective per communicator, written
        as the plugin's dump thread goes) under `<dir>/inspector`, from where the last scrape
        stopped."""
        root = source.directory / "inspector"
        try:
            files = sorted(p for p in root.rglob("*") if p.is_file())
        except FileNotFoundError:
            return  # the job does not use the plugin
        except OSError as exc:
            self.errors.record(self.NAME, str(root), exc)
            return
        decoder = json.JSONDecoder()
        for path in files:
            chunk = self._read_new(path)
            if chunk is None:
                continue
            text = self._inspector_partial.get(path, "") + chunk
            pos = 0
            while True:
                while pos < len(text) and text[pos] in " \t\r\n":
                    pos += 1
                if pos >= len(text):
                    text = ""
                    break
                try:
                    record, end = decoder.raw_decode(text, pos)
                except json.JSONDecodeError:
                    if "\n{" in text[pos + 1 :] or len(text) - pos > 1 << 20:
                        # a broken record with more after it: skip to the next object
                        skip = text.find("\n{", pos + 1)
                        self.errors.record(
                            self.NAME,
                            f"malformed NCCL Inspector record in {path}",
                            repr(text[pos : pos + 80]),
                        )
                        if skip < 0:
                            text = ""
                            break
                        pos = skip + 1
                        continue
                    text = text[pos:]  # incomplete: the rest comes with the next scrape
                    break
                pos = end
                self._feed_inspector(source, record, path)
            self._inspector_partial[path] = text

    def _feed_inspector(self, source: NcclLogSource, record: object, path: Path) -> None:
        try:
            assert isinstance(record, dict)
            perf, header = record["coll_perf"], record["header"]
            key = (source.job, source.team, str(int(header["rank"])), str(perf["coll"]))
            size, exec_us = int(perf["coll_msg_size_bytes"]), float(perf["coll_exec_time_us"])
            busbw = float(perf["coll_busbw_gbs"])
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            self.errors.record(self.NAME, f"unexpected NCCL Inspector record in {path}", exc)
            return
        stats = self._inspector.setdefault(key, InspectorStats())
        stats.collectives += 1
        stats.bytes += size
        stats.exec_s += exec_us / 1e6
        stats.last_busbw_gbps = busbw

    def _inspector_families(self) -> Iterable[Metric]:
        names = (
            "tyard_nccl_inspector_collectives_total",
            "tyard_nccl_inspector_bytes_total",
            "tyard_nccl_inspector_exec_seconds_total",
            "tyard_nccl_inspector_bus_bandwidth_gbps",
        )
        count, size, seconds, busbw = (family(m.by_name(n)) for n in names)
        for key, stats in sorted(self._inspector.items()):
            count.add_metric(list(key), stats.collectives)
            size.add_metric(list(key), stats.bytes)
            seconds.add_metric(list(key), stats.exec_s)
            busbw.add_metric(list(key), stats.last_busbw_gbps)
        return (count, size, seconds, busbw)

    def _read_new(self, path: Path) -> str | None:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                offset = self._offsets.get(path, 0)
                if size < offset:  # truncated or replaced: start over
                    offset, self._inspector_partial[path] = 0, ""
                f.seek(offset)
                data = f.read(8 << 20)
                self._offsets[path] = offset + len(data)
        except OSError as exc:
            self.errors.record(self.NAME, str(path), exc)
            return None
        return data.decode("utf-8", errors="replace")

    def _new_lines(self, path: Path) -> list[str]:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                offset = self._offsets.get(path, 0)
                if size < offset:  # truncated or replaced: start over
                    offset, self._partial[path] = 0, ""
                f.seek(offset)
                data = f.read(8 << 20)  # at most 8 MiB a scrape; the rest next time
                self._offsets[path] = offset + len(data)
        except OSError as exc:
            self.errors.record(self.NAME, str(path), exc)
            return []
        text = self._partial.get(path, "") + data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._partial[path] = lines.pop()
        return lines


def _host_of(stem: str) -> str:
    """'nccl-gpu-node-07-4242' -> 'gpu-node-07' (NCCL_DEBUG_FILE's %h-%p; hosts may hold '-')."""
    if not stem.startswith("nccl-") or "-" not in stem[5:]:
        return ""
    return stem[5:].rsplit("-", 1)[0]


def nccl_debug_env(run_dir: str | Path, *, trace_buffer_size: int = 2000) -> Mapping[str, str]:
    """Env vars for a job so that each rank writes its NCCL debug log, and PyTorch's NCCL flight
    recorder dumps its last `trace_buffer_size` collectives on a watchdog timeout, into
    `run_dir` (the NCCL logs into `run_dir`/nccl, named nccl-<host>-<pid>.log).

    Pure: the launcher creates `run_dir`/nccl (NCCL does not create directories)."""
    run = Path(run_dir)
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_FILE": str(run / "nccl" / "nccl-%h-%p.log"),
        # PyTorch 2.13's names; the older TORCH_NCCL_TRACE_BUFFER_SIZE and
        # TORCH_NCCL_DEBUG_INFO_TEMP_FILE still work there but print a deprecation warning in
        # every rank's log (set them in spec.env for an older PyTorch).
        "TORCH_FR_BUFFER_SIZE": str(trace_buffer_size),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        # PyTorch appends the rank: <run>/nccl/flight_recorder_rank_<r>
        "TORCH_FR_DUMP_TEMP_FILE": str(run / "nccl" / "flight_recorder_rank_"),
        # read by the NCCL Inspector profiler plugin only, when a job loads it
        # (NCCL_PROFILER_PLUGIN=.../libnccl-profiler-inspector.so, NCCL_INSPECTOR_ENABLE=1)
        "NCCL_INSPECTOR_DUMP_DIR": str(run / "nccl" / "inspector"),
    }
