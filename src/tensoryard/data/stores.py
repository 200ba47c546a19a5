"""Remote stores: read one object, or a byte range of it, from S3, HDFS or any fsspec URL.

Each store translates its errors: `TransientError` for what is worth retrying (connection reset,
timeout, throttling, 5xx), `DataError` naming the URL and the fix for the rest. boto3, fsspec and
hdfs-native load on a store's first use, and this module imports neither numpy nor the rest of
`tensoryard.data`: the node's fetch service (`tensoryard.data.fetchd_service`) starts with this
module and its one storage client only. `tensoryard.data.cache` re-exports these names.

The S3 backend calls boto3 directly (s3fs would pull aiobotocore, whose botocore pin fights the
installed boto3); every other protocol goes through fsspec.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tensoryard.errors import DataError

__all__ = [
    "FsspecStore",
    "HdfsStore",
    "RemoteStore",
    "S3Store",
    "TransientError",
    "WebHdfsStore",
    "open_store",
]


class TransientError(Exception):
    """A failure worth retrying (connection reset, timeout, throttling, 5xx)."""


class RemoteStore(Protocol):
    """Reads objects under one remote root. Implementations translate their errors:
    `TransientError` for retryable failures, `DataError` for permanent ones."""

    def url(self, key: str) -> str:
        """The full URL of ``key`` (for messages)."""
        ...

    def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
        """Stream the object's bytes into ``sink``."""
        ...


def _join(root: str, key: str) -> str:
    return f"{root.rstrip('/')}/{key.lstrip('/')}" if root else key


