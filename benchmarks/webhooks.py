"""What the durable webhook outbox costs, next to what it replaced, in one run.

1. Registration: ``Store.register_version`` with no receiver configured and with two (each
   registration then also writes two outbox rows in its transaction), alternating one and the
   other: latency p50/p99, ratio.
2. Delivery: N events to a loopback receiver by the outbox's delivery loop (claim, signed
   POST, record the outcome: three database round trips per row) next to the physical limit
   here, the same signed POSTs from a plain ``httpx`` loop with no database (what the old
   in-process notifier did): events/s and the ratio.

No goal was set for webhooks; the numbers say what durability costs on this machine.

    python benchmarks/webhooks.py [--db-url URL]   # JSON in benchmarks/results/, row in RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import benchmark_main, provenance  # noqa: E402

from tensoryard.registry.webhooks import (  # noqa: E402
    WebhookConfig,
    WebhookDispatcher,
    post_once,
)
from tensoryard.store import Store, default_sqlite_url  # noqa: E402

NAME = "webhooks"
DIGEST = "ef" * 32


class Receiver:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    outer.count += 1
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def register_latency(
    url: str, hooks: list[tuple[str, tuple[str, ...]]], n: int
) -> tuple[list[float], list[float]]:
    """Registration latencies without and with `hooks`, alternating (same load for both)."""
    with Store.open(url) as store:
        store.ensure_team("bench")
        model = f"m{uuid.uuid4().hex[:8]}"
        times: tuple[list[float], list[float]] = ([], [])
        for i in range(2 * n):
            store.route_webhooks(hooks if i % 2 else [])
            t0 = time.perf_counter()
            store.register_version("bench", model, artifact=DIGEST, size_bytes=1, created_by="b")
            times[i % 2].append(time.perf_counter() - t0)
        return times


def outbox_rate(url: str, receiver: Receiver, n: int) -> float:
    hook = WebhookConfig(url=receiver.url, secret="s", backoff_s=0.1)
    with Store.open(url) as store:
        store.ensure_team("bench")
        with store.engine.begin() as conn:  # only this run's events in the outbox
            conn.exec_driver_sql("DELETE FROM webhook_deliveries")
        plane = WebhookDispatcher(store, [hook], owner="bench", poll_s=0.01, batch=32, workers=4)
        model = f"d{uuid.uuid4().hex[:8]}"
        for _ in range(n):
            store.register_version("bench", model, artifact=DIGEST, size_bytes=1, created_by="b")
        start_count = receiver.count
        t0 = time.perf_counter()
        plane.start()
        while receiver.count - start_count < n:
            time.sleep(0.005)
        elapsed = time.perf_counter() - t0
        plane.stop()
        left = store.list_webhook_deliveries(status="pending", limit=10)
        assert not left, "undelivered rows left"
        return n / elapsed


def direct_rate(receiver: Receiver, n: int) -> float:
    hook = WebhookConfig(url=receiver.url, secret="s")
    body = json.dumps({"event": "model.version.created", "data": {"v": 1}}).encode()
    with httpx.Client() as http:
        t0 = time.perf_counter()
        for _ in range(n):
            result = post_once(
                http, hook, "model.version.created", body, uuid.uuid4().hex, time.time()
            )
            assert result.ok
        return n / (time.perf_counter() - t0)


GOAL = "none set (the cost of durability)"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db_url or default_sqlite_url(Path(tmp))
        receiver = Receiver()
        events: tuple[str, ...] = ("model.version.created",)
        two = [(receiver.url, events), (receiver.url + "2", events)]
        register_latency(url, two, 20)  # warm-up
        base, with_rows = register_latency(url, two, args.registrations)
        outbox = statistics.median(outbox_rate(url, receiver, args.events) for _ in range(3))
        direct = statistics.median(direct_rate(receiver, args.events) for _ in range(3))
        receiver.server.shutdown()
    run = provenance("webhooks.py")
    if args.db_url:  # the URL may carry a password: the command keeps only its scheme
        run["command"] = run["command"].replace(args.db_url, f"{backend_of(args)}://...")
    return {
        **run,
        "backend": backend_of(args),
        "registrations": args.registrations,
        "events": args.events,
        "register_p50_ms": {
            "no_hooks": _pct(base, 0.5) * 1e3,
            "two_hooks": _pct(with_rows, 0.5) * 1e3,
        },
        "register_p99_ms": {
            "no_hooks": _pct(base, 0.99) * 1e3,
            "two_hooks": _pct(with_rows, 0.99) * 1e3,
        },
        "register_p50_ratio": _pct(with_rows, 0.5) / _pct(base, 0.5),
        "delivery_events_per_s": {"outbox": outbox, "direct_httpx": direct},
        "delivery_ratio": outbox / direct,
    }


def summary(result: dict[str, Any]) -> tuple[str, str]:
    """The RESULTS.md row's result and met columns, from a run's JSON."""
    p50, p99 = result["register_p50_ms"], result["register_p99_ms"]
    rate = result["delivery_events_per_s"]
    text = (
        f"{result['backend']}: register p50 {p50['no_hooks']:.1f} -> {p50['two_hooks']:.1f} ms "
        f"with 2 hooks (x{result['register_p50_ratio']:.2f}), p99 {p99['no_hooks']:.1f} -> "
        f"{p99['two_hooks']:.1f} ms; delivery {rate['outbox']:.0f} events/s (outbox loop, 4 "
        f"senders) vs {rate['direct_httpx']:.0f}/s plain httpx POSTs without a database = "
        f"{result['delivery_ratio']:.2f}x; load average at the end {result['load_average']}"
    )
    return text, "-"


def backend_of(args: argparse.Namespace) -> str:
    url = args.db_url or "sqlite"
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def variant(args: argparse.Namespace) -> str:
    backend = backend_of(args)
    return NAME if backend == "sqlite" else f"{NAME}_{backend}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db-url", help="database (default: a SQLite file in a temp dir)")
    parser.add_argument("--registrations", type=int, default=300)
    parser.add_argument("--events", type=int, default=500)


if __name__ == "__main__":
    benchmark_main(
        NAME,
        __doc__,
        GOAL,
        measure,
        summary,
        add_arguments,
        json_name=variant,
        row_name=lambda r: NAME if r["backend"] == "sqlite" else f"{NAME}_{r['backend']}",
    )
