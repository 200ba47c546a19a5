"""The node's fetch service process (started by `tensoryard.data.fetchd.FetchClient`).

One process per node, cache directory and store: it builds the store (and its S3 client) once,
accepts connections from the node's ranks and workers on an abstract Unix socket, and serves
each request on a pool of ``threads``: the bytes of a range (or a whole file, hashed) written
into the file descriptor that came with the request. It answers the store's `DataError` or
`TransientError` text, never retries (the asker does), and exits ``idle_s`` after its last
connection closed, or on SIGTERM. See `tensoryard.data.fetchd` for the protocol.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tensoryard.data.fetchd import _peer_uid, _recv, _send
from tensoryard.data.stores import HdfsStore, TransientError, _hasher, open_store
from tensoryard.errors import DataError

__all__ = ["serve"]

log = logging.getLogger(__name__)


class _Service:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.root, self.options = str(spec["root"]), dict(spec["options"])
        self.idle_s = float(spec["idle_s"])
        self.pool = ThreadPoolExecutor(int(spec["threads"]), thread_name_prefix="tyard-fetchd")
        self.mutex = threading.Lock()
        self.clients = 0
        self.idle_since = time.monotonic()
        self.stopping = False
        self.counts: Counter[str] = Counter()
        self.bytes_by_key: Counter[str] = Counter()
        # Demand reads (a reader is blocked on them) go first: a prefetch (a run the reader
        # will need later) waits while any demand read is queued or running, and at most
        # `prefetch_limit` prefetches run at once, so a demand read never waits for a thread
        # and shares the store with few large GETs.
        self._gate = threading.Condition()
        self._demand = 0
        self._prefetching = 0
        self.prefetch_limit = max(1, int(spec["threads"]) // 4)
        self._store: Future[Any] = Future()
        threading.Thread(target=self._open_store, name="tyard-fetchd-store", daemon=True).start()

    def _open_store(self) -> None:
        """Build the store (and an S3 client) before the first request needs it."""
        try:
            store = open_store(self.root, self.options)
            if isinstance(store, HdfsStore):
                store.serve_in_process()  # this process never forks: one client, every thread
            warm = getattr(store, "_client_here", None)
            if warm is not None:
                warm()
        except Exception as exc:  # every request answers with it
            self._store.set_exception(exc)
            return
        self._store.set_result(store)

    def store(self) -> Any:
        # Every store serves many threads here: boto3 clients, the standard-library S3
        # client (a connection per thread), fsspec filesystems, hdfs-native in process.
        return self._store.result()

    def run(self, listener: socket.socket) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        listener.settimeout(0.2)
        log.info("serving %s (pid %d, idle exit after %.0fs)", self.root, os.getpid(), self.idle_s)
        while not self.stopping:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                with self.mutex:
                    if self.clients == 0 and time.monotonic() - self.idle_since > self.idle_s:
                        break
                continue
            if _peer_uid(conn) != os.getuid():
                conn.close()
                continue
            conn.settimeout(None)
            with self.mutex:
                self.clients += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()
        listener.close()
        log.info(
            "exiting (%s): %d requests, %d bytes",
            "stopped" if self.stopping else "idle",
            self.counts["requests"],
            self.counts["bytes"],
        )
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                try:
                    message, fds = _recv(conn, max_fds=1)
                except (OSError, ValueError):
                    return
                try:
                    with self._turn(message.get("op") == "range" and not message.get("demand")):
                        answer = self.pool.submit(self._handle, message, fds).result()
                finally:
                    for fd in fds:
                        os.close(fd)
                _send(conn, answer)
        except OSError:
            return
        finally:
            conn.close()
            with self.mutex:
                self.clients -= 1
                if self.clients == 0:
                    self.idle_since = time.monotonic()

    @contextlib.contextmanager
    def _turn(self, prefetch: bool) -> Iterator[None]:
        """Hold a prefetch until no demand read waits and a prefetch slot is free; count a
        demand read while it runs."""
        with self._gate:
            if prefetch:
                while self._demand or self._prefetching >= self.prefetch_limit:
                    self._gate.wait()
                self._prefetching += 1
            else:
                self._demand += 1
        try:
            yield
        finally:
            with self._gate:
                if prefetch:
                    self._prefetching -= 1
                else:
                    self._demand -= 1
                self._gate.notify_all()

    def _handle(self, message: Mapping[str, Any], fds: list[int]) -> dict[str, Any]:
        op = message.get("op")
        try:
            if op == "stats":
                with self.mutex:
                    return dict(self.counts) | {
                        "pid": os.getpid(),
                        "clients": self.clients,
                        "bytes_by_key": dict(self.bytes_by_key),
                    }
            if op not in ("range", "whole") or len(fds) != 1:
                return {"error": f"fetch service: bad request {op!r}", "kind": "data"}
            self._bump("requests")
            if op == "range":
                return {"bytes": self._range(message, fds[0])}
            return {"hash": self._whole(message, fds[0])}
        except TransientError as exc:
            self._bump("transient_errors")
            return {"error": str(exc), "kind": "transient"}
        except DataError as exc:
            self._bump("errors")
            return {"error": str(exc), "kind": "data"}
        except Exception as exc:  # a bug or a store's untranslated error: the asker retries
            log.exception("request %s failed", op)
            self._bump("transient_errors")
            return {"error": f"fetch service: {type(exc).__name__}: {exc}", "kind": "transient"}

    def _bump(self, name: str) -> None:
        with self.mutex:
            self.counts[name] += 1

    def _count(self, key: str, nbytes: int) -> None:
        with self.mutex:
            self.counts["bytes"] += nbytes
            self.bytes_by_key[key] += nbytes

    def _range(self, message: Mapping[str, Any], fd: int) -> int:
        key, start, stop = str(message["key"]), int(message["start"]), int(message["stop"])
        store = self.store()
        pos = start

        def sink(chunk: bytes) -> None:
            nonlocal pos
            if pos + len(chunk) > stop:
                raise TransientError(f"{store.url(key)}: range longer than asked")
            os.pwrite(fd, chunk, pos)
            pos += len(chunk)

        self._bump("range_requests")
        try:
            store.download_range(key, start, stop, sink, int(message["chunk"]))
        finally:
            self._count(key, pos - start)
        return pos - start

    def _whole(self, message: Mapping[str, Any], fd: int) -> str:
        key = str(message["key"])
        hasher = _hasher(str(message["algorithm"]), int(message["digest_size"]))
        store = self.store()
        pos = 0

        def sink(chunk: bytes) -> None:
            nonlocal pos
            hasher.update(chunk)
            os.pwrite(fd, chunk, pos)
            pos += len(chunk)

        self._bump("whole_requests")
        try:
            store.download(key, sink, int(message["chunk"]))
        finally:
            self._count(key, pos)
        os.fsync(fd)
        return str(hasher.hexdigest())


def serve(listener: socket.socket, spec: Mapping[str, Any]) -> None:
    """Run the service on a bound, listening socket until idle or SIGTERM (the launcher's)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s fetchd[%(process)d] %(levelname)s %(message)s"
    )
    _Service(spec).run(listener)
