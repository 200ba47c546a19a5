"""What every node collector shares: the Collector protocol and the error counter.

A collector never raises out of ``collect()``: a missing root, an unreadable or malformed file,
or a device that disappears mid-scrape is counted in ``tyard_collector_errors_total{collector}``
and logged, and the scrape still answers with whatever could be read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from tensoryard.observability import metrics as m

__all__ = ["Collector", "CollectorErrors", "Family", "family", "read_int", "read_text"]


class ExactCounter(Metric):
    """A counter exposed under exactly its name. DCGM's counters (``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``,
    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``) do not end in ``_total``, and CounterMetricFamily
    would append one."""

    def __init__(self, name: str, documentation: str, labels: list[str]) -> None:
        super().__init__(name, documentation, "counter")
        self._labelnames = labels

    def add_metric(self, labels: list[str], value: float) -> None:
        self.add_sample(self.name, dict(zip(self._labelnames, labels, strict=True)), value)


Family = CounterMetricFamily | GaugeMetricFamily | ExactCounter

log = logging.getLogger("tensoryard.observability")


class Collector(Protocol):
    """What a prometheus_client CollectorRegistry calls on each scrape."""

    def collect(self) -> Iterable[Metric]: ...


class CollectorErrors:
    """Counts collection errors per collector; itself a Collector of the counter."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def declare(self, *collectors: str) -> None:
        """Export these collectors' counters at 0 before their first error (so that
        increase() sees the first one)."""
        with self._lock:
            for name in collectors:
                self._counts.setdefault(name, 0)

    def record(self, collector: str, what: str, exc: BaseException | str) -> None:
        """Count one error of `collector` and log what failed and why."""
        with self._lock:
            self._counts[collector] = self._counts.get(collector, 0) + 1
        log.warning("collector %s: %s: %s", collector, what, exc)

    def count(self, collector: str) -> int:
        with self._lock:
            return self._counts.get(collector, 0)

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            m.COLLECTOR_ERRORS.name.removesuffix("_total"),
            m.COLLECTOR_ERRORS.help,
            labels=["collector"],
        )
        with self._lock:
            for name, value in sorted(self._counts.items()):
                family.add_metric([name], value)
        yield family


def read_text(path: Path) -> str:
    """A sysfs/procfs file's content, stripped (OSError and UnicodeError propagate)."""
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def read_int(path: Path) -> int:
    return int(read_text(path))


def family(definition: m.MetricDef, labels: tuple[str, ...] | None = None) -> Family:
    """An empty metric family for `definition` (counters are named without ``_total`` here:
    prometheus_client appends it)."""
    names = list(definition.labels if labels is None else labels)
    if definition.type == "counter" and not definition.name.endswith("_total"):
        return ExactCounter(definition.name, definition.help, names)
    if definition.type == "counter":
        return CounterMetricFamily(
            definition.name.removesuffix("_total"), definition.help, labels=names
        )
    return GaugeMetricFamily(definition.name, definition.help, labels=names)
