"""Step metrics, checkpoint records and heartbeats from a job to the control plane.

`Reporter.report()` is called from the training loop and must cost microseconds: it appends the
row to ``$TYARD_RUN_DIR/attempt-N/metrics.jsonl`` (the durable record in the run directory; the
control plane does not import it back: rows the queue could not deliver before the process ended
are in that file only) and puts it on an in-memory queue. A background thread POSTs the queue
in batches to ``/api/v1/jobs/{id}/report`` (docs/contracts.md, section 2), retries with
exponential backoff while the control plane is unreachable, and sends a heartbeat every
``TYARD_HEARTBEAT_S`` seconds. The queue is bounded: when it overflows the oldest rows are
dropped from the queue (never from metrics.jsonl) and an event says how many.

Only rank 0 reports; on other ranks every method is a cheap no-op. Without
``TYARD_SERVER_URL`` the reporter is offline and writes only metrics.jsonl.

Pure Python (no torch), so it can be used by any job.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol

from tensoryard import envvars
from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime._env import attempt_numbers, setting

__all__ = ["Reporter", "ReporterConfig", "Transport", "UrllibTransport"]

log = logging.getLogger("tensoryard.runtime.report")

# Statuses worth retrying: the server is down, overloaded or restarting.
_RETRYABLE = frozenset({0, 408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True, kw_only=True)
class ReporterConfig:
    """Where and how a job reports. `from_env` reads the contract's TYARD_* variables."""

    job_id: str | None = None
    """Job id (TYARD_JOB_ID); without it the reporter cannot address the server: offline."""
    attempt: int = 1
    """Attempt number, 1-based (TYARD_ATTEMPT)."""
    launch_attempt: int | None = None
    """After an in-place restart (torchrun restarted the workers), the attempt the control
    plane launched (TYARD_LAUNCH_ATTEMPT); this attempt's first report records the restart."""
    run_dir: Path | None = None
    """Per-job directory (TYARD_RUN_DIR); metrics go to run_dir/attempt-N/metrics.jsonl."""
    server_url: str | None = None
    """Control-plane base URL (TYARD_SERVER_URL); None: offline, jsonl only."""
    token: str | None = None
    """Bearer token for the report endpoint (TYARD_JOB_TOKEN)."""
    heartbeat_s: float = 5.0
    """Send at least one request this often, even without new rows (TYARD_HEARTBEAT_S)."""
    flush_interval_s: float = 1.0
    """Batch rows for this long before sending (a full batch is sent at once)."""
    max_batch: int = 500
    """Most metric rows in one request."""
    max_queue: int = 20_000
    """Most rows waiting to be sent; beyond it the oldest are dropped from the queue."""
    backoff_initial_s: float = 0.5
    """First retry delay after a failed request; doubles up to backoff_max_s."""
    backoff_max_s: float = 15.0
    """Longest retry delay."""
    request_timeout_s: float = 5.0
    """Timeout of one request."""
    close_timeout_s: float = 10.0
    """How long close() keeps trying to deliver what is left."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ReporterConfig:
        """Build from the TYARD_* variables (docs/contracts.md, section 1), then `overrides`."""
        env = os.environ if env is None else env
        run_dir = envvars.RUN_DIR.get(env)
        attempt, launch_attempt = attempt_numbers(env)
        config = cls(
            job_id=envvars.JOB_ID.get(env),
            attempt=attempt,
            launch_attempt=launch_attempt,
            run_dir=Path(run_dir) if run_dir else None,
            server_url=envvars.SERVER_URL.get(env),
            token=envvars.JOB_TOKEN.get(env),
            heartbeat_s=setting(envvars.HEARTBEAT_S, env),
        )
        return replace(config, **overrides)

    @property
    def metrics_path(self) -> Path | None:
        """run_dir/attempt-N/metrics.jsonl, or None without a run directory."""
        if self.run_dir is None:
            return None
        return self.run_dir / f"attempt-{self.attempt}" / "metrics.jsonl"

    @property
    def report_url(self) -> str | None:
        """The report endpoint, or None when offline."""
        if not self.server_url or not self.job_id:
            return None
        base = self.server_url.rstrip("/")
        return f"{base}/api/v1/jobs/{urllib.parse.quote(self.job_id)}/report"


class Transport(Protocol):
    """Sends one JSON body; returns (HTTP status, response body). Status 0: no connection."""

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]: ...


class UrllibTransport:
    """The default transport: the standard library, no proxy for loopback addresses."""

    def __init__(self, *, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._default = urllib.request.build_opener()

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
        opener = self._direct if _is_loopback(url) else self._default
        try:
            with opener.open(request, timeout=self.timeout_s) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read() if exc.fp else b""
        except (urllib.error.URLError, OSError, ValueError):
            return 0, b""  # refused, reset, timed out, unreachable: all retryable


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class _Pending:
    """What the sender thread still has to deliver, besides metric rows."""

    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    resumed: tuple[int | None] | None = None  # (step,) until sent once; None: nothing to send
    timings: dict[str, float] | None = None  # cumulative per attempt: the newest wins


class Reporter:
    """Reports step metrics, checkpoints and heartbeats of one attempt (rank 0 only).

    Use `Reporter.from_env(rank=...)` inside a job. `report()` never blocks on the network.
    """

    def __init__(
        self,
        config: ReporterConfig,
        *,
        rank: int = 0,
        transport: Transport | None = None,
    ) -> None:
        self.config = config
        self.active = rank == 0
        self._transport = transport or UrllibTransport(timeout_s=config.request_timeout_s)
        self._url = config.report_url if self.active else None
        self._lock = threading.Lock()
        self._queue: deque[dict[str, Any]] = deque()
        self._pending = _Pending()
        self._dropped = 0
        self._warned_nonfinite: set[str] = set()
        self._dropped_reported = 0
        self._inflight = False
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._cancel = threading.Event()
        self._last_report = time.perf_counter()
        self._file = self._open_jsonl() if self.active else None
        self._thread: threading.Thread | None = None
        self.sent_rows = 0
        self.failed_requests = 0
        if self._url is not None:
            self._thread = threading.Thread(target=self._run, name="tyard-reporter", daemon=True)
            self._thread.start()

    @classmethod
    def from_env(
        cls, *, rank: int = 0, env: Mapping[str, str] | None = None, **overrides: Any
    ) -> Reporter:
        """A reporter configured from the TYARD_* variables."""
        return cls(ReporterConfig.from_env(env, **overrides), rank=rank)

    # -- called from the training loop -------------------------------------------------------

    @property
    def online(self) -> bool:
        """True when rows are sent to a control plane (rank 0 with a server URL and job id)."""
        return self._thread is not None

    @property
    def cancel_requested(self) -> bool:
        """The control plane answered `cancel: true`: checkpoint and exit."""
        return self._cancel.is_set()

    @property
    def dropped_rows(self) -> int:
        """Rows dropped from the send queue because it overflowed (still in metrics.jsonl)."""
        return self._dropped

    def report(self, step: int, *, step_time_s: float | None = None, **values: Any) -> None:
        """Record the metrics of one finished step; returns in microseconds.

        `step_time_s` defaults to the time since the previous call. Values are converted with
        float() (numbers, 0-dim tensors, numpy scalars); anything else raises RuntimeSetupError.
        """
        if not self.active:
            return
        now = time.perf_counter()
        if step_time_s is None:
            step_time_s = now - self._last_report
        self._last_report = now
        numbers = {key: _number(key, value) for key, value in values.items()}
        row = {
            "step": int(step),
            "ts": time.time(),
            "step_time_s": float(step_time_s),
            "values": numbers,
        }
        if self._file is not None:
            self._append(row)  # the durable record keeps NaN and inf as they were
        if self._thread is None:
            return
        if not all(math.isfinite(v) for v in numbers.values()):
            row = {**row, "values": self._finite(int(step), numbers)}
        with self._lock:
            if len(self._queue) >= self.config.max_queue:
                self._queue.popleft()  # keep the newest; the row stays in metrics.jsonl
                self._dropped += 1
            self._queue.append(row)
            size = len(self._queue)
        # Wake the sender when a batch starts (it may be sleeping until the next heartbeat)
        # or fills up; in between, appending is all a call costs.
        if size == 1 or size >= self.config.max_batch:
            self._wake.set()

    def _finite(self, step: int, numbers: dict[str, float]) -> dict[str, float]:
        """The finite values of a row (the control plane takes numbers only); each metric that
        turns NaN or infinite is named once in a warning event."""
        for key, value in numbers.items():
            if not math.isfinite(value) and key not in self._warned_nonfinite:
                self._warned_nonfinite.add(key)
                self.event(
                    f"metric {key} is {value} at step {step} (the training may have diverged); "
                    "its non-finite values are kept in metrics.jsonl, not sent",
                    kind="warning",
                )
        return {k: v for k, v in numbers.items() if math.isfinite(v)}

    def checkpoint(
        self,
        step: int,
        path: str | Path,
        size_bytes: int,
        ts: float | None = None,
        *,
        format: str | None = None,
    ) -> None:
        """Record a checkpoint written by this attempt (the Checkpointer calls this);
        ``format`` as in docs/artifacts.md (None: the control plane detects it)."""
        if self._thread is None:
            return
        record: dict[str, Any] = {
            "step": int(step),
            "path": str(path),
            "ts": time.time() if ts is None else ts,
            "size_bytes": int(size_bytes),
        }
        if format is not None:
            record["format"] = format
        with self._lock:
            self._pending.checkpoints.append(record)
        self._wake.set()

    def event(self, message: str, *, kind: str = "runtime") -> None:
        """A human-readable event for the job's event log (also written to the rank log)."""
        if not self.active:
            return
        log.info("%s", message)
        if self._thread is None:
            return
        with self._lock:
            self._pending.events.append({"kind": kind, "message": message})
        self._wake.set()

    def set_resumed_from(self, step: int | None) -> None:
        """Where this attempt resumed (None: fresh start); sent once with the next request."""
        if not self.active:
            return
        with self._lock:
            self._pending.resumed = (step,)
        self._wake.set()
        if step is not None:
            self.event(f"resumed from step {step}")

    def set_timings(self, *, checkpoint_save_s: float, checkpoint_restore_s: float) -> None:
        """This attempt's checkpoint time so far (cumulative, so re-sending is harmless)."""
        if not self.active:
            return
        with self._lock:
            self._pending.timings = {
                "checkpoint_save_s": float(checkpoint_save_s),
                "checkpoint_restore_s": float(checkpoint_restore_s),
            }

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far was delivered; False on timeout or offline."""
        if self._file is not None:
            self._file.flush()
        if self._thread is None:
            return self._url is None
        wait_s = self.config.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        self._wake.set()
        while time.monotonic() < deadline:
            if not self._has_pending():
                return True
            time.sleep(0.01)
            self._wake.set()
        return not self._has_pending()

    def close(self) -> None:
        """Deliver what is left (up to close_timeout_s), stop the thread, close the file."""
        if self._thread is not None:
            self._closing.set()
            self._wake.set()
            self._thread.join(self.config.close_timeout_s + self.config.request_timeout_s + 1)
            self._thread = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the sender thread -------------------------------------------------------------------

    def _open_jsonl(self) -> IO[str] | None:
        path = self.config.metrics_path
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        # Line buffered: each row reaches the OS at once, so a SIGKILL loses nothing reported.
        return path.open("a", encoding="utf-8", buffering=1)

    def _append(self, row: dict[str, Any]) -> None:
        assert self._file is not None
        try:
            self._file.write(json.dumps(row) + "\n")
        except OSError as exc:
            # Losing the metrics file must not kill the training run: say so once, go on.
            log.warning("cannot append to %s (%s); continuing without it", self._file.name, exc)
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _has_pending(self) -> bool:
        with self._lock:
            pending = self._pending
            return bool(
                self._inflight
                or self._queue
                or pending.checkpoints
                or pending.events
                or pending.resumed is not None
                or pending.timings is not None  # not urgent, but flush and close send them
            )

    def _run(self) -> None:
        last_sent = -math.inf  # the first request goes out at once: a heartbeat on start
        retry_at = 0.0
        backoff = 0.0
        deadline = math.inf
        while True:
            now = time.monotonic()
            if self._closing.is_set():
                deadline = min(deadline, now + self.config.close_timeout_s)
                if not self._has_pending() or now >= deadline:
                    break
                due = retry_at
            else:
                due = max(self._next_due(last_sent, now), retry_at)
            if due > now:
                self._wake.wait(min(due, deadline) - now)
                self._wake.clear()
                continue
            if self._send_once():
                last_sent, backoff = time.monotonic(), 0.0
            else:
                backoff = max(2 * backoff, self.config.backoff_initial_s)
                backoff = min(backoff, self.config.backoff_max_s)
                retry_at = time.monotonic() + backoff
        if self._has_pending():
            log.warning(
                "reporter closing with %d metric rows undelivered (they are in %s)",
                len(self._queue),
                self.config.metrics_path,
            )

    def _next_due(self, last_sent: float, now: float) -> float:
        with self._lock:
            rows = len(self._queue)
            other = self._pending.checkpoints or self._pending.events or self._pending.resumed
        if rows >= self.config.max_batch:
            return now
        if rows or other:
            return last_sent + min(self.config.flush_interval_s, self.config.heartbeat_s)
        return last_sent + self.config.heartbeat_s

    def _take(self) -> tuple[list[dict[str, Any]], _Pending]:
        with self._lock:
            count = min(len(self._queue), self.config.max_batch)
            rows = [self._queue.popleft() for _ in range(count)]
            taken, self._pending = self._pending, _Pending()
            self._inflight = True
            if self._dropped > self._dropped_reported:
                lost = self._dropped - self._dropped_reported
                self._dropped_reported = self._dropped
                message = (
                    f"send queue full: dropped the {lost} oldest metric rows from the queue "
                    f"(they remain in {self.config.metrics_path})"
                )
                log.warning("%s", message)
                taken.events.append({"kind": "runtime", "message": message})
        return rows, taken

    def _put_back(self, rows: list[dict[str, Any]], taken: _Pending) -> None:
        with self._lock:
            self._queue.extendleft(reversed(rows))
            while len(self._queue) > self.config.max_queue:
                self._queue.popleft()
                self._dropped += 1
            current = self._pending
            current.checkpoints[:0] = taken.checkpoints
            current.events[:0] = taken.events
            if current.resumed is None:
                current.resumed = taken.resumed
            if current.timings is None:
                current.timings = taken.timings

    def _send_once(self) -> bool:
        """One POST. True when delivered (or rejected for good), False to retry later."""
        assert self._url is not None
        rows, taken = self._take()
        body: dict[str, Any] = {
            "attempt": self.config.attempt,
            "heartbeat_at": time.time(),
            "metrics": rows,
            "checkpoints": taken.checkpoints,
            "events": taken.events,
        }
        if self.config.launch_attempt is not None:
            body["launch_attempt"] = self.config.launch_attempt
        if taken.resumed is not None:
            body["resumed_from_step"] = taken.resumed[0]
        if taken.timings is not None:
            body["timings"] = taken.timings
        headers = {"Content-Type": "application/json"}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        try:
            status, answer = self._transport.post(self._url, json.dumps(body).encode(), headers)
        except Exception:  # a custom transport failed: retry later, never kill the thread
            log.exception("report transport failed")
            status, answer = 0, b""
        try:
            return self._settle(status, answer, rows, taken)
        finally:
            with self._lock:
                self._inflight = False

    def _settle(
        self, status: int, answer: bytes, rows: list[dict[str, Any]], taken: _Pending
    ) -> bool:
        if 200 <= status < 300:
            self.sent_rows += len(rows)
            self._read_answer(answer)
            return True
        self.failed_requests += 1
        if status in _RETRYABLE:
            self._put_back(rows, taken)
            log.debug("report to %s failed (status %s); will retry", self._url, status)
            return False
        # A request the server will never accept (bad token, unknown job, bad body): drop it
        # rather than block every later row behind it. metrics.jsonl still has the rows.
        log.warning(
            "control plane rejected a report with HTTP %s: %s (dropped %d rows; they remain in %s)",
            status,
            answer[:200].decode(errors="replace"),
            len(rows),
            self.config.metrics_path,
        )
        return True

    def _read_answer(self, answer: bytes) -> None:
        try:
            data = json.loads(answer or b"{}")
        except ValueError:
            return
        if isinstance(data, dict) and data.get("cancel") is True and not self._cancel.is_set():
            log.warning("the control plane asked this job to stop (cancel)")
            self._cancel.set()


def _number(name: str, value: Any) -> float:
    """A metric value as a float (the report endpoint takes numbers only)."""
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise RuntimeSetupError(
            f"metric {name!r}={value!r} is not a number (fix: report numbers only, "
            "and send text with Reporter.event())"
        ) from exc
