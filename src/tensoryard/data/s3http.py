"""S3 GETs over the standard library: SigV4-signed requests on pooled ``http.client``
connections, for the one case the data path needs (read an object or a byte range of it).

`tensoryard.data.stores.S3Store` uses it when the credentials are static (``AWS_ACCESS_KEY_ID``
and ``AWS_SECRET_ACCESS_KEY``, with ``AWS_SESSION_TOKEN`` when set, and no profile): then the
node's fetch service starts without importing boto3 (about 0.3 s of one core, more while the
node's ranks start too) and spends less CPU per request. Every other credential source (a
profile, SSO, an instance or pod role, web identity) goes through boto3's chain, and
``TYARD_DATA_S3_CLIENT=boto3`` forces boto3 everywhere. A custom endpoint
(``endpoint_url``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``) is addressed path-style, as
S3-compatible services expect; AWS itself virtual-hosted where the bucket name allows it.
Payloads are not signed (``UNSIGNED-PAYLOAD``: a GET has none). Signatures are checked against
botocore's signer in the tests.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import os
import re
import select
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["S3Http", "S3HttpError", "static_credentials"]

_UNSIGNED = "UNSIGNED-PAYLOAD"
_DNS_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


class S3HttpError(Exception):
    """An S3 error answer, shaped like botocore's ClientError (``.response``), so one
    translation serves both clients."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.response: dict[str, Any] = {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }


def static_credentials(env: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    """(access key, secret key, session token) from the environment, or None when boto3's
    chain must find them (a profile, a role, SSO...)."""
    if env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE"):
        return None
    key, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
    if not key or not secret:
        return None
    return key, secret, env.get("AWS_SESSION_TOKEN") or None


@dataclass
class S3Http:
    """GETs of one bucket. Thread-safe (a connection per thread) and picklable; a forked or
    spawned process opens its own connections."""

    bucket: str
    region: str
    access_key: str
    secret_key: str
    token: str | None = None
    endpoint_url: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    ca_bundle: str | None = None
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def __post_init__(self) -> None:
        if self.endpoint_url:
            parts = urlsplit(self.endpoint_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"endpoint {self.endpoint_url!r} is not an http(s) URL")
            self.scheme, self.host = parts.scheme, parts.hostname
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
            self.base = parts.path.rstrip("/") + "/" + self.bucket
        else:
            self.scheme, self.port = "https", 443
            if _DNS_BUCKET.fullmatch(self.bucket):
                self.host, self.base = f"{self.bucket}.s3.{self.region}.amazonaws.com", ""
            else:
                self.host, self.base = f"s3.{self.region}.amazonaws.com", "/" + self.bucket
        default = 443 if self.scheme == "https" else 80
        self.host_header = self.host if self.port == default else f"{self.host}:{self.port}"
        self._keys: dict[str, bytes] = {}
        self._tls: ssl.SSLContext | None = None  # built once (it loads the CA bundle)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_local"]
        state["_tls"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    # -- signing ---------------------------------------------------------------------------

    def path(self, key: str) -> str:
        """The request path of ``key`` (URI-encoded once, as S3 signs it)."""
        return quote(f"{self.base}/{key}", safe="/~")

    def signed_headers(
        self, method: str, path: str, headers: Mapping[str, str], now: dt.datetime
    ) -> dict[str, str]:
        """``headers`` plus host, date, payload and (with a token) security token headers and
        the SigV4 Authorization header."""
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        out = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
        out |= {"host": self.host_header, "x-amz-content-sha256": _UNSIGNED, "x-amz-date": stamp}
        if self.token:
            out["x-amz-security-token"] = self.token
        names = sorted(out)
        canonical = "\n".join(
            [
                method,
                path,
                "",
                "".join(f"{n}:{out[n]}\n" for n in names),
                ";".join(names),
                _UNSIGNED,
            ]
        )
        scope = f"{stamp[:8]}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        signature = hmac.new(self._signing_key(stamp[:8]), to_sign.encode(), "sha256")
        out["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature.hexdigest()}"
        )
        return out

    def _signing_key(self, day: str) -> bytes:
        key = self._keys.get(day)
        if key is None:
            key = f"AWS4{self.secret_key}".encode()
            for part in (day, self.region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode(), "sha256").digest()
            self._keys = {day: key}
        return key

    # -- requests --------------------------------------------------------------------------

    def get(
        self,
        key: str,
        sink: Callable[[bytes], None],
        chunk_bytes: int,
        byte_range: tuple[int, int] | None = None,
    ) -> None:
        """Stream the object (or bytes ``[start, stop)`` of it) into ``sink``. Raises
        `S3HttpError` for an error answer and OSError or http.client.HTTPException for a
        broken connection (the connection is dropped)."""
        path = self.path(key)
        extra = (
            {} if byte_range is None else {"range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
        )
        headers = self.signed_headers("GET", path, extra, dt.datetime.now(dt.UTC))
        conn = self._connection()
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            if response.status not in (200, 206):
                raise _error(response)
            length = response.getheader("Content-Length")
            got = 0
            while chunk := response.read(chunk_bytes):
                got += len(chunk)
                sink(chunk)
            if length is not None and got != int(length):  # cut off: the connection is spent
                raise http.client.IncompleteRead(b"", int(length) - got)
            if response.will_close:
                self._drop()
        except BaseException:
            self._drop()
            raise

    def _connection(self) -> http.client.HTTPConnection:
        pid = os.getpid()
        if getattr(self._local, "pid", None) != pid:
            self._local.pid, self._local.conn = pid, None
        conn: http.client.HTTPConnection | None = self._local.conn
        if conn is not None and (conn.sock is None or _readable(conn.sock)):
            # Closed by the server while idle (or holding stray bytes): not reusable.
            self._drop()
            conn = None
        if conn is None:
            if self.scheme == "https":
                if self._tls is None:
                    self._tls = ssl.create_default_context(cafile=self.ca_bundle)
                conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.connect_timeout_s, context=self._tls
                )
            else:
                conn = http.client.HTTPConnection(
                    self.host, self.port, timeout=self.connect_timeout_s
                )
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(self.read_timeout_s)
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()


def _readable(sock: Any) -> bool:
    """True when an idle connection has something to read: the server's EOF, as a rule."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def _error(response: http.client.HTTPResponse) -> S3HttpError:
    body = response.read(64 << 10).decode("utf-8", "replace")
    code = re.search(r"<Code>([^<]*)</Code>", body)
    message = re.search(r"<Message>([^<]*)</Message>", body)
    return S3HttpError(
        response.status,
        code.group(1) if code else str(response.status),
        message.group(1) if message else (response.reason or body[:200]),
    )
