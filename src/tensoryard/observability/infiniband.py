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
from tensoryard.observability.base import CollectorErrors, Family, family, read_int, read_text

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

    def __init__(self, sys: str | Path = "/sys", *, errors: CollectorErrors | None = None) -> None:
        self.root = Path(sys) / "class" / "infiniband"
        self.errors = errors if errors is not None else CollectorErrors()
        self._defs = {d.name: d for d in m.IB}

    def collect(self) -> Iterable[Metric]:
        fams = {name: family(d) for name, d in self._defs.items()}
        hw = family(m.IB_HW_COUNTER)
        for hca in self._list(self.root):
            self._device(hca, fams)
            for port in self._list(self.root / hca / "ports"):
                self._port(hca, port, fams, hw)
        yield from fams.values()
        yield hw

    def _list(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            if path != self.root:  # no /sys/class/infiniband is an ordinary non-IB node
                self.errors.record(NAME, f"list {path}", "disappeared")
            return []
        except OSError as exc:
            self.errors.record(NAME, f"list {path}", exc)
            return []

    def _device(self, hca: str, fams: dict[str, Family]) -> None:
        info = []
        for attr in ("board_id", "fw_ver", "hca_type"):
            try:
                info.append(read_text(self.root / hca / attr))
            except (OSError, UnicodeError) as exc:
                self.errors.record(NAME, f"{hca}/{attr}", exc)
                info.append("")
        fams["node_infiniband_info"].add_metric([info[0], hca, info[1], info[2]], 1)

    def _port(self, hca: str, port: str, fams: dict[str, Family], hw: Family) -> None:
        base = self.root / hca / "ports" / port
        labels = [hca, port]
        for metric, attr, parse in (
            ("node_infiniband_state_id", "state", _state_id),
            ("node_infiniband_physical_state_id", "phys_state", _state_id),
            ("node_infiniband_rate_bytes_per_second", "rate", parse_rate),
        ):
            try:
                fams[metric].add_metric(labels, parse(read_text(base / attr)))
            except (OSError, UnicodeError, ValueError) as exc:
                self.errors.record(NAME, f"{hca}/ports/{port}/{attr}", exc)
        for suffix, counter, mult in m.IB_COUNTER_FILES:
            value = self._counter(base / "counters" / counter)
            if value is not None:
                fams[f"node_infiniband_{suffix}"].add_metric(labels, value * mult)
        for counter in self._list(base / "hw_counters") if (base / "hw_counters").is_dir() else []:
            value = self._counter(base / "hw_counters" / counter)
            if value is not None:
                hw.add_metric([hca, port, counter], value)

    def _counter(self, path: Path) -> int | None:
        try:
            return read_int(path)
        except FileNotFoundError:
            return None  # drivers differ in which counters they offer (node_exporter skips too)
        except (OSError, UnicodeError, ValueError) as exc:
            self.errors.record(NAME, str(path.relative_to(self.root)), exc)
            return None
