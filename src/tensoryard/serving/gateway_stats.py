"""The gateway's request rate, TTFT and tokens/s per deployment, for the console's Deployments
page (`GET /api/v1/deployments/{name}/gateway`), read from the gateway's own metrics
(:class:`~tensoryard.serving.metrics.ServingMetrics`) in this control plane process.

Counters only say "since start"; rates need two readings. `GatewayStats` keeps the readings
each call makes (at most one a second per deployment) for `window_s`, and answers the rates
between the oldest kept one and now: a page that reads every 5 s sees the last minute.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from tensoryard.serving.metrics import ServingMetrics

__all__ = ["GatewayCounts", "GatewayOut", "GatewayStats", "bucket_quantile", "gateway_counts"]


@dataclass(frozen=True)
class GatewayCounts:
    """Cumulative numbers of one deployment at `ts` (seconds, the stats' clock)."""

    ts: float
    requests: float
    errors: float  # answers with a status other than 2xx
    ttft_buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count)
    completion_tokens: float


class WindowOut(BaseModel):
    seconds: float
    requests: float
    requests_per_s: float
    error_share: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    completion_tokens_per_s: float


class GatewayOut(BaseModel):
    deployment: str
    requests: float
    """Since this control plane started."""
    errors: float
    completion_tokens: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    window: WindowOut | None
    """The last `window_s` (or since the first reading); null on the first reading."""


def gateway_counts(metrics: ServingMetrics, deployment: str, ts: float) -> GatewayCounts:
    requests = errors = tokens = 0.0
    buckets: dict[float, float] = {}
    for family in metrics.requests.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.labels.get("deployment") == deployment:
                requests += s.value
                if not s.labels.get("code", "").startswith("2"):
                    errors += s.value
    for family in metrics.ttft.collect():
        for s in family.samples:
            if s.name.endswith("_bucket") and s.labels.get("deployment") == deployment:
                buckets[float(s.labels["le"])] = s.value
    for family in metrics.tokens.collect():
        for s in family.samples:
            labels = s.labels
            if (
                s.name.endswith("_total")
                and labels.get("deployment") == deployment
                and labels.get("kind") == "completion"
            ):
                tokens += s.value
    return GatewayCounts(ts, requests, errors, tuple(sorted(buckets.items())), tokens)


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated inside its bucket as
    Prometheus's histogram_quantile does (the lowest bucket from 0; a quantile in the +Inf
    bucket is the highest finite bound); None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    low_bound, low_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return low_bound
            if count == low_count:
                return bound
            return low_bound + (bound - low_bound) * (rank - low_count) / (count - low_count)
        low_bound, low_count = bound, count
    return low_bound


def _minus(
    new: tuple[tuple[float, float], ...], old: tuple[tuple[float, float], ...]
) -> tuple[tuple[float, float], ...]:
    before = dict(old)
    return tuple((bound, count - before.get(bound, 0.0)) for bound, count in new)


class GatewayStats:
    """Readings per deployment, kept for `window_s`; one answer per call."""

    def __init__(
        self,
        metrics: ServingMetrics,
        *,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[str, deque[GatewayCounts]] = {}

    def read(self, deployment: str) -> GatewayOut:
        now = gateway_counts(self.metrics, deployment, self.clock())
        kept = self._seen.setdefault(deployment, deque())
        while len(kept) > 1 and now.ts - kept[1].ts >= self.window_s:
            kept.popleft()  # the oldest that still spans the window stays
        old = kept[0] if kept else None
        if not kept or now.ts - kept[-1].ts >= 1.0:
            kept.append(now)
        return GatewayOut(
            deployment=deployment,
            requests=now.requests,
            errors=now.errors,
            completion_tokens=now.completion_tokens,
            ttft_p50_s=bucket_quantile(0.5, now.ttft_buckets),
            ttft_p90_s=bucket_quantile(0.9, now.ttft_buckets),
            window=None if old is None or now.ts <= old.ts else _window(old, now),
        )


def _window(old: GatewayCounts, new: GatewayCounts) -> WindowOut:
    seconds = new.ts - old.ts
    requests = new.requests - old.requests
    buckets = _minus(new.ttft_buckets, old.ttft_buckets)
    return WindowOut(
        seconds=round(seconds, 3),
        requests=requests,
        requests_per_s=requests / seconds,
        error_share=(new.errors - old.errors) / requests if requests > 0 else None,
        ttft_p50_s=bucket_quantile(0.5, buckets),
        ttft_p90_s=bucket_quantile(0.9, buckets),
        completion_tokens_per_s=(new.completion_tokens - old.completion_tokens) / seconds,
    )
