"""Where artifact bytes live: a tiny key -> bytes interface over fsspec (local default) or S3.

Keys are relative POSIX paths (``chunks/ab/ab12...``). Every ``put`` is atomic: a reader sees the
old object, the new object or no object, never half of one (local files are written to a
temporary name and renamed; an S3 PUT is atomic by itself). The S3 backend calls boto3
directly, as the data cache does (s3fs would pull aiobotocore, whose botocore pin fights the
installed boto3); every other protocol goes through fsspec.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from tensoryard.errors import DataError

__all__ = ["BlobInfo", "BlobStore", "FsspecBlobs", "S3Blobs", "open_blobs", "syncfs"]


@dataclass(frozen=True)
class BlobInfo:
    """One stored object: its key, size and last-modified time (UTC)."""

    key: str
    size: int
    modified: datetime


class BlobStore(Protocol):
    """The few operations the artifact store needs from a storage backend."""

    url: str

    def put(self, key: str, data: bytes | memoryview) -> None: ...

    def get(self, key: str) -> bytes: ...

    def info(self, key: str) -> BlobInfo | None: ...

    def list(self, prefix: str) -> Iterator[BlobInfo]: ...

    def delete(self, key: str) -> None: ...

    def sync(self) -> None:
        """Make every ``put`` that returned so far durable (survive a power loss)."""
        ...


def syncfs(path: str) -> None:
    """Flush the filesystem holding ``path`` (Linux syncfs: one call for every file written,
    instead of an fsync per chunk); elsewhere, a global sync."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syncfs(fd) == 0:
                return
        except (OSError, AttributeError):
            pass
        os.sync()
    finally:
        os.close(fd)


def _start_writeback() -> Any:
    """Linux ``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)``: start writing a file's dirty
    pages to disk now, without waiting. None where it does not exist."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _start_writeback()
_SYNC_FILE_RANGE_WRITE = 2


def open_blobs(url: str, **s3_options: Any) -> BlobStore:
    """A store for ``url``: ``s3://bucket/prefix`` (boto3), else any fsspec URL or local path."""
    if url.startswith("s3://"):
        return S3Blobs(url, **s3_options)
    return FsspecBlobs(url)


