"""Scrape a collector into {(name, frozenset(labels)): value} through a fresh registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tensoryard.observability import metrics as m
from tensoryard.observability.base import Collector
from tensoryard.observability.registry import render

_EXACT_COUNTERS = {d.name for d in m.ALL if d.type == "counter" and not d.name.endswith("_total")}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(*collectors: Collector) -> Samples:
    registry = CollectorRegistry()
    for c in collectors:
        registry.register(c)  # type: ignore[arg-type]
    text = render(registry).decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            # the client's parser appends _total to DCGM counters' exact names; undo that
            name = s.name[:-6] if s.name[:-6] in _EXACT_COUNTERS else s.name
            out[(name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`."""
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


def names(samples: Samples) -> set[str]:
    return {n for n, _ in samples}