class S3Store:
    """``s3://bucket/prefix``: through `tensoryard.data.s3http` (the standard library) when the
    credentials are static environment variables, else through boto3.

    ``endpoint_url`` (or the standard ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` variables)
    points at any S3-compatible service; credentials come from the environment or boto3's usual
    chain. ``TYARD_DATA_S3_CLIENT=boto3`` uses boto3 for every request.
    """

    def __init__(
        self,
        root: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        profile_name: str | None = None,
        max_pool_connections: int = 10,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
    ) -> None:
        match = re.fullmatch(r"s3://([^/]+)/?(.*)", root)
        if not match:
            raise DataError(f"not an S3 URL: {root!r} (expected s3://bucket/prefix)")
        self.bucket, self.prefix = match.group(1), match.group(2).strip("/")
        self._options: dict[str, Any] = {
            "endpoint_url": endpoint_url,
            "region_name": region_name,
            "profile_name": profile_name,
            "max_pool_connections": max_pool_connections,
            "connect_timeout_s": connect_timeout_s,
            "read_timeout_s": read_timeout_s,
        }
        # Built on first use: a process that fetches through the node's fetch service
        # (tensoryard.data.fetchd) never imports boto3.
        self._client: Any = None
        self._pid = self._lock_pid = 0
        self._client_lock = threading.Lock()
        self._http: Any = None  # S3Http, decided on first use (False: boto3)

    @staticmethod
    def _make_client(
        *,
        endpoint_url: str | None,
        region_name: str | None,
        profile_name: str | None,
        max_pool_connections: int,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> Any:
        try:
            import boto3  # noqa: F401  (the clear error below when it is missing)
            from botocore.config import Config
            from botocore.exceptions import ProfileNotFound
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise DataError(
                "reading s3:// needs boto3 (fix: pip install 'tensoryard[data]')"
            ) from exc
        # Retries are ours (one backoff policy for every backend): botocore makes one attempt.
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max_pool_connections,
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
        )
        try:
            session = _boto3_session(profile_name, region_name)
        except ProfileNotFound as exc:
            raise DataError(f"AWS profile {profile_name!r} not found (fix: AWS_PROFILE)") from exc
        return session.client("s3", endpoint_url=endpoint_url, config=config)

    def __getstate__(self) -> dict[str, Any]:
        # boto3 clients do not pickle; DataLoader workers build their own.
        state = self.__dict__.copy()
        del state["_client"], state["_pid"], state["_client_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client, self._pid, self._lock_pid = None, 0, 0
        self._client_lock = threading.Lock()

    def wants_fetch_service(self) -> bool:
        """Whether a node's processes are better served by one fetch service than each by its
        own client: yes through boto3 (its import and model parse in every rank and worker),
        no over the standard-library client (measured: the service's hop costs more)."""
        return self._http_client() is None

    def _http_client(self) -> Any:
        """The standard-library client, or None where boto3 serves (see the class doc)."""
        if self._http is None:
            from tensoryard import envvars
            from tensoryard.data.s3http import S3Http, static_credentials

            env = os.environ
            choice = (envvars.DATA_S3_CLIENT.get(env, error=DataError) or "auto").lower()
            if choice not in ("auto", "boto3"):
                raise DataError(
                    f"{envvars.DATA_S3_CLIENT.name}={choice!r} is not a client (fix: auto or boto3)"
                )
            creds = static_credentials(env)
            options = self._options
            if choice == "boto3" or creds is None or options["profile_name"]:
                self._http = False
            else:
                endpoint = (
                    options["endpoint_url"]
                    or env.get("AWS_ENDPOINT_URL_S3")
                    or env.get("AWS_ENDPOINT_URL")
                )
                region = (
                    options["region_name"]
                    or env.get("AWS_REGION")
                    or env.get("AWS_DEFAULT_REGION")
                    or "us-east-1"
                )
                try:
                    self._http = S3Http(
                        self.bucket,
                        region,
                        *creds,
                        endpoint_url=endpoint,
                        connect_timeout_s=options["connect_timeout_s"],
                        read_timeout_s=options["read_timeout_s"],
                        ca_bundle=env.get("AWS_CA_BUNDLE") or None,
                    )
                except ValueError as exc:
                    raise DataError(
                        f"S3 endpoint {endpoint!r}: {exc} (fix: endpoint_url or "
                        "AWS_ENDPOINT_URL as http(s)://host[:port])"
                    ) from exc
        return self._http or None

    def _client_here(self) -> Any:
        # A forked DataLoader worker must not share the parent's connection pool.
        if self._pid != os.getpid():
            if self._lock_pid != os.getpid():  # a lock copied by fork may be held for good
                self._client_lock, self._lock_pid = threading.Lock(), os.getpid()
            with self._client_lock:
                if self._pid != os.getpid():
                    self._client = self._make_client(**self._options)
                    self._pid = os.getpid()
        return self._client

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{_join(self.prefix, key)}"

    def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
        http = self._http_client()
        if http is not None:
            self._http_get(http, key, sink, chunk_bytes, None)
            return
        try:
            client = self._client_here()
            body = client.get_object(Bucket=self.bucket, Key=_join(self.prefix, key))["Body"]
            for chunk in body.iter_chunks(chunk_bytes):
                sink(chunk)
        except Exception as exc:
            raise self._translate(exc, key) from exc

    def download_range(
        self, key: str, start: int, stop: int, sink: Callable[[bytes], None], chunk_bytes: int
    ) -> None:
        """Stream bytes ``[start, stop)`` of the object into ``sink`` (one ranged GET)."""
        http = self._http_client()
        if http is not None:
            self._http_get(http, key, sink, chunk_bytes, (start, stop))
            return
        try:
            client = self._client_here()
            body = client.get_object(
                Bucket=self.bucket, Key=_join(self.prefix, key), Range=f"bytes={start}-{stop - 1}"
            )["Body"]
            for chunk in body.iter_chunks(chunk_bytes):
                sink(chunk)
        except Exception as exc:
            raise self._translate(exc, key) from exc

    def _http_get(
        self,
        client: Any,
        key: str,
        sink: Callable[[bytes], None],
        chunk_bytes: int,
        byte_range: tuple[int, int] | None,
    ) -> None:
        import http.client

        from tensoryard.data.s3http import S3HttpError

        url = self.url(key)
        try:
            client.get(_join(self.prefix, key), sink, chunk_bytes, byte_range)
        except S3HttpError as exc:
            raise _translate_s3_client_error(exc, url, self.bucket) from exc
        except (ConnectionRefusedError, socket.gaierror) as exc:
            raise TransientError(
                f"{url}: cannot connect to {client.scheme}://{client.host_header}: {exc} "
                "(fix: check the endpoint URL, AWS_ENDPOINT_URL or the storage option "
                "endpoint_url, and that the service is running)"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise TransientError(f"{url}: {type(exc).__name__}: {exc}") from exc

    def _translate(self, exc: Exception, key: str) -> Exception:
        from botocore import exceptions as bex

        url = self.url(key)
        if isinstance(exc, bex.NoCredentialsError | bex.PartialCredentialsError):
            return DataError(
                f"no usable AWS credentials to read {url} (fix: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or run with an instance/pod role)"
            )
        if isinstance(exc, bex.ClientError):
            return _translate_s3_client_error(exc, url, self.bucket)
        if isinstance(exc, bex.FlexibleChecksumError):
            # S3's own transfer checksum caught corruption in transit: fetch again.
            return TransientError(f"{url}: corrupted in transit ({exc})")
        if isinstance(exc, bex.ConnectionError):
            return TransientError(
                f"{url}: {exc} (fix: check the endpoint URL, AWS_ENDPOINT_URL or the "
                "storage option endpoint_url, and that the service is running)"
            )
        if isinstance(exc, bex.HTTPClientError | bex.IncompleteReadError | OSError):
            return TransientError(f"{url}: {exc}")
        if isinstance(exc, bex.BotoCoreError):
            return DataError(f"cannot read {url}: {exc}")
        return exc


@functools.cache
def _botocore_loader() -> Any:
    """The botocore data loader shared by every S3 client of the process and its forks.

    The loader caches the parsed service models and endpoint rules; a client built with a
    fresh loader parses them again, which costs a DataLoader worker seconds of CPU while the
    node's other ranks and workers start too. A fork of a rank that built a client inherits
    the parsed models. Credentials are not shared: each session resolves its own."""
    import botocore.loaders

    return botocore.loaders.create_loader()


def _boto3_session(profile_name: str | None, region_name: str | None) -> Any:
    import boto3
    import botocore.session

    core = botocore.session.Session()
    core.register_component("data_loader", _botocore_loader())
    return boto3.session.Session(
        botocore_session=core, profile_name=profile_name, region_name=region_name
    )


_S3_TRANSIENT = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "Throttling"}


def _translate_s3_client_error(exc: Any, url: str, bucket: str) -> Exception:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in _S3_TRANSIENT or status >= 500 or status == 429:
        return TransientError(f"{url}: {code or status}")
    if code == "NoSuchBucket":
        return DataError(
            f"bucket {bucket!r} does not exist (reading {url}) (fix: check the dataset URL "
            "and, for a non-AWS service, AWS_ENDPOINT_URL)"
        )
    if code in {"NoSuchKey", "404", "NotFound"}:
        return DataError(
            f"{url} does not exist (fix: upload the whole prepared directory, "
            "manifest and every shard listed in it)"
        )
    if code in {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraint"}:
        return DataError(
            f"bucket {bucket!r} is in another region than the one asked (reading {url}: {code}) "
            "(fix: set AWS_REGION or the storage option region_name to the bucket's region)"
        )
    if code in {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}:
        return DataError(f"S3 rejected the credentials reading {url}: {code} (fix: refresh them)")
    if code in {"AccessDenied", "403", "AllAccessDisabled"}:
        return DataError(
            f"access denied reading {url} (fix: grant s3:GetObject on bucket {bucket!r})"
        )
    return DataError(f"cannot read {url}: {code or status}: {error.get('Message', exc)}")


class FsspecStore:
    """Any fsspec filesystem (``file://``, ``hdfs://``, ``gs://``…) or a plain path."""

    def __init__(self, root: str, **storage_options: Any) -> None:
        import fsspec

        try:
            self._fs, self._root = fsspec.core.url_to_fs(root, **storage_options)
        except (ImportError, ValueError) as exc:
            raise DataError(f"cannot open {root}: {exc} (fix: install its fsspec backend)") from exc
        self._display_root = root

    def url(self, key: str) -> str:
        return _join(self._display_root, key)

    def wants_fetch_service(self) -> bool:
        """Whether the node's fetch service should make this store's requests: not for local
        files (nothing to share); yes for the others (WebHDFS, cloud SDKs that are costly to
        import in every worker)."""
        protocol = self._fs.protocol
        names = {protocol} if isinstance(protocol, str) else set(protocol)
        return not names & {"file", "local"}

    def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
        self._read(key, 0, None, sink, chunk_bytes)

    def download_range(
        self, key: str, start: int, stop: int, sink: Callable[[bytes], None], chunk_bytes: int
    ) -> None:
        """Stream bytes ``[start, stop)`` of the file into ``sink``."""
        self._read(key, start, stop, sink, chunk_bytes)

    def _read(
        self,
        key: str,
        start: int,
        stop: int | None,
        sink: Callable[[bytes], None],
        chunk_bytes: int,
    ) -> None:
        try:
            with self._fs.open(_join(self._root, key), "rb") as src:
                if stop is not None and self._exact_range(src):
                    # One request for exactly [start, stop): a buffered file's read-ahead
                    # would fetch a block beyond it (WebHDFS: up to the whole file).
                    data = src._fetch_range(start, stop)
                    if data:
                        sink(data)
                    return
                if start:
                    src.seek(start)
                left = -1 if stop is None else stop - start
                while left != 0:
                    chunk = src.read(chunk_bytes if left < 0 else min(chunk_bytes, left))
                    if not chunk:
                        break
                    sink(chunk)
                    left = left - len(chunk) if left > 0 else left
        except FileNotFoundError as exc:
            raise _missing(self.url(key)) from exc
        except PermissionError as exc:
            raise _denied(self.url(key)) from exc
        except (OSError, TimeoutError) as exc:
            raise TransientError(f"{self.url(key)}: {exc}") from exc

    @staticmethod
    def _exact_range(src: Any) -> bool:
        from fsspec.spec import AbstractBufferedFile

        return isinstance(src, AbstractBufferedFile) and callable(
            getattr(src, "_fetch_range", None)
        )


class WebHdfsStore(FsspecStore):
    """``webhdfs://namenode:port/path``: HDFS over HTTP through fsspec's WebHDFS client (its
    session, authentication and proxy), each read two requests: OPEN at the NameNode, then the
    DataNode it redirects to, streamed.

    fsspec's file object asks the NameNode for the file's status before each read: three
    requests where two do (measured on a MiniDFSCluster: 142 against 88 ms for a MiB). The
    ranges the cache asks for lie inside the size the dataset's index gives, and whole files
    are read to their end, so the status is not needed.
    """

    def _read(
        self,
        key: str,
        start: int,
        stop: int | None,
        sink: Callable[[bytes], None],
        chunk_bytes: int,
    ) -> None:
        if stop is not None and stop <= start:
            return
        span: dict[str, int] = {"offset": start} if start else {}
        if stop is not None:
            span["length"] = stop - start
        what = self.url(key) if stop is None else f"bytes {start}-{stop} of {self.url(key)}"
        try:
            opened = self._fs._call("OPEN", path=_join(self._root, key), redirect=False, **span)
            location = opened.headers.get("Location")
            if location is None:  # a gateway (HttpFS) answers with the bytes itself
                reply = opened
            else:
                reply = self._fs.session.get(self._fs._apply_proxy(location), stream=True)
            with reply:
                if reply.status_code in (400, 403, 404):  # the DataNode's refusal: not transient
                    raise DataError(
                        f"cannot read {what}: HTTP {reply.status_code} {_remote_message(reply)} "
                        "(fix: the file changed after the dataset was prepared; copy the "
                        "prepared directory again)"
                    )
                reply.raise_for_status()
                for chunk in reply.iter_content(chunk_bytes):
                    if chunk:
                        sink(chunk)
        except FileNotFoundError as exc:
            raise _missing(self.url(key)) from exc
        except PermissionError as exc:
            raise _denied(self.url(key)) from exc
        except (ValueError, RuntimeError) as exc:
            # fsspec raises these for the NameNode's other refusals (a range past the end is
            # an IOException), keeping the message only: a standby NameNode, safe mode or an
            # explicit retry are worth retrying; the rest stays refused however often asked.
            if isinstance(exc, RuntimeError) and _TRANSIENT_REMOTE.search(str(exc)):
                raise TransientError(f"{self.url(key)}: {exc}") from exc
            raise DataError(
                f"cannot read {what}: {exc} (fix: the file changed after the dataset was "
                "prepared; copy the prepared directory again)"
            ) from exc
        except (OSError, TimeoutError) as exc:  # requests' errors are OSErrors
            raise TransientError(f"{self.url(key)}: {exc}") from exc


# Messages of the NameNode's refusals that pass: a standby in an HA pair, safe mode at start-up,
# RetriableException ("... try again").
_TRANSIENT_REMOTE = re.compile(r"standby|safe ?mode|retr(y|iable)|try again", re.IGNORECASE)


def _remote_message(reply: Any) -> str:
    """The message of a WebHDFS error reply (``{"RemoteException": {...}}``), else its text."""
    try:
        return str(reply.json()["RemoteException"]["message"])
    except (ValueError, KeyError, TypeError):
        return " ".join(reply.text.split())[:200]


def _missing(url: str) -> DataError:
    return DataError(f"{url} does not exist (fix: copy the whole prepared directory)")


def _denied(url: str, detail: object = "") -> DataError:
    return DataError(f"permission denied reading {url}" + (f": {detail}" if detail else ""))


class HdfsStore(FsspecStore):
    """``hdfs://namenode:port/path`` through hdfs-native (a native HDFS RPC client; no JVM).

    hdfs-native runs its I/O on a process-wide runtime whose threads do not survive ``fork``:
    in a forked child (a DataLoader worker) any call into it, even the garbage collection of an
    object inherited from the parent, blocks for good. So no training process loads it: every
    process reads through its own helper interpreter (`tensoryard.data._hdfs_helper`, started on
    first use, bytes over a pipe), and forking stays safe. Before its first read a process
    opens a plain TCP connection to the NameNode with a timeout: an unreachable NameNode is a
    transient error (retried with our backoff), then a DataError naming the URL and what to
    check (hdfs-native itself keeps retrying a refused connection for minutes).
    ``webhdfs://`` URLs go through fsspec's WebHDFS client instead (`WebHdfsStore`); see
    docs/data.md for why hdfs-native is the default.
    """

    def __init__(self, root: str, *, connect_timeout_s: float = 5.0) -> None:
        import importlib.util

        if importlib.util.find_spec("hdfs_native") is None:
            raise DataError(
                f"reading {root} needs hdfs-native (fix: pip install 'tensoryard[data]')"
            )
        match = re.fullmatch(r"(hdfs|viewfs)://([^/:]+)(?::(\d+))?(/.*)?", root.rstrip("/"))
        if not match:
            raise DataError(f"not an HDFS URL: {root!r} (expected hdfs://namenode:port/path)")
        self._namenode = (match.group(2), int(match.group(3) or 8020))
        self._connect_timeout_s = connect_timeout_s
        self._display_root = root
        self._root = match.group(4) or "/"
        self._probed_pid = 0
        self._helper: subprocess.Popen[bytes] | None = None
        self._helper_lock = threading.Lock()
        self._direct: Any = None  # an hdfs-native Client, in a process that never forks

    def wants_fetch_service(self) -> bool:
        """Yes: without the service every process reads through a helper interpreter of its
        own (measured: first batch 0.9 s with the service against 3.7 s without)."""
        return True

    def serve_in_process(self) -> None:
        """Read through hdfs-native in this process, one client for every thread, instead of
        through a helper interpreter: for a process that never forks after this call and never
        loaded hdfs-native before a fork (the node's fetch service). One client serves many
        requests at once, where the helper serves one; and no interpreter starts per thread."""
        if self._direct is None:
            from hdfs_native import Client

            host, port = self._namenode
            scheme = self._display_root.split("://", 1)[0]
            self._direct = Client(f"{scheme}://{host}:{port}")

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_helper"] = state["_direct"] = None
        del state["_helper_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._helper_lock = threading.Lock()

    def _probe(self) -> None:
        if self._probed_pid == os.getpid():
            return
        host, port = self._namenode
        try:
            with socket.create_connection((host, port), timeout=self._connect_timeout_s):
                pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise TransientError(
                f"cannot connect to the HDFS NameNode at {host}:{port} ({reason}; fix: check "
                "the host and the NameNode RPC port in the URL, often 8020 or 9000, and that "
                "the NameNode is running)"
            ) from exc
        self._probed_pid = os.getpid()

    def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
        self._probe()
        if self._direct is not None:
            self._download_direct(key, sink, None)
            return
        # One helper per process, one request at a time (the download threads share it).
        with self._helper_lock:
            self._download_via_helper(key, sink)

    def download_range(
        self, key: str, start: int, stop: int, sink: Callable[[bytes], None], chunk_bytes: int
    ) -> None:
        """Stream bytes ``[start, stop)`` of the file into ``sink`` (through the helper)."""
        self._probe()
        if self._direct is not None:
            self._download_direct(key, sink, (start, stop))
            return
        with self._helper_lock:
            self._download_via_helper(key, sink, f"\t{start}\t{stop}")

    def _download_direct(
        self, key: str, sink: Callable[[bytes], None], span: tuple[int, int] | None
    ) -> None:
        try:
            reader = self._direct.read(_join(self._root, key))
            start, stop = span if span is not None else (0, len(reader))
            for chunk in reader.read_range_stream(start, stop - start):
                sink(chunk)
        except FileNotFoundError as exc:
            raise _missing(self.url(key)) from exc
        except PermissionError as exc:
            raise _denied(self.url(key), exc) from exc
        except (DataError, TransientError):
            raise
        except Exception as exc:  # every other failure of the client is worth a retry
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise TransientError(f"{self.url(key)}: {type(exc).__name__}: {first}") from exc

    def _helper_here(self) -> subprocess.Popen[bytes]:
        helper = self._helper
        if helper is None or helper.poll() is not None or helper.pid_owner != os.getpid():  # type: ignore[attr-defined]
            helper = subprocess.Popen(
                [sys.executable, "-m", "tensoryard.data._hdfs_helper", self._display_root],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            helper.pid_owner = os.getpid()  # type: ignore[attr-defined]
            self._helper = helper
        return helper

    def _download_via_helper(self, key: str, sink: Callable[[bytes], None], span: str = "") -> None:
        helper = self._helper_here()
        assert helper.stdin is not None and helper.stdout is not None
        try:
            helper.stdin.write(f"{_join(self._root, key)}{span}\n".encode())
            helper.stdin.flush()
            while True:
                header = helper.stdout.read(8)
                if len(header) < 8:
                    raise OSError("the HDFS helper process exited")
                (n,) = struct.unpack("<q", header)
                if n == 0:
                    return
                body = helper.stdout.read(abs(n))
                if n > 0:
                    sink(body)
                    continue
                kind, _, message = body.decode(errors="replace").partition(" ")
                if kind == "missing":
                    raise _missing(self.url(key))
                if kind == "denied":
                    raise _denied(self.url(key), message)
                raise TransientError(f"{self.url(key)}: {message}")
        except OSError as exc:
            self._helper = None
            with contextlib.suppress(OSError):
                helper.kill()
            raise TransientError(f"{self.url(key)}: {exc}") from exc


def open_store(root: str, storage_options: Mapping[str, Any] | None = None) -> RemoteStore:
    """The store for ``root``: boto3 for ``s3://``, hdfs-native for ``hdfs://``, fsspec for
    everything else (``webhdfs://``, ``gs://``, ``file://``...)."""
    options = dict(storage_options or {})
    if root.startswith(("s3://", "s3a://")):
        return S3Store("s3://" + root.split("://", 1)[1], **options)
    if root.startswith(("hdfs://", "viewfs://")):
        return HdfsStore(root, **options)
    if root.startswith(("webhdfs://", "swebhdfs://")):
        return WebHdfsStore(root, **options)
    return FsspecStore(root, **options)


def _hasher(algorithm: str, digest_size: int) -> Any:
    """hashlib object for a manifest digest; BLAKE2 digests carry their size in their length."""
    if algorithm == "blake2b":
        return hashlib.blake2b(digest_size=digest_size)
    if algorithm == "blake2s":
        return hashlib.blake2s(digest_size=digest_size)
    return hashlib.new(algorithm)
