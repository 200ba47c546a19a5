"""A real local HTTP server that records what jobs report, for testing training scripts.

It speaks the job side of ``POST /api/v1/jobs/{id}/report`` (docs/contracts.md, section 2)
without the control plane: every body is kept in `requests`, the answer is
``{"ok": true, "cancel": <cancel>}``, and `fail_with` makes it answer an error status, so
tests can watch batching, retries and cancellation over real sockets::

    with RecordingReportServer() as server:
        env["TYARD_SERVER_URL"] = server.url
        ...
        rows = server.metric_rows()
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["RecordedRequest", "RecordingReportServer"]


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    authorization: str | None
    body: dict[str, Any]


@dataclass
class _State:
    requests: list[RecordedRequest] = field(default_factory=list)
    cancel: bool = False
    fail_with: int | None = None
    delay_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True  # restart on the same port right after a stop
    daemon_threads = True


class RecordingReportServer:
    """Records report requests on 127.0.0.1; `port=0` picks a free port."""

    def __init__(self, port: int = 0) -> None:
        self._state = _State()
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> RecordingReportServer:
        """Listen (again, on the same port after a stop)."""
        state = self._state

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with state.lock:
                    delay = state.delay_s
                if delay:
                    time.sleep(delay)
                with state.lock:
                    status = state.fail_with
                    if status is None:
                        state.requests.append(
                            RecordedRequest(
                                self.path, self.headers.get("Authorization"), json.loads(raw)
                            )
                        )
                    answer = {"ok": status is None, "cancel": state.cancel}
                payload = json.dumps(answer).encode()
                self.send_response(status or 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        self._server = _Server(("127.0.0.1", self._port), Handler)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening; connections are refused until `start` is called again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> RecordingReportServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- knobs and records ----------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def set_cancel(self, cancel: bool) -> None:
        with self._state.lock:
            self._state.cancel = cancel

    def fail_with(self, status: int | None) -> None:
        """Answer every request with this HTTP status (None: answer 200 again)."""
        with self._state.lock:
            self._state.fail_with = status

    def set_delay(self, seconds: float) -> None:
        """Take this long before recording and answering each request (a slow control plane)."""
        with self._state.lock:
            self._state.delay_s = seconds

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._state.lock:
            return list(self._state.requests)

    def metric_rows(self) -> list[dict[str, Any]]:
        """Every metric row received, in arrival order."""
        return [row for req in self.requests for row in req.body.get("metrics", [])]
