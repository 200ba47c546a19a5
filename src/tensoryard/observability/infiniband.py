"""InfiniBand port counters from sysfs, under node_exporter's names (see metrics.IB).

Reads ``<sys>/class/infiniband/<hca>/ports/<n>/{state,phys_state,rate,counters/*,hw_counters/*}``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.metrics_core import Metric

from tensoryard.observability import metrics as m
from tensoryard.observability.base import CollectorErrors, Family, family

__all__ = ["InfinibandCollector", "parse_rate"]

NAME = "infiniband"
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def parse_rate(text: str) -> float:
    """'400 Gb/sec (4X NDR)' -> bytes per second (5e10); ValueError when unreadable."""
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"unreadable rate {text!r}")
    return float(match.group(1)) * 1e9 / 8


def _state_id(text: str) -> int:
    """'4: ACTIVE' -> 4."""
    return int(text.split(":", 1)[0])


class InfinibandCollector:
    """One scrape reads every port of every HCA below `sys`/class/infiniband."""

    def __init__(
        self,
        sys: str | Path = "/sys",
        *,
        hw_counters: bool = True,
        errors: CollectorErrors | None = None,
    ) -> None:
        self.root = Path(sys) / "class" / "infiniband"
        self.hw_counters = hw_counters  # the driver's RDMA counters; node_exporter 1.5 skips them
        self.errors = errors if errors is not None else CollectorErrors()
        self._defs = {d.name: d for d in m.IB}
        self._info: dict[str, list[str]] = {}

    def collect(self) -> Iterable[Metric]:
        fams = {name: family(d) for name, d in self._defs.items()}
        hw = family(m.IB_HW_COUNTER)
        for hca in self._list(str(self.root)):
            self._device(hca, fams)
            for port in self._list(f"{self.root}/{hca}/ports"):
                self._port(hca, port, fams, hw)
        yield from fams.values()
        yield hw

    def _list(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            if path != str(self.root):  # no /sys/class/infiniband is an ordinary non-IB node
                self.errors.record(NAME, f"list {path}", "disappeared")
            return []
        except OSError as exc:
            self.errors.record(NAME, f"list {path}", exc)
            return []

    def _device(self, hca: str, fams: dict[str, Family]) -> None:
        info = self._info.get(hca)
        if info is None:  # board, firmware and type do not change while the HCA is there
            info = []
            for attr in ("board_id", "fw_ver", "hca_type"):
                try:
                    info.append(_read(f"{self.root}/{hca}/{attr}").decode("ascii"))
                except (OSError, UnicodeError) as exc:
                    self.errors.record(NAME, f"{hca}/{attr}", exc)
                    info.append("")
            if all(info):
                self._info[hca] = info
        fams["node_infiniband_info"].add_metric([info[0], hca, info[1], info[2]], 1)

    def _port(self, hca: str, port: str, fams: dict[str, Family], hw: Family) -> None:
        base = f"{self.root}/{hca}/ports/{port}/"
        labels = [hca, port]
        for metric, attr, parse in (
            ("node_infiniband_state_id", "state", _state_id),
            ("node_infiniband_physical_state_id", "phys_state", _state_id),
            ("node_infiniband_rate_bytes_per_second", "rate", parse_rate),
        ):
            try:
                fams[metric].add_metric(labels, parse(_read(base + attr).decode("ascii")))
            except (OSError, UnicodeError, ValueError) as exc:
                self.errors.record(NAME, f"{hca}/ports/{port}/{attr}", exc)
        counters = base + "counters/"
        for suffix, counter, mult in m.IB_COUNTER_FILES:
            value = self._counter(counters + counter)
            if value is not None:
                fams[f"node_infiniband_{suffix}"].add_metric(labels, value * mult)
        hw_dir = base + "hw_counters"
        if self.hw_counters and os.path.isdir(hw_dir):
            for counter in self._list(hw_dir):
                value = self._counter(f"{hw_dir}/{counter}")
                if value is not None:
                    hw.add_metric([hca, port, counter], value)

    def _counter(self, path: str) -> int | None:
        try:
            return int(_read(path))
        except FileNotFoundError:
            return None  # drivers differ in which counters they offer (node_exporter skips too)
        except (OSError, ValueError) as exc:
            self.errors.record(NAME, path.removeprefix(f"{self.root}/"), exc)
            return None


def _read(path: str) -> bytes:
    """A sysfs attribute in one read (a few microseconds, several times faster than open())."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096).strip()
    finally:
        os.close(fd)
