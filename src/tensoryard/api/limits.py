"""Limits against hostile or runaway clients: request body size, and requests per token.

``BodyLimit`` is plain ASGI middleware: a request whose Content-Length (or streamed body) is
over the limit gets 413 before any route reads it. ``NoNulInUrl`` answers 422 to a URL with a
NUL character, which PostgreSQL's text cannot hold. ``RateLimiter`` is a token bucket per key
(a token id, a job, or a client address for unauthenticated calls) with an injected clock.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from tensoryard.errors import RateLimited

__all__ = ["BodyLimit", "NoNulInUrl", "RateLimiter"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]


class NoNulInUrl:
    """Answer 422 to a request whose path or query string holds a NUL character (raw or
    ``%00``): PostgreSQL's text cannot hold one, so such a value (a team, a user, a filter)
    would reach the database only to fail there, as a 503 on PostgreSQL and not on SQLite."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            "\x00" in scope.get("path", "")
            or b"\x00" in unquote_to_bytes(scope.get("query_string", b""))
        ):
            issue = {
                "path": "url",
                "message": "the path or query string holds a NUL character (%00)",
                "fix": "leave NUL characters out of names and filters",
            }
            message = f"invalid request: {issue['message']}"
            body = json.dumps({"message": message, "detail": [issue]})
            await send(
                {
                    "type": "http.response.start",
                    "status": 422,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body.encode()})
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Answer 413 to requests with a body over ``max_bytes`` (declared or streamed)."""

    def __init__(self, app: Any, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(send, declared)
            return
        if declared is not None:
            await self.app(scope, receive, send)  # the server stops reading at the length
            return
        # No declared length (chunked): read up to the limit here, then replay what was read.
        body = bytearray()
        while True:
            message: Message = await receive()
            if message.get("type") != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._reject(send, len(body))
                return
            if not message.get("more_body", False):
                break
        replayed = {"type": "http.request", "body": bytes(body), "more_body": False}
        await self.app(scope, _replay([replayed], receive), send)

    async def _reject(self, send: Send, size: int) -> None:
        body = json.dumps(
            {
                "message": f"request body of {size} bytes or more is over the limit of "
                f"{self.max_bytes} bytes (fix: send less per request, e.g. smaller report "
                "batches; the server's limit is ServerConfig.max_body_bytes)"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replaying_receive() -> Message:
        if pending:
            return pending.pop(0)
        message: Message = await receive()
        return message

    return replaying_receive


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """A token bucket per key: ``rate_per_s`` sustained, up to ``burst`` at once."""

    MAX_KEYS = 100_000  # beyond this, full (idle) buckets are forgotten

    def __init__(
        self, *, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate_per_s must be > 0 and burst >= 1")
        self.rate = rate_per_s
        self.burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def check(self, key: str) -> None:
        """Take one request from ``key``'s bucket, or raise RateLimited with Retry-After."""
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.MAX_KEYS:
                    self._forget_idle(now)
                bucket = self._buckets[key] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
            bucket.at = now
            if bucket.tokens >= 1:
                bucket.tokens -= 1
                return
            wait = (1 - bucket.tokens) / self.rate
        raise RateLimited(
            f"too many requests for {key.split(':', 1)[0]} {key.split(':', 1)[-1]}: "
            f"the limit is {self.rate:g}/s with bursts of {self.burst:g} "
            f"(fix: retry after {math.ceil(wait)}s, and poll less often)",
            retry_after_s=wait,
        )

    def _forget_idle(self, now: float) -> None:
        full = [
            k for k, b in self._buckets.items() if b.tokens + (now - b.at) * self.rate >= self.burst
        ]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= self.MAX_KEYS:  # all busy: start over rather than grow
            self._buckets.clear()
