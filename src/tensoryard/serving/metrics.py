"""Serving metrics under one contract, measured at the gateway for every engine.

The gateway times requests itself (it sees every byte of every stream), so dashboards keep
working when an engine renames its own metrics. Names (all labelled by ``deployment``):

- ``tyard_serving_ttft_seconds`` (histogram): request received -> first token sent.
- ``tyard_serving_itl_seconds`` (histogram): time between streamed tokens.
- ``tyard_serving_e2e_seconds`` (histogram): request received -> last byte sent.
- ``tyard_serving_queue_seconds`` (histogram): waiting for a ready replica (scale from zero,
  all replicas starting).
- ``tyard_serving_gateway_overhead_seconds`` (histogram): the gateway's own part of a request
  (parsing, authentication, routing, relaying), that is its time less the time the upstream
  engine took (request sent -> response read; for a stream, up to the response's headers).
  Waiting for a ready replica is ``queue_seconds``, not overhead.
- ``tyard_serving_running_requests`` / ``tyard_serving_waiting_requests`` (gauges).
- ``tyard_serving_prefix_hit_ratio`` (gauge): routed prompt characters the chosen replica had
  seen before / all prompt characters, since start.
- ``tyard_serving_requests_total{code}`` and ``tyard_serving_tokens_total{team,user,kind}`` with
  kind ``prompt`` or ``completion`` (usage accounting in tokens).
- ``tyard_serving_replica_restarts_total`` (counter).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ServingMetrics"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
# fine below 10 ms: the goal for the gateway's own latency is a p99 under 10 ms
_OVERHEAD = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1)


class ServingMetrics:
    """The gateway's metrics, registered on ``registry`` (a fresh one in tests)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        d = ["deployment"]
        self.ttft = Histogram(
            "tyard_serving_ttft_seconds",
            "Time to first token.",
            d,
            buckets=_LATENCY,
            registry=registry,
        )
        self.itl = Histogram(
            "tyard_serving_itl_seconds",
            "Inter-token latency.",
            d,
            buckets=_ITL,
            registry=registry,
        )
        self.e2e = Histogram(
            "tyard_serving_e2e_seconds",
            "End-to-end request latency.",
            d,
            buckets=_LATENCY,
            registry=registry,
        )
        self.queue = Histogram(
            "tyard_serving_queue_seconds",
            "Time waiting for a ready replica.",
            d,
            buckets=_LATENCY,
            registry=registry,
        )
        self.overhead = Histogram(
            "tyard_serving_gateway_overhead_seconds",
            "The gateway's own time per request: its total less the upstream engine's time.",
            d,
            buckets=_OVERHEAD,
            registry=registry,
        )
        self.running = Gauge(
            "tyard_serving_running_requests", "Requests on a replica.", d, registry=registry
        )
        self.waiting = Gauge(
            "tyard_serving_waiting_requests",
            "Requests waiting for a replica.",
            d,
            registry=registry,
        )
        self.desired = Gauge(
            "tyard_serving_desired_replicas",
            "Replicas the supervisor aims for (the autoscaler's answer, or the fixed count).",
            d,
            registry=registry,
        )
        self.prefix_hit = Gauge(
            "tyard_serving_prefix_hit_ratio",
            "Prompt characters routed to a replica that had seen them / all prompt characters.",
            d,
            registry=registry,
        )
        self.requests = Counter(
            "tyard_serving_requests",
            "Gateway requests by HTTP status.",
            [*d, "code"],
            registry=registry,
        )
        self.tokens = Counter(
            "tyard_serving_tokens",
            "Tokens served, by team, user and kind (prompt|completion).",
            [*d, "team", "user", "kind"],
            registry=registry,
        )
        self.restarts = Counter(
            "tyard_serving_replica_restarts",
            "Replica processes restarted after a crash.",
            d,
            registry=registry,
        )
        self._chars: dict[str, list[int]] = {}

    def routed(self, deployment: str, matched: int, total: int) -> None:
        acc = self._chars.setdefault(deployment, [0, 0])
        acc[0] += matched
        acc[1] += total
        if acc[1]:
            self.prefix_hit.labels(deployment).set(acc[0] / acc[1])
