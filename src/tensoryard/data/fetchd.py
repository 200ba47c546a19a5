"""The node's fetch service: one process per node, cache directory and store that makes every
request to remote storage on behalf of the node's ranks and DataLoader workers.

::

    rank or worker (FileCache)                 fetch service (one per node, cache dir, store)
    claims its units (fcntl on the unit map)   one storage client, a pool of `threads`:
    sends (key, byte range) and the file's  -> writes the bytes into that file at their
      descriptor (SCM_RIGHTS)                    offsets (a whole file: hashes it as well)
    marks the map, verifies, renames        <- answers the bytes written, or the error text

So without the service a process would build its own storage client (boto3's import and model
parse: seconds under load) before its first request; with it, only the service does, once per
node. The locks, the unit map, the byte budget, retries and verification stay in the process
that asks (`FileCache`, the same code as without the service): the service only moves bytes
from the store into a file whose locks the asker holds. A service that cannot start, dies or
stops answering (``timeout_s``) costs one warning: the asker still holds its claims and makes
the request itself, and so does every later request of that process.

The service (`tensoryard.data.fetchd_service`) is started by the first process that needs
it (a lock file in ``<cache_dir>/.fetchd/`` makes one start at a time; the address itself lets
only one serve), detached in its own session, logging to ``<cache_dir>/.fetchd/<key>.log``.
It listens on an abstract Unix socket named by a hash of the cache directory, the store's URL
and options, the AWS/Hadoop variables that select an endpoint or identity, the user and this
package's location, and exits after ``idle_s`` with no connected process. The storage options
travel on its stdin, never on its command line. Both ends check that the other runs as the same
user (SO_PEERCRED).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from filelock import FileLock

from tensoryard import envvars
from tensoryard.errors import DataError

__all__ = ["SERVICE_DIR", "FetchClient", "service_address", "service_key", "stop_services"]

log = logging.getLogger(__name__)

SERVICE_DIR = ".fetchd"
_ADDRESS_PREFIX = b"\0tyard-fetchd-"
_ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "HADOOP_CONF_DIR",
    envvars.DATA_S3_CLIENT.name,
)
_HEADER = struct.Struct("<I")
_PEERCRED = struct.Struct("3i")

# The launcher binds the address before anything else (stdlib only, so it listens within
# milliseconds of its start), then forks: its parent exits at once and is reaped by the
# process that started it, the child imports tensoryard and serves.
_LAUNCHER = """
import json, os, socket, sys
spec = sys.stdin.read()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.bind(bytes.fromhex(sys.argv[1]))
except OSError as exc:
    print(f"fetch service {sys.argv[2]}: another one serves ({exc})", flush=True)
    sys.exit(0)
s.listen(1024)
if os.fork():
    os._exit(0)