class FsspecBlobs:
    """Blobs under a root of any fsspec filesystem (a local directory by default)."""

    def __init__(self, url: str) -> None:
        import fsspec

        self.url = url
        try:
            self.fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:
            raise DataError(
                f"cannot open artifact store {url!r}: {exc} (fix: use a local directory, "
                "s3://bucket/prefix, or install the fsspec backend for that protocol)"
            ) from exc
        self.root = str(root).rstrip("/")
        self.local = "file" in _protocols(self.fs)
        self._dirs: set[str] = set()  # local directories known to exist (put makes them once)
        try:
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise DataError(
                f"cannot create artifact store directory {self.root}: {exc} "
                "(fix: choose a writable path, e.g. --store /path/to/artifacts)"
            ) from exc

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        try:
            if self.local:
                self._put_local(path, data)
            else:
                self.fs.pipe_file(path, bytes(data))
        except OSError as exc:
            raise DataError(
                f"cannot write {key} to artifact store {self.url}: {exc} "
                "(fix: check free space and permissions; a retried upload resumes)"
            ) from exc

    def _put_local(self, path: str, data: bytes | memoryview) -> None:
        parent = os.path.dirname(path)
        if parent not in self._dirs:
            os.makedirs(parent, exist_ok=True)
            self._dirs.add(parent)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileNotFoundError:  # the directory went away since (the store was emptied)
            os.makedirs(parent, exist_ok=True)
            fd = os.open(tmp, flags, 0o644)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view) :]
            if _SYNC_FILE_RANGE is not None:
                # Start the disk write now, so that the one flush at the end of an upload
                # (sync) finds little left to do: writeback overlaps chunking and hashing.
                _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)

    def sync(self) -> None:
        if not self.local:
            return  # remote filesystems acknowledge a write once it is stored
        try:
            syncfs(self.root)
        except OSError as exc:
            raise DataError(
                f"cannot flush artifact store {self.url} to disk: {exc} "
                "(fix: check the disk; a retried upload resumes)"
            ) from exc

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.fs.cat_file(self._path(key)))
        except FileNotFoundError as exc:
            raise DataError(f"{key} is missing from artifact store {self.url}") from exc
        except OSError as exc:
            raise DataError(f"cannot read {key} from artifact store {self.url}: {exc}") from exc

    def info(self, key: str) -> BlobInfo | None:
        if self.local:
            try:
                st = os.stat(self._path(key))
            except FileNotFoundError:
                return None
            return BlobInfo(
                key=key, size=st.st_size, modified=datetime.fromtimestamp(st.st_mtime, UTC)
            )
        try:
            raw = self.fs.info(self._path(key))
        except FileNotFoundError:
            return None
        return self._blob_info(key, raw)

    def list(self, prefix: str) -> Iterator[BlobInfo]:
        base = self._path(prefix).rstrip("/")
        if not self.fs.exists(base):
            return
        for path, raw in self.fs.find(base, detail=True).items():
            if ".tmp-" in path:
                continue
            key = str(path)[len(self.root) + 1 :] if str(path).startswith(self.root) else path
            yield self._blob_info(key.lstrip("/"), raw)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(key))

    @staticmethod
    def _blob_info(key: str, raw: dict[str, Any]) -> BlobInfo:
        mtime = raw.get("mtime") or raw.get("LastModified") or raw.get("created") or 0
        modified = (
            mtime if isinstance(mtime, datetime) else datetime.fromtimestamp(float(mtime), UTC)
        )
        return BlobInfo(key=key, size=int(raw.get("size") or 0), modified=modified)


class S3Blobs:
    """Blobs under ``s3://bucket/prefix`` through boto3 (any S3-compatible endpoint)."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        max_pool_connections: int = 32,
    ) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise DataError(
                "an s3:// artifact store needs boto3 (fix: pip install 'tensoryard[data]')"
            ) from exc
        self.url = url
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise DataError(f"{url!r} names no bucket (fix: use s3://BUCKET/PREFIX)")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or None
        self.client = boto3.session.Session(region_name=region_name).client(
            "s3",
            endpoint_url=endpoint,
            config=Config(max_pool_connections=max_pool_connections),
        )
        self._errors = _botocore_errors()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def sync(self) -> None:
        """Nothing to do: S3 acknowledges a PUT once the object is stored durably."""

    def put(self, key: str, data: bytes | memoryview) -> None:
        try:
            body = data if isinstance(data, bytes) else bytes(data)
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body)
        except self._errors as exc:
            raise DataError(
                f"cannot write {key} to {self.url}: {exc} (fix: check the bucket and "
                "credentials; a retried upload resumes)"
            ) from exc

    def get(self, key: str) -> bytes:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            return bytes(body.read())
        except self._errors as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                raise DataError(f"{key} is missing from artifact store {self.url}") from exc
            raise DataError(f"cannot read {key} from {self.url}: {exc}") from exc

    def info(self, key: str) -> BlobInfo | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except self._errors as exc:
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise DataError(f"cannot stat {key} in {self.url}: {exc}") from exc
        return BlobInfo(key, int(head["ContentLength"]), head["LastModified"].astimezone(UTC))

    def list(self, prefix: str) -> Iterator[BlobInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(prefix)
        )
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    key = str(obj["Key"])[strip:]
                    yield BlobInfo(key, int(obj["Size"]), obj["LastModified"].astimezone(UTC))
        except self._errors as exc:
            raise DataError(f"cannot list {prefix} in {self.url}: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except self._errors as exc:
            raise DataError(f"cannot delete {key} from {self.url}: {exc}") from exc


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _botocore_errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))
