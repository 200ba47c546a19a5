"""Registry webhooks: an HTTP POST per event, HMAC-signed, retried with exponential backoff.

Each delivery carries::

    X-Tyard-Event: model.version.created | model.alias.moved | model.alias.deleted
    X-Tyard-Delivery: <uuid>          the same on every retry (receivers de-duplicate by it)
    X-Tyard-Timestamp: <unix seconds>
    X-Tyard-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with the hook's secret>

A delivery is retried on a transport error, a 5xx or a 429, up to ``retries`` more times, waiting
``backoff_s * 2**n``; other 4xx answers are final. Deliveries run on a small thread pool, so the
API answers without waiting for receivers. They are not durable: events still being retried
when the control plane stops are lost (no outbox table yet).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["Delivery", "WebhookConfig", "WebhookNotifier", "sign", "verify"]

log = logging.getLogger("tensoryard.webhooks")
EVENTS = ("model.version.created", "model.alias.moved", "model.alias.deleted")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, kw_only=True)
class WebhookConfig:
    """One receiver."""

    url: str
    """Where to POST (http or https)."""
    secret: str
    """Shared secret for the HMAC signature (give the receiver the same)."""
    events: tuple[str, ...] = EVENTS
    """Events this receiver gets."""
    retries: int = 5
    """Retries after the first attempt."""
    backoff_s: float = 1.0
    """Wait before the first retry; doubles each time."""
    timeout_s: float = 10.0
    """Per attempt."""


@dataclass(frozen=True)
class Delivery:
    url: str
    event: str
    delivery_id: str
    attempts: int
    ok: bool
    status: int | None
    error: str


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The X-Tyard-Signature value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: str, body: bytes, timestamp: str, signature: str) -> bool:
    """For receivers: whether ``signature`` is this body's, in constant time."""
    try:
        expected = sign(secret, body, int(timestamp))
    except ValueError:
        return False
    return hmac.compare_digest(expected, signature)


class WebhookNotifier:
    """Sends registry events to every configured receiver, in the background."""

    def __init__(
        self,
        hooks: Sequence[WebhookConfig],
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        workers: int = 2,
    ) -> None:
        self.hooks = tuple(hooks)
        self._sleep = sleep
        self._clock = clock
        self._http = httpx.Client(transport=transport)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tyard-webhook")

    def emit(self, event: str, payload: dict[str, Any]) -> list[Future[Delivery]]:
        """Queue ``event`` for every receiver that wants it; the futures end with the result."""
        body = json.dumps({"event": event, "data": payload}, default=str, sort_keys=True).encode()
        return [
            self._pool.submit(self._deliver, hook, event, body, uuid.uuid4().hex)
            for hook in self.hooks
            if event in hook.events
        ]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._http.close()

    def _deliver(self, hook: WebhookConfig, event: str, body: bytes, delivery: str) -> Delivery:
        status: int | None = None
        error = ""
        for attempt in range(1, hook.retries + 2):
            stamp = int(self._clock())
            headers = {
                "Content-Type": "application/json",
                "X-Tyard-Event": event,
                "X-Tyard-Delivery": delivery,
                "X-Tyard-Timestamp": str(stamp),
                "X-Tyard-Signature": sign(hook.secret, body, stamp),
            }
            try:
                response = self._http.post(
                    hook.url, content=body, headers=headers, timeout=hook.timeout_s
                )
                status, error = response.status_code, ""
                if status < 300:
                    return Delivery(hook.url, event, delivery, attempt, True, status, "")
                if status not in RETRY_STATUS:
                    error = f"HTTP {status} (not retried)"
                    break
                error = f"HTTP {status}"
            except httpx.HTTPError as exc:
                status, error = None, f"{type(exc).__name__}: {exc}"
            if attempt <= hook.retries:
                self._sleep(hook.backoff_s * 2 ** (attempt - 1))
        log.warning("webhook %s for %s to %s failed: %s", delivery, event, hook.url, error)
        return Delivery(hook.url, event, delivery, attempt, False, status, error)