from tensoryard.data.fetchd_service import serve
serve(s, json.loads(spec))
"""


def service_key(cache_dir: Path, root: str, options: Mapping[str, Any]) -> str:
    """The name of the service for this cache directory, store and identity."""
    ident = [
        os.path.realpath(cache_dir),
        root,
        dict(options),
        [os.environ.get(k) for k in _ENV_KEYS],
        os.getuid(),
        str(Path(__file__).resolve().parent),
    ]
    text = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def service_address(key: str) -> bytes:
    """The abstract Unix socket address of service ``key`` (no file, no 108-byte path limit)."""
    return _ADDRESS_PREFIX + key.encode()


# ---------------------------------------------------------------------------------------------
# Wire format: a little-endian u32 length, then JSON; a file descriptor rides on a request.


def _send(sock: socket.socket, message: Mapping[str, Any], fd: int | None = None) -> None:
    body = json.dumps(message).encode()
    frame = _HEADER.pack(len(body)) + body
    sent = socket.send_fds(sock, [frame], [fd]) if fd is not None else 0
    sock.sendall(frame[sent:])


def _recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    buf, fds = b"", []
    while len(buf) < _HEADER.size or len(buf) < _HEADER.size + _HEADER.unpack_from(buf)[0]:
        if max_fds:
            data, got, _, _ = socket.recv_fds(sock, 1 << 16, max_fds)
            fds += got
        else:
            data = sock.recv(1 << 16)
        if not data:
            for fd in fds:
                os.close(fd)
            raise ConnectionError("the connection closed")
        buf += data
    return json.loads(buf[_HEADER.size :]), fds


def _peer_uid(sock: socket.socket) -> int:
    _, uid, _ = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return int(uid)


# ---------------------------------------------------------------------------------------------
# The client: one per FileCache, its connections per process


class FetchClient:
    """A process's handle on the node's fetch service for one cache directory and store.

    ``download_range`` and ``download`` return None when the service is not available (it
    could not start, died, or did not answer within ``timeout_s``): the caller then fetches
    itself, as do all later calls of this process (one warning). Errors of the store come back
    as the `DataError` or `TransientError` the store raised in the service. Picklable; after a
    fork or in a spawned DataLoader worker it opens its own connections."""

    def __init__(
        self,
        root: str,
        options: Mapping[str, Any],
        cache_dir: Path,
        *,
        idle_s: float = 60.0,
        timeout_s: float = 120.0,
        threads: int = 16,
    ) -> None:
        self.root, self.options = root, dict(options)
        self.cache_dir = Path(cache_dir)
        self.idle_s, self.timeout_s, self.threads = idle_s, timeout_s, threads
        self.key = service_key(self.cache_dir, root, self.options)
        self._init_process()

    def _init_process(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._ready: Future[str | None] | None = None
        self._failed: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        keep = ("root", "options", "cache_dir", "idle_s", "timeout_s", "threads", "key")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process()

    def _here(self) -> None:
        if self._pid != os.getpid():
            self._init_process()  # the parent's sockets and start thread are not ours

    @property
    def log_path(self) -> Path:
        return self.cache_dir / SERVICE_DIR / f"{self.key}.log"

    @property
    def available(self) -> bool:
        """False once this process has given up on the service."""
        self._here()
        return self._failed is None

    # -- start ----------------------------------------------------------------------------------

    def start_soon(self) -> None:
        """Connect to the service, starting it if none runs, in a background thread."""
        self._here()
        with self._lock:
            if self._ready is not None:
                return
            ready: Future[str | None] = Future()
            self._ready = ready
        threading.Thread(
            target=self._start, args=(ready,), name="tyard-fetchd-start", daemon=True
        ).start()

    def _start(self, ready: Future[str | None]) -> None:
        try:
            sock = self._connect_or_start()
        except Exception as exc:  # reported as the reason of the fallback
            ready.set_result(f"{type(exc).__name__}: {exc}")
            return
        self._checkin(sock)
        ready.set_result(None)

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout_s)
            sock.connect(service_address(self.key))
        except OSError:
            sock.close()
            return None
        if _peer_uid(sock) != os.getuid():
            sock.close()
            raise PermissionError("the fetch service's address is held by another user")
        return sock

    def _connect_or_start(self) -> socket.socket:
        sock = self._connect()
        if sock is not None:
            return sock
        folder = self.cache_dir / SERVICE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder / f"{self.key}.lock"), timeout=self.timeout_s):
            sock = self._connect()  # another process may have started it meanwhile
            if sock is None:
                self._spawn()
                sock = self._connect()
            if sock is None:
                raise OSError(f"the fetch service did not start (see {self.log_path})")
            return sock

    def _spawn(self) -> None:
        spec = {
            "root": self.root,
            "options": self.options,
            "cache_dir": str(self.cache_dir),
            "idle_s": self.idle_s,
            "threads": self.threads,
            "key": self.key,
        }
        package_parent = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH", "")
        env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (package_parent, path) if p)}
        argv = [sys.executable, "-c", _LAUNCHER, service_address(self.key).hex(), self.key]
        with open(self.log_path, "ab") as out:
            launcher = subprocess.Popen(
                [*argv, str(self.cache_dir)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
                env=env,
                cwd=self.cache_dir,
                start_new_session=True,
            )
        assert launcher.stdin is not None
        try:
            launcher.stdin.write(json.dumps(spec).encode())
            launcher.stdin.close()
            launcher.wait(timeout=self.timeout_s)  # returns once the service listens
        except (OSError, subprocess.TimeoutExpired):
            launcher.kill()
            launcher.wait()
            raise

    # -- requests -------------------------------------------------------------------------------

    def _checkin(self, sock: socket.socket) -> None:
        with self._lock:
            self._idle.append(sock)

    def _checkout(self) -> socket.socket:
        self.start_soon()
        assert self._ready is not None
        reason = self._ready.result(timeout=self.timeout_s)
        if reason is not None:
            raise OSError(reason)
        with self._lock:
            if self._idle:
                return self._idle.pop()
        if self._failed is not None:  # another thread gave up meanwhile
            raise OSError(self._failed)
        # A new connection; the service may have exited while this process held none.
        return self._connect_or_start()

    def _give_up(self, reason: str) -> None:
        with self._lock:
            if self._failed is not None:
                return
            self._failed = reason
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
        log.warning(
            "the node's fetch service for %s (cache %s) is not available (%s): this process "
            "fetches for itself from now on (log: %s)",
            self.root,
            self.cache_dir,
            reason,
            self.log_path,
        )

    def request(self, message: Mapping[str, Any], fd: int | None = None) -> dict[str, Any] | None:
        """The service's answer, or None when it is not available (and will not be asked
        again by this process)."""
        self._here()
        if self._failed is not None:
            return None
        sock = None
        try:
            sock = self._checkout()
            sock.settimeout(self.timeout_s)
            _send(sock, message, fd)
            answer, _ = _recv(sock)
        except (OSError, ValueError) as exc:
            if sock is not None:
                sock.close()
            self._give_up(str(exc) or type(exc).__name__)
            return None
        self._checkin(sock)
        return answer

    def download_range(
        self, key: str, start: int, stop: int, fd: int, chunk: int, *, demand: bool = True
    ) -> int | None:
        """Have the service write bytes ``[start, stop)`` of ``key`` into ``fd`` at their
        offsets; the number of bytes written, or None (fetch it yourself). A prefetch
        (``demand=False``) waits in the service while any reader's demand read is pending."""
        message = {
            "op": "range",
            "key": key,
            "start": start,
            "stop": stop,
            "chunk": chunk,
            "demand": demand,
        }
        answer = self.request(message, fd)
        return None if answer is None else int(_raise_for(answer)["bytes"])

    def download(
        self, key: str, fd: int, algorithm: str, digest_size: int, chunk: int
    ) -> str | None:
        """Have the service write the whole of ``key`` into ``fd`` (an empty file) from offset
        0 and fsync it; its hex digest, or None (fetch it yourself)."""
        message = {"op": "whole", "key": key, "algorithm": algorithm}
        answer = self.request(message | {"digest_size": digest_size, "chunk": chunk}, fd)
        return None if answer is None else str(_raise_for(answer)["hash"])

    def close(self) -> None:
        """Close this process's idle connections (a later request opens a new one)."""
        self._here()
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def stats(self) -> dict[str, Any] | None:
        """The service's counters (its pid, requests and bytes per key), or None."""
        return self.request({"op": "stats"})


def _raise_for(answer: dict[str, Any]) -> dict[str, Any]:
    if "error" not in answer:
        return answer
    from tensoryard.data.stores import TransientError

    if answer.get("kind") == "transient":
        raise TransientError(str(answer["error"]))
    raise DataError(str(answer["error"]))


def stop_services(cache_dir: Path) -> list[int]:
    """Ask every fetch service of this user serving ``cache_dir`` to exit (SIGTERM); their
    pids. For node clean-up and tests; a service exits by itself when idle."""
    stopped = []
    for lock in sorted((Path(cache_dir) / SERVICE_DIR).glob("*.lock")):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.closing(sock):
            try:
                sock.connect(service_address(lock.stem))
            except OSError:
                continue
            if _peer_uid(sock) != os.getuid():
                continue
            try:  # the socket's credentials name the launcher, which has exited: ask
                sock.settimeout(10)
                _send(sock, {"op": "stats"})
                pid = int(_recv(sock)[0]["pid"])
            except (OSError, ValueError, KeyError):
                continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
    return stopped
