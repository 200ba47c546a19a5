"""Registry webhooks: a durable outbox, sent as HMAC-signed HTTP POSTs retried with backoff.

The store writes one delivery row per (event, receiver) in the transaction of the registry
change (``Store.route_webhooks`` names the receivers), so an event exists iff its change
committed. :class:`WebhookDispatcher`, a background loop of the control plane, claims due rows,
POSTs them and records each outcome; rows survive a restart and are sent after it. Each POST
carries::

    X-Tyard-Event: model.version.created | model.version.tagged | model.alias.moved | ...
    X-Tyard-Delivery: <hex id>        the same on every attempt (receivers de-duplicate by it)
    X-Tyard-Timestamp: <unix seconds>
    X-Tyard-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with the hook's secret>

A delivery is retried on a transport error, a 5xx or a 429, up to ``retries`` more times, the
n-th retry waiting ``backoff_s * 2**(n-1)`` (capped at ``max_backoff_s``) with "equal jitter"
(half fixed, half random); other 4xx answers are final. A delivery that gives up is kept as
``failed`` (the dead letter) until an admin redelivers it. Delivery is at least once: a control
plane that dies between the POST and recording it sends the same delivery id again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tensoryard.errors import ConfigError, FieldIssue, SpecError
from tensoryard.store import Store, WebhookDeliveryRecord
from tensoryard.store._webhooks import Outcome

__all__ = [
    "EVENTS",
    "Attempt",
    "WebhookConfig",
    "WebhookDispatcher",
    "backoff_s",
    "body_of",
    "load_webhooks_file",
    "post_once",
    "sign",
    "verify",
]

log = logging.getLogger("tensoryard.webhooks")
EVENTS = (
    "model.version.created",
    "model.version.tagged",
    "model.alias.moved",
    "model.alias.deleted",
)
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
    """Wait before the first retry; doubles each time (with jitter)."""
    max_backoff_s: float = 3600.0
    """Longest wait between two attempts."""
    timeout_s: float = 10.0
    """Per attempt."""

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(
                f"webhook url {self.url!r} is not http(s) (fix: e.g. https://host/hook)"
            )
        if not self.secret:
            raise ConfigError(f"webhook {self.url}: empty secret (fix: give it a shared secret)")
        unknown = sorted(set(self.events) - set(EVENTS))
        if unknown:
            raise ConfigError(
                f"webhook {self.url}: unknown events {unknown} (fix: pick from {EVENTS})"
            )
        if self.retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ConfigError(
                f"webhook {self.url}: retries and backoff_s must be >= 0 and timeout_s > 0"
            )


_FILE_KEYS = {
    "url",
    "secret",
    "secret_env",
    "secret_file",
    "events",
    "retries",
    "backoff_s",
    "max_backoff_s",
    "timeout_s",
}


def load_webhooks_file(
    path: Path, *, environ: Mapping[str, str] | None = None
) -> tuple[WebhookConfig, ...]:
    """Receivers from a YAML file (``tyard server --webhooks FILE``)::

        webhooks:
          - url: https://ci.example.org/hooks/tyard
            secret_env: TYARD_HOOK_SECRET     # or secret_file: PATH, or secret: VALUE
            events: [model.alias.moved]       # default: every event
            retries: 5                        # optional, as WebhookConfig

    Every problem is reported at once, each naming its field (``webhooks[0].url``) and the fix.
    """
    env = os.environ if environ is None else environ
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot read webhooks file {path}: {exc.strerror or exc} (fix: pass an existing "
            "YAML file to --webhooks)"
        ) from exc
    except yaml.YAMLError as exc:
        raise SpecError(
            [FieldIssue("", f"not valid YAML: {exc}", "fix the syntax")], source=str(path)
        ) from exc
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not isinstance(raw.get("webhooks", []), list):
        raise SpecError(
            [
                FieldIssue(
                    "webhooks",
                    "expected a mapping with a list under 'webhooks'",
                    "write 'webhooks:' followed by '- url: ...' items",
                )
            ],
            source=str(path),
        )
    unknown_top = sorted(set(raw) - {"webhooks"})
    issues = [FieldIssue(k, "unknown key", "the file has one key, 'webhooks'") for k in unknown_top]
    hooks: list[WebhookConfig] = []
    for i, item in enumerate(raw.get("webhooks") or []):
        where = f"webhooks[{i}]"
        if not isinstance(item, dict):
            issues.append(FieldIssue(where, "expected a mapping", "write '- url: ...'"))
            continue
        for key in sorted(set(item) - _FILE_KEYS):
            issues.append(
                FieldIssue(f"{where}.{key}", "unknown key", f"use one of {sorted(_FILE_KEYS)}")
            )
        url = item.get("url")
        if not isinstance(url, str) or not url:
            issues.append(FieldIssue(f"{where}.url", "missing", "give the receiver's http(s) URL"))
            continue
        sources = [k for k in ("secret", "secret_env", "secret_file") if item.get(k)]
        if len(sources) != 1:
            issues.append(
                FieldIssue(
                    f"{where}.secret",
                    "needs exactly one of secret, secret_env, secret_file"
                    + (f" (got {', '.join(sources)})" if sources else ""),
                    "prefer secret_env: NAME of an environment variable holding it",
                )
            )
            continue
        secret = ""
        if sources[0] == "secret":
            secret = str(item["secret"])
        elif sources[0] == "secret_env":
            secret = env.get(str(item["secret_env"]), "")
            if not secret:
                issues.append(
                    FieldIssue(
                        f"{where}.secret_env",
                        f"environment variable {item['secret_env']} is unset or empty",
                        f"export {item['secret_env']}=... before starting the server",
                    )
                )
                continue
        else:
            try:
                secret = Path(str(item["secret_file"])).read_text(encoding="utf-8").strip()
            except OSError as exc:
                issues.append(
                    FieldIssue(
                        f"{where}.secret_file",
                        f"cannot read {item['secret_file']}: {exc.strerror or exc}",
                        "point it at a readable file holding the secret",
                    )
                )
                continue
        options: dict[str, Any] = {}
        events = item.get("events")
        if events is not None:
            if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
                issues.append(
                    FieldIssue(
                        f"{where}.events",
                        "expected a list of event names",
                        f"pick from {list(EVENTS)}",
                    )
                )
                continue
            options["events"] = tuple(events)
        bad_number = False
        for key in ("retries", "backoff_s", "max_backoff_s", "timeout_s"):
            if key in item:
                value = item[key]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    issues.append(
                        FieldIssue(f"{where}.{key}", f"not a number: {value!r}", "give a number")
                    )
                    bad_number = True
                    continue
                options[key] = int(value) if key == "retries" else float(value)
        if bad_number:
            continue
        try:
            hooks.append(WebhookConfig(url=url, secret=secret, **options))
        except ConfigError as exc:
            issues.append(FieldIssue(where, str(exc), "see the message"))
    if issues:
        raise SpecError(issues, source=str(path))
    urls = [h.url for h in hooks]
    dupes = sorted({u for u in urls if urls.count(u) > 1})
    if dupes:
        raise SpecError(
            [
                FieldIssue("webhooks", f"receiver {u} listed twice", "keep one entry per URL")
                for u in dupes
            ],
            source=str(path),
        )
    return tuple(hooks)


@dataclass(frozen=True)
class Attempt:
    """The answer to one POST: a 2xx, a retryable failure, or a final one."""

    ok: bool
    retryable: bool
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


def backoff_s(hook: WebhookConfig, attempts: int, rng: random.Random) -> float:
    """The wait after the ``attempts``-th failed attempt: exponential, capped, half jittered."""
    full = min(hook.max_backoff_s, hook.backoff_s * float(2 ** max(0, attempts - 1)))
    return full / 2 + rng.uniform(0, full / 2)


def post_once(
    http: httpx.Client, hook: WebhookConfig, event: str, body: bytes, delivery_id: str, now: float
) -> Attempt:
    """One signed POST; transport errors, 5xx and 429 are retryable, other answers final."""
    stamp = int(now)
    headers = {
        "Content-Type": "application/json",
        "X-Tyard-Event": event,
        "X-Tyard-Delivery": delivery_id,
        "X-Tyard-Timestamp": str(stamp),
        "X-Tyard-Signature": sign(hook.secret, body, stamp),
    }
    try:
        response = http.post(hook.url, content=body, headers=headers, timeout=hook.timeout_s)
    except httpx.HTTPError as exc:
        return Attempt(False, True, None, f"{type(exc).__name__}: {exc}")
    status = response.status_code
    if status < 300:
        return Attempt(True, False, status, "")
    if status in RETRY_STATUS:
        return Attempt(False, True, status, f"HTTP {status}")
    return Attempt(False, False, status, f"HTTP {status} (not retried)")


def body_of(row: WebhookDeliveryRecord) -> bytes:
    """The JSON body of a delivery (the same bytes on every attempt)."""
    data = {"event": row.event, "event_id": row.event_id, "data": row.payload}
    return json.dumps(data, default=str, sort_keys=True).encode()


class WebhookDispatcher:
    """The delivery loop: claims due outbox rows, POSTs them, records the outcome.

    Every control plane may run one; the store's claim makes sure a row is sent by one of
    them at a time. ``kick()`` wakes it after a registry change so events go out at once;
    otherwise it looks for due rows every ``poll_s``."""

    def __init__(
        self,
        store: Store,
        hooks: Sequence[WebhookConfig],
        *,
        owner: str,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        poll_s: float = 1.0,
        batch: int = 16,
        workers: int = 4,
    ) -> None:
        self.store = store
        self.hooks = {h.url: h for h in hooks}
        self.owner = owner
        self.poll_s = poll_s
        self.batch = batch
        self.attempts = 0
        """Attempts this dispatcher made (claimed rows), for logs and tests."""
        # a claim outlives the slowest POST of a batch, so it never lapses while we send
        self.lease_s = 30.0 + 2 * max((h.timeout_s for h in hooks), default=10.0) * (
            1 + batch // max(1, workers)
        )
        self._clock = clock
        self._rng = rng or random.Random()
        self._http = httpx.Client(transport=transport)
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="tyard-webhook")
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        store.route_webhooks([(h.url, h.events) for h in hooks])

    def start(self) -> None:
        """Release the claims a previous run of this control plane left, then loop."""
        released = self.store.release_webhook_claims(self.owner)
        if released:
            log.info("webhooks: %d deliveries claimed before a restart are due again", released)
        self._thread = threading.Thread(target=self._run, name="tyard-webhooks", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Look for due deliveries now (after a registry change committed)."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the POSTs in flight and stop; unsent rows stay in the outbox."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=True)
        self._http.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the pass: a kick during it makes the next one start
            try:
                sent = self.run_once()
            except Exception:  # the loop must outlive a database hiccup
                log.exception("webhook delivery pass failed; retrying")
                sent = 0
            if sent < self.batch:  # a full batch: more may be due, go on at once
                self._wake.wait(self.poll_s)

    def run_once(self) -> int:
        """One pass: claim due rows, send them (concurrently), record outcomes; how many."""
        rows = self.store.claim_webhook_deliveries(
            self.owner, limit=self.batch, lease_s=self.lease_s
        )
        self.attempts += len(rows)
        for _ in self._pool.map(self._deliver, rows):
            pass
        return len(rows)

    def _deliver(self, row: WebhookDeliveryRecord) -> None:
        hook = self.hooks.get(row.hook_url)
        if hook is None:
            self._finish(
                row,
                "failed",
                None,
                "no webhook with this URL is configured any more (fix: configure it again "
                "and redeliver)",
            )
            return
        result = post_once(
            self._http, hook, row.event, body_of(row), row.delivery_id, self._clock()
        )
        if result.ok:
            self._finish(row, "delivered", result.status, "")
        elif result.retryable and row.attempts <= hook.retries:
            wait = backoff_s(hook, row.attempts, self._rng)
            self._finish(row, "retry", result.status, result.error, wait)
        else:
            log.warning(
                "webhook delivery %s (%s) to %s failed after %d attempts: %s",
                row.delivery_id,
                row.event,
                row.hook_url,
                row.attempts,
                result.error,
            )
            self._finish(row, "failed", result.status, result.error)

    def _finish(
        self,
        row: WebhookDeliveryRecord,
        outcome: Outcome,
        status: int | None,
        error: str,
        wait: float = 0.0,
    ) -> None:
        held = self.store.finish_webhook_delivery(
            row.id, self.owner, outcome, status=status, error=error, retry_in_s=wait
        )
        if not held:
            log.warning("webhook delivery %s: claim lapsed before its outcome", row.delivery_id)
