"""The GPU engines' own Prometheus metrics, read into one contract across engines and versions.

The gateway measures latency itself, but only the engine knows its KV-cache use, prefix-cache
hits and queue, and engines rename those metrics between versions. ``METRIC_NAMES`` says which
family carries each contract name in each version range; ``map_engine_metrics`` reads a
``/metrics`` text with it and ``missing_metrics`` says what a text lacks, so a rename shows up as
a named gap instead of a silent zero on a dashboard.

Contract (all lifetime values of one scrape; rates need two scrapes):

* ``ttft_seconds``, ``itl_seconds``, ``e2e_seconds``, ``queue_seconds``: histogram means
  (``_sum / _count`` over every label set); absent while a histogram has no observations.
* ``running_requests``, ``waiting_requests``: gauges summed over label sets (data-parallel
  engines each report their own).
* ``kv_usage_ratio``: KV-cache use, 0..1, averaged over label sets (a sum of fractions is not a
  fraction). ``prefix_hit_ratio``: prefix-cache hit ratio, from a ratio gauge (averaged) or from
  hit and query counters (sum of hits / sum of queries).

Sources, per range (also written at the top of each test fixture):

* vLLM, V1 engine (the default since 0.8.0, release notes; V0 is gone in 0.11.0), metric
  definitions in ``vllm/v1/metrics/loggers.py``: at commit a6f0308c (0.8 line) only
  ``vllm:gpu_cache_usage_perc``, ``vllm:gpu_prefix_cache_{queries,hits}`` and
  ``vllm:time_per_output_token_seconds``; PR #18354 ("Deprecated in 0.9.2") added
  ``vllm:kv_cache_usage_perc`` and ``vllm:prefix_cache_{queries,hits}`` next to them (a 0.10.0
  ``/metrics`` shows both, vllm-project/production-stack issue #617); the 0.11 line adds
  ``vllm:inter_token_latency_seconds`` ("Deprecated in 0.11 - Renamed as ...") and hides the
  gpu_* names (``--show-hidden-metrics-for-version=0.10``). The range edges sit where both the
  old and the new name are emitted, so the table is right on either side of them.
* SGLang: ``python/sglang/srt/metrics/collector.py`` of the 0.5 line and of a later main:
  ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``,
  ``sglang:cache_hit_rate``, ``sglang:queue_time_seconds``, ``sglang:time_to_first_token_seconds``,
  ``sglang:inter_token_latency_seconds`` (replaced ``time_per_output_token_seconds``, sglang PRs
  #3988 and #4914; the docs page production_metrics.md still shows the old name, PR #28640),
  ``sglang:e2e_request_latency_seconds``. Needs ``--enable-metrics``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "CONTRACT",
    "METRIC_NAMES",
    "EngineMetricNames",
    "map_engine_metrics",
    "missing_metrics",
    "names_for",
]

CONTRACT: tuple[str, ...] = (
    "ttft_seconds",
    "itl_seconds",
    "e2e_seconds",
    "queue_seconds",
    "running_requests",
    "waiting_requests",
    "kv_usage_ratio",
    "prefix_hit_ratio",
)
_HISTOGRAMS = frozenset({"ttft_seconds", "itl_seconds", "e2e_seconds", "queue_seconds"})
_RATIOS = frozenset({"kv_usage_ratio", "prefix_hit_ratio"})
_OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "<": operator.lt, ">": operator.gt,
}  # fmt: skip


@dataclass(frozen=True)
class EngineMetricNames:
    """Which metric family carries each contract name, for one engine and version range.

    ``names``: contract name -> family name as declared by the engine (counters without
    ``_total``). ``prefix_hit_counters``: (hits, queries) counter families, for engines that
    count prefix-cache lookups instead of exporting a ratio; then ``names`` has no
    ``prefix_hit_ratio``."""

    engine: str
    versions: str
    names: dict[str, str]
    prefix_hit_counters: tuple[str, str] | None = None

    def families(self, contract_name: str) -> tuple[str, ...]:
        if contract_name == "prefix_hit_ratio" and self.prefix_hit_counters:
            return self.prefix_hit_counters
        return (self.names[contract_name],)


def _vllm(versions: str, kv: str, itl: str, prefix: str) -> EngineMetricNames:
    names = {
        "ttft_seconds": "vllm:time_to_first_token_seconds",
        "itl_seconds": itl,
        "e2e_seconds": "vllm:e2e_request_latency_seconds",
        "queue_seconds": "vllm:request_queue_time_seconds",
        "running_requests": "vllm:num_requests_running",
        "waiting_requests": "vllm:num_requests_waiting",
        "kv_usage_ratio": kv,
    }
    return EngineMetricNames("vllm", versions, names, (f"{prefix}_hits", f"{prefix}_queries"))


METRIC_NAMES: list[EngineMetricNames] = [
    _vllm(">=0.8,<0.10", "vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds",
          "vllm:gpu_prefix_cache"),
    _vllm(">=0.10,<0.11", "vllm:kv_cache_usage_perc", "vllm:time_per_output_token_seconds",
          "vllm:prefix_cache"),
    _vllm(">=0.11", "vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds",
          "vllm:prefix_cache"),
    EngineMetricNames("sglang", ">=0.5", {
        "ttft_seconds": "sglang:time_to_first_token_seconds",
        "itl_seconds": "sglang:inter_token_latency_seconds",
        "e2e_seconds": "sglang:e2e_request_latency_seconds",
        "queue_seconds": "sglang:queue_time_seconds",
        "running_requests": "sglang:num_running_reqs",
        "waiting_requests": "sglang:num_queue_reqs",
        "kv_usage_ratio": "sglang:token_usage",
        "prefix_hit_ratio": "sglang:cache_hit_rate",
    }),
]  # fmt: skip


def names_for(engine: str, version: str) -> EngineMetricNames:
    """The table entry for ``engine`` at ``version`` (e.g. "0.11.0", "v0.5.3.post1")."""
    release = _release(version)
    ranges = [entry for entry in METRIC_NAMES if entry.engine == engine]
    if not ranges:
        known = ", ".join(sorted({entry.engine for entry in METRIC_NAMES}))
        raise ValueError(f"no metric names for engine {engine!r}; known engines: {known}")
    for entry in ranges:
        if _in_range(release, entry.versions):
            return entry
    known = "; ".join(entry.versions for entry in ranges)
    raise ValueError(
        f"no metric names for {engine} {version}; known {engine} ranges: {known} "
        "(add a range to METRIC_NAMES with the names that version exports)"
    )


def map_engine_metrics(text: str, engine: str, version: str) -> dict[str, float]:
    """Contract name -> value, for each contract metric present in ``text``."""
    table, families = names_for(engine, version), _families(text)
    values: dict[str, float] = {}
    for name in CONTRACT:
        found = [families.get(family) for family in table.families(name)]
        if any(samples is None for samples in found):
            continue
        value = _value(name, [samples for samples in found if samples is not None])
        if value is not None:
            values[name] = value
    return values


def missing_metrics(text: str, engine: str, version: str) -> list[str]:
    """Contract names whose families are absent: "kv_usage_ratio (vllm:kv_cache_usage_perc)"."""
    table, families = names_for(engine, version), _families(text)
    missing = []
    for name in CONTRACT:
        absent = [family for family in table.families(name) if family not in families]
        if absent:
            missing.append(f"{name} ({', '.join(absent)})")
    return missing


# A sample is (sample name, value); a family is the list of its samples over all label sets.
_Samples = list[tuple[str, float]]


def _families(text: str) -> dict[str, _Samples]:
    try:
        parsed = list(text_string_to_metric_families(text))
    except ValueError as exc:  # the parser's error for malformed exposition text
        raise ValueError(f"not Prometheus text exposition: {exc}") from exc
    families: dict[str, _Samples] = {}
    for family in parsed:
        samples = [(s.name, float(s.value)) for s in family.samples]
        families.setdefault(family.name, []).extend(samples)
        if family.type == "unknown" and family.name.endswith("_total"):  # untyped counter
            families.setdefault(family.name.removesuffix("_total"), []).extend(samples)
    return families


def _value(name: str, found: list[_Samples]) -> float | None:
    if name in _HISTOGRAMS:
        total = sum(v for sample, v in found[0] if sample.endswith("_sum"))
        count = sum(v for sample, v in found[0] if sample.endswith("_count"))
        return total / count if count else None
    if len(found) == 2:  # prefix-cache hits and queries counters
        hits, queries = (
            sum(v for sample, v in s if not sample.endswith("_created")) for s in found
        )
        return hits / queries if queries else None
    values = [v for _, v in found[0]]
    if name in _RATIOS:
        return sum(values) / len(values) if values else None
    return sum(values)


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version ("v0.10.1.1rc2+cu128" -> (0, 10, 1, 1)).

    Pre-, post- and local parts are ignored: an rc of 0.11 exports 0.11's names."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if not match:
        raise ValueError(f"{version!r} is not a version number; give one like 0.11.0")
    return tuple(int(part) for part in match.group(1).split("."))


def _in_range(release: tuple[int, ...], spec: str) -> bool:
    """Whether ``release`` satisfies every clause of ``spec`` (">=0.10,<0.11")."""
    for clause in spec.split(","):
        match = re.fullmatch(r"\s*(>=|<=|==|<|>)\s*([\d.]+)\s*", clause)
        if not match:
            raise ValueError(f"bad version range {spec!r}")
        bound = tuple(int(part) for part in match.group(2).split("."))
        width = max(len(release), len(bound))
        if not _OPS[match.group(1)](_pad(release, width), _pad(bound, width)):
            return False
    return True


def _pad(parts: tuple[int, ...], width: int) -> tuple[int, ...]:
    return parts + (0,) * (width - len(parts))
