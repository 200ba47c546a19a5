"""The Deployments page's gateway numbers: counts read from the gateway's own metrics (a fresh
registry), TTFT quantiles from its histogram, and rates over the readings of the last minute."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tensoryard.serving.gateway_stats import GatewayStats, bucket_quantile
from tensoryard.serving.metrics import ServingMetrics


def serve(
    metrics: ServingMetrics, deployment: str, n: int, ttft_s: float, code: str = "200"
) -> None:
    for _ in range(n):
        metrics.requests.labels(deployment, code).inc()
        metrics.ttft.labels(deployment).observe(ttft_s)
        metrics.tokens.labels(deployment, "nlp", "mo", "completion").inc(10)
        metrics.tokens.labels(deployment, "nlp", "mo", "prompt").inc(99)


@pytest.mark.parametrize(
    ("q", "buckets", "want"),
    [
        pytest.param(0.5, [(0.1, 0), (0.2, 10), (float("inf"), 10)], 0.15, id="inside a bucket"),
        pytest.param(0.5, [(0.1, 4), (float("inf"), 10)], 0.1, id="in +Inf: the top bound"),
        pytest.param(0.9, [(0.1, 10), (float("inf"), 10)], 0.09, id="the lowest from zero"),
        pytest.param(0.5, [(0.1, 0), (float("inf"), 0)], None, id="nothing observed"),
        pytest.param(0.5, [], None, id="no buckets"),
    ],
)
def test_a_quantile_is_interpolated_in_its_bucket_like_histogram_quantile(
    q: float, buckets: list[tuple[float, float]], want: float | None
) -> None:
    got = bucket_quantile(q, buckets)
    assert got == (None if want is None else pytest.approx(want))


def test_counts_since_start_and_rates_over_the_last_minute_of_readings() -> None:
    metrics = ServingMetrics(CollectorRegistry())
    now = [100.0]
    stats = GatewayStats(metrics, window_s=60.0, clock=lambda: now[0])
    serve(metrics, "echo", 8, 0.03)
    serve(metrics, "echo", 2, 0.03, code="503")
    serve(metrics, "other", 50, 4.0)
    first = stats.read("echo")
    assert (first.requests, first.errors, first.completion_tokens) == (10, 2, 100)
    assert first.ttft_p50_s == pytest.approx(0.03, abs=0.01) and first.window is None
    now[0] += 10.0
    serve(metrics, "echo", 20, 0.3)  # slower now: the window shows it, since-start less so
    later = stats.read("echo")
    assert later.requests == 30 and later.window is not None
    assert later.window.seconds == 10.0 and later.window.requests_per_s == pytest.approx(2.0)
    assert later.window.error_share == 0.0
    assert later.window.completion_tokens_per_s == pytest.approx(20.0)
    assert 0.25 <= (later.window.ttft_p50_s or 0) <= 0.5
    # a minute on, the first reading has left the window: rates from the second one on
    now[0] += 60.0
    last = stats.read("echo")
    assert last.window is not None and last.window.seconds == 60.0
    assert last.window.requests == 0 and last.window.ttft_p50_s is None
    assert stats.read("nobody").requests == 0
