"""Node-local cache for remote shards: a `ShardSource` for ``s3://`` and other fsspec URLs.

A training job reads a prepared dataset from object storage (``s3://``), HDFS, or any fsspec
protocol (a JuiceFS/GPFS mount is a plain path and needs no cache). Every rank on a node opens a
:class:`ShardCache` on the same node-local directory; the cache

* downloads ahead in the loader's announced order (``hint``): a bounded window of the next
  ``prefetch_shards`` shards, fetched by background threads;
* downloads each file once per node: ranks serialise on a per-file lock, the winner streams into
  a temporary file and renames it into place atomically, the others wait and reuse the file;
* keeps the directory under a byte budget by evicting the file whose next use lies furthest in
  the future (Belady's policy, possible because the sample order is known in advance); files the
  loader still maps are never chosen, and a prefetch never pushes out a shard needed sooner;
* verifies what it fetches before anyone reads it: a ranged unit against its digest in the
  dataset's units.bin (one per 1 MiB of each shard), a whole file against the manifest's
  content hash; a dataset without units.bin (prepared before it existed) has its ranged shards
  hashed as a whole once their last unit is in. A mismatch is fetched once more; a second one
  marks the shard bad for the node and raises :class:`~tensoryard.errors.DataError` naming its
  URL (and byte range) and both digests;
* retries transient failures (connection reset, timeout, throttling, 5xx) with exponential
  backoff and turns permanent ones (no bucket, no credentials, no object) into a DataError that
  says what to fix.

Cached files are named by content hash, so caches of several datasets can share one directory
and a file of an older dataset version is never taken for a new one. A temporary file left by a
crashed download is ignored and deleted, never resumed. Eviction only unlinks: a shard another
process has mapped stays readable until it is unmapped.

The stores (S3, HDFS, fsspec) live in `tensoryard.data.stores` and are re-exported here.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from filelock import FileLock
from filelock import Timeout as LockTimeout

from tensoryard import envvars
from tensoryard.data.fetchd import FetchClient
from tensoryard.data.format import (
    INDEX_NAME,
    MANIFEST_NAME,
    SHARDS_NAME,
    UNIT_DIGEST_BYTES,
    UNITS_NAME,
    ShardEntry,
    UnitDigests,
    doc_file_name,
    read_manifest,
    read_shard_entries,
    read_units,
    shard_file_name,
    unit_digest,
)
from tensoryard.data.stores import (
    FsspecStore,
    HdfsStore,
    RemoteStore,
    S3Store,
    TransientError,
    _hasher,
    open_store,
)
from tensoryard.errors import DataError

__all__ = [
    "CacheConfig",
    "CacheStats",
    "FileCache",
    "FsspecStore",
    "HdfsStore",
    "RemoteFile",
    "RemoteStore",
    "S3Store",
    "ShardCache",
    "TransientError",
    "open_store",
    "source_for_url",
]

log = logging.getLogger(__name__)

_LOCK_DIR = ".locks"
_RANGES_DIR = ".ranges"
_PART = ".part"
_META_DIR = ".meta"
_BUDGET_LOCK = "_budget.lock"
_TMP_MARK = ".tmp-"
_MiB = 1 << 20
_NEVER = 1 << 62  # next-use rank of a file nobody announced: evicted first


@dataclass(frozen=True)
class RemoteFile:
    """One file the cache can fetch.

    ``key`` is the path relative to the remote root (``shard-000007.tok``); ``nbytes`` and
    ``digest`` come from the manifest. ``digest`` is ``"<algorithm>:<hex>"`` with any hashlib
    algorithm (``blake2b:…``, ``sha256:…``); a bare hex string means sha256. ``unit_digests``
    (from units.bin: 16 bytes per ``unit_bytes`` block, in file order) lets ranged reads verify
    each unit before it is used; None: only the whole file's hash is checked.
    """

    key: str
    nbytes: int
    digest: str
    unit_digests: bytes | None = field(default=None, compare=False, repr=False)
    unit_bytes: int = field(default=0, compare=False, repr=False)

    @property
    def algorithm(self) -> str:
        return self.digest.split(":", 1)[0] if ":" in self.digest else "sha256"

    @property
    def hexdigest(self) -> str:
        return self.digest.split(":", 1)[1] if ":" in self.digest else self.digest

    @property
    def local_name(self) -> str:
        """Content-addressed file name inside the cache directory."""
        base = re.sub(r"[^A-Za-z0-9._-]", "_", self.key.rsplit("/", 1)[-1])
        return f"{self.hexdigest[:24]}-{base}"


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """How a node-local shard cache behaves."""

    cache_dir: Path
    """Node-local directory shared by all ranks of the node (created if missing)."""
    max_bytes: int = 64 << 30
    """Byte budget of the directory; must hold at least two of the largest shards."""
    prefetch_shards: int = 8
    """How many upcoming shards to download ahead of the reader."""
    download_threads: int = 2
    """Background download threads per process."""
    retries: int = 4
    """Extra attempts after a transient failure (connection reset, 5xx, throttling)."""
    backoff_s: float = 0.25
    """First retry delay; doubled after each failure."""
    backoff_max_s: float = 15.0
    """Upper bound of one retry delay."""
    lock_timeout_s: float = 3600.0
    """How long a rank waits for another rank's download of the same file."""
    chunk_bytes: int = 8 * _MiB
    """Read size while streaming a download to disk."""
    range_bytes: int = 1 * _MiB
    """Unit in which token shards are fetched and tracked when the store reads byte ranges
    (S3, HDFS, WebHDFS, fsspec): a read waits only for the units that hold its samples. With
    the dataset's units.bin (1 MiB digests) and a multiple of its unit size, each unit is
    verified before any reader may use it; otherwise (a dataset prepared without units.bin, or
    another size: logged once) the shard's whole content hash is checked once its last unit is
    in. 0: whole files only."""
    prefetch_get_bytes: int = 16 * _MiB
    """Largest request of a prefetch: consecutive missing units of a shard are fetched in one
    ranged GET of up to this many bytes."""
    metadata_max_age_s: float = 300.0
    """A manifest fetched by another process of the node less than this long ago is reused
    instead of fetched again (0: every process fetches its own)."""
    fetch_service: bool | Literal["auto"] = "auto"
    """Fetch through the node's fetch service (`tensoryard.data.fetchd`): one process per node,
    cache directory and store that holds the one storage client and makes every request, so
    ranks and DataLoader workers build no client of their own. Started by the first process
    that needs it; without it (off, or it cannot start, dies or stops answering) each process
    fetches for itself. ``"auto"`` (default): where the store's client is costly to build in
    every process (boto3's credential chain, HDFS, fsspec filesystems), not for S3 read with
    static keys over the standard library (measured faster without the extra hop). True:
    always; False: never. ``TYARD_DATA_FETCH_SERVICE`` sets it (auto, 1 or 0)."""
    fetch_service_idle_s: float = 60.0
    """The fetch service exits after this long without a connected process."""
    fetch_service_timeout_s: float = 120.0
    """How long a process waits for the fetch service to start or to answer one request
    before it fetches for itself."""
    fetch_service_threads: int = 16
    """Requests the fetch service makes to the store at once."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CacheConfig:
        """Config from ``TYARD_DATA_CACHE_DIR`` (default ``~/.cache/tensoryard/shards``),
        ``TYARD_DATA_CACHE_BYTES`` (default 64 GiB) and ``TYARD_DATA_FETCH_SERVICE`` (default
        auto)."""
        env = os.environ if env is None else env
        default_dir = Path.home() / ".cache" / "tensoryard" / "shards"
        size_name, dir_name = envvars.DATA_CACHE_BYTES.name, envvars.DATA_CACHE_DIR.name
        raw = env.get(size_name, str(64 << 30))
        try:
            max_bytes = int(raw)
        except ValueError as exc:
            raise DataError(f"{size_name}={raw!r} is not an integer (fix: a byte count)") from exc
        name = envvars.DATA_FETCH_SERVICE.name
        text = (envvars.DATA_FETCH_SERVICE.get(env, error=DataError) or "auto").lower()
        service: bool | Literal["auto"]
        if text == "auto":
            service = "auto"
        elif text in ("1", "true", "yes", "on", "always"):
            service = True
        elif text in ("0", "false", "no", "off", "never"):
            service = False
        else:
            raise DataError(f"{name}={text!r} is not auto, 1 or 0 (fix: set {name} to one of them)")
        return cls(
            cache_dir=Path(env.get(dir_name, default_dir)),
            max_bytes=max_bytes,
            fetch_service=service,
        )

    def validate(self, largest_file: int) -> None:
        """Raise DataError when the config cannot work for files up to ``largest_file``."""
        if self.max_bytes < 2 * largest_file:
            raise DataError(
                f"cache budget max_bytes={self.max_bytes} is smaller than two of the largest "
                f"shard ({largest_file} bytes) (fix: raise it to at least {2 * largest_file})"
            )
        if self.range_bytes < 0 or self.prefetch_get_bytes < self.range_bytes:
            raise DataError(
                f"cache config: range_bytes={self.range_bytes} must be >= 0 (0: whole files) and "
                f"prefetch_get_bytes={self.prefetch_get_bytes} at least range_bytes"
            )
        if (
            self.fetch_service_threads < 1
            or min(self.fetch_service_idle_s, self.fetch_service_timeout_s) <= 0
        ):
            raise DataError(
                "cache config: fetch_service_threads must be >= 1, fetch_service_idle_s and "
                "fetch_service_timeout_s > 0 (or fetch_service=False to fetch in each process)"
            )
        if self.prefetch_shards < 0 or self.download_threads < 1 or self.retries < 0:
            raise DataError(
                "cache config: prefetch_shards and retries must be >= 0, download_threads >= 1"
            )


@dataclass
class CacheStats:
    """Counters of one cache instance (this process only)."""

    downloads: int = 0
    bytes_downloaded: int = 0
    hits: int = 0
    reused_from_other_rank: int = 0
    evictions: int = 0
    retries: int = 0
    checksum_mismatches: int = 0
    skipped_prefetches: int = 0
    metadata_fetches: int = 0
    """Metadata files (manifest, index, listing) this process fetched from the backend."""
    range_gets: int = 0
    """Ranged requests (one per run of consecutive units) this process made."""
    evicted: deque[str] = field(default_factory=lambda: deque(maxlen=256))
    """The most recently evicted file names (bounded)."""


# ---------------------------------------------------------------------------------------------
# The file cache: locks, budget, verification, retries


NextUse = Callable[[], Mapping[str, int]]
_T = TypeVar("_T")


class FileCache:
    """A content-addressed directory of verified remote files under a byte budget.

    Safe to share between threads and between processes on one node. ``next_use()`` ranks
    cached file names by when they are needed next (smaller is sooner, negative means in use
    now, absent means not announced) and drives eviction.
    """

    def __init__(
        self,
        store: RemoteStore,
        config: CacheConfig,
        *,
        next_use: NextUse = dict,
        sleep: Callable[[float], None] = time.sleep,
        service: FetchClient | None = None,
    ) -> None:
        self.store = store
        self.service = service
        """The node's fetch service; None (or when it fails): this process asks the store."""
        self.config = config
        self.stats = CacheStats()
        self.next_use = next_use
        self._sleep = sleep
        self._states: dict[str, _Partial] = {}
        self._states_pid = os.getpid()
        self._states_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._warned_unit_size = False
        self.dir = Path(config.cache_dir)
        self._locks = self.dir / _LOCK_DIR
        try:
            self._locks.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataError(
                f"cannot create the shard cache at {self.dir}: {exc.strerror} "
                "(fix: set TYARD_DATA_CACHE_DIR to a writable node-local directory)"
            ) from exc

    def path(self, f: RemoteFile) -> Path:
        """Where ``f`` lives in the cache (present or not)."""
        return self.dir / f.local_name

    def present(self, f: RemoteFile) -> bool:
        """Whether ``f`` is in the cache, complete."""
        # Files only appear here by rename after verification; the size check catches
        # truncation by something outside the cache.
        try:
            return self.path(f).stat().st_size == f.nbytes
        except FileNotFoundError:
            return False

    def fetch(self, f: RemoteFile, *, demand: bool = True) -> Path | None:
        """Make ``f`` present and verified. A prefetch (``demand=False``) returns None instead
        of evicting a file that is needed sooner than ``f``."""
        final = self.path(f)
        if self.present(f):
            if demand:
                self.stats.hits += 1
            return final
        lock = FileLock(str(self._locks / f"{f.local_name}.lock"), timeout=self._lock_wait())
        try:
            with lock:
                if self.present(f):
                    self.stats.reused_from_other_rank += 1
                    return final
                self._remove_stale_tmp(f)
                tmp = self._reserve(f, demand)
                if tmp is None:
                    self.stats.skipped_prefetches += 1
                    return None
                try:
                    self._download_verified(f, tmp)
                    os.replace(tmp, final)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
        except LockTimeout as exc:
            raise DataError(
                f"waited {self.config.lock_timeout_s:.0f}s for another process to download "
                f"{self.store.url(f.key)} into {self.dir} (fix: raise lock_timeout_s or look "
                "for a hung process on this node)"
            ) from exc
        return final

    def fetch_small(self, key: str, dest: Path, digest: str | None = None) -> Path:
        """Download a small metadata file to ``dest`` (atomic, with retries); verify ``digest``
        when given. Outside the budget: metadata is tiny and needed for the whole job."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{dest.name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            tmp.touch()
            got = self._download_with_retries(RemoteFile(key, -1, digest or "sha256:"), tmp)
            if digest is not None and got != RemoteFile(key, -1, digest).hexdigest:
                raise DataError(
                    f"{self.store.url(key)}: content hash {got} differs from the manifest's "
                    f"{digest} (fix: re-upload the prepared directory as a whole)"
                )
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return dest

    # -- ranged reads -------------------------------------------------------------------------

    @property
    def ranged(self) -> bool:
        """Whether token shards are fetched in ranges (the store reads byte ranges)."""
        return self.config.range_bytes > 0 and callable(getattr(self.store, "download_range", None))

    def part_path(self, f: RemoteFile) -> Path:
        """Where the partial copy of ``f`` lives while its ranges arrive."""
        return self.dir / f"{f.local_name}{_PART}"

    def _map_path(self, f: RemoteFile) -> Path:
        return self.dir / _RANGES_DIR / f"{f.local_name}.map"

    def _bad_path(self, f: RemoteFile) -> Path:
        return self.dir / _RANGES_DIR / f"{f.local_name}.bad"

    def _units(self, f: RemoteFile) -> int:
        return max(1, -(-f.nbytes // self.config.range_bytes))

    def _per_unit(self, f: RemoteFile) -> bool:
        """Whether ranged units of ``f`` are verified one by one (its units.bin digests are
        known and ``range_bytes`` is a multiple of their unit size). Otherwise the whole file
        is hashed once its last unit is in (logged once per process when only the size is
        at fault)."""
        if f.unit_digests is None or f.unit_bytes < 1:
            return False
        if self.config.range_bytes % f.unit_bytes == 0:
            return True
        if not self._warned_unit_size:
            self._warned_unit_size = True
            log.warning(
                "range_bytes=%d is not a multiple of the dataset's %d-byte checksum unit: "
                "ranged shards are verified as a whole once complete, and bytes read before "
                "that are unchecked (fix: set range_bytes to a multiple of %d)",
                self.config.range_bytes,
                f.unit_bytes,
                f.unit_bytes,
            )
        return False

    def open_partial(self, f: RemoteFile, *, demand: bool = True) -> Path | None:
        """``f``'s complete file if present, else its partial file: full size, sparse, with
        a map of which ``range_bytes`` units have arrived (created under the byte budget).
        Bytes of a partial file are valid only after `ensure_ranges` returned for them.
        A prefetch (``demand=False``) gets None instead of evicting something needed sooner."""
        self._raise_if_bad(f)
        final = self.path(f)
        if self.present(f):
            if demand:
                self.stats.hits += 1
            return final
        part = self.part_path(f)
        if self._partial_ready(f):
            return part
        lock = FileLock(str(self._locks / f"{f.local_name}.lock"), timeout=self._lock_wait())
        try:
            with lock:
                if self.present(f):
                    return final
                if self._partial_ready(f):
                    return part
                self._remove_stale_tmp(f)
                tmp = self._reserve(f, demand)
                if tmp is None:
                    self.stats.skipped_prefetches += 1
                    return None
                map_path = self._map_path(f)
                map_path.parent.mkdir(exist_ok=True)
                map_tmp = map_path.with_name(f"{map_path.name}{_TMP_MARK}{os.getpid()}")
                map_tmp.write_bytes(bytes(self._units(f)))
                os.replace(map_tmp, map_path)
                os.replace(tmp, part)
        except LockTimeout as exc:
            raise self._lock_timeout_error(f) from exc
        return part

    def _partial_ready(self, f: RemoteFile) -> bool:
        try:
            return self.part_path(f).stat().st_size == f.nbytes and self._map_path(
                f
            ).stat().st_size == self._units(f)
        except FileNotFoundError:
            return False

    def _raise_if_bad(self, f: RemoteFile) -> None:
        """Raise the error of a shard that failed verification twice on this node. The mark
        lasts ``metadata_max_age_s``: a job started later tries the (perhaps re-uploaded)
        shard again."""
        bad = self._bad_path(f)
        try:
            age = time.time() - bad.stat().st_mtime
            message = bad.read_text()
        except FileNotFoundError:
            return
        if age > self.config.metadata_max_age_s:
            with contextlib.suppress(FileNotFoundError):
                bad.unlink()
            return
        raise DataError(message)

    def _state(self, f: RemoteFile) -> _Partial | None:
        """This process's handles on ``f``'s partial file; None once ``f`` is complete."""
        if self._states_pid != os.getpid():
            self._states, self._states_pid = {}, os.getpid()
        st = self._states.get(f.local_name)
        if st is not None:
            return st
        with self._states_lock:
            st = self._states.get(f.local_name)
            if st is None:
                if self.open_partial(f) != self.part_path(f):
                    return None
                need = _VERIFIED if self._per_unit(f) else _FETCHED
                try:
                    st = _Partial(self.part_path(f), self._map_path(f), self._units(f), need)
                except FileNotFoundError:  # completed (renamed) between the two calls
                    return None
                self._states[f.local_name] = st
            return st

    def ensure_ranges(self, f: RemoteFile, spans: Sequence[tuple[int, int]]) -> None:
        """Block until bytes ``[start, stop)`` of every span are in ``f``'s local copy."""
        self.ensure_many([(f, spans)])

    def ensure_many(self, wanted: Sequence[tuple[RemoteFile, Sequence[tuple[int, int]]]]) -> None:
        """Block until bytes ``[start, stop)`` of every span of every file are local.

        Missing units are fetched now, all files at once: runs of consecutive units in one
        request each, the requests in parallel. A unit another thread or process is fetching
        is waited for, never fetched twice. Each unit is checked against its units.bin digest
        before it counts as in (`_download_units`); without digests, a file's content hash is
        verified once its last unit arrives."""
        size = self.config.range_bytes
        longest = max(1, self.config.prefetch_get_bytes // size)
        jobs: list[tuple[RemoteFile, _Partial, int, int]] = []
        touched: list[tuple[RemoteFile, _Partial]] = []
        for f, spans in wanted:
            if self.present(f):
                # Complete: this process's handles on its partial file go (closed when no
                # thread holds them any more).
                self._states.pop(f.local_name, None)
                continue
            self._raise_if_bad(f)
            st = self._state(f)
            if st is None:
                continue
            units = {k for a, b in spans if b > a for k in range(a // size, (b - 1) // size + 1)}
            missing = [k for k in sorted(units) if not st.done(k)]
            jobs += [(f, st, k, n) for k, n in _runs(missing, longest)]
            # Also when nothing is missing here: another process may have fetched the last
            # unit and not yet moved the file into place. Completing it now (under the file's
            # lock, a no-op once the other got there) keeps a caller from finding the file
            # absent and downloading it whole a second time.
            touched.append((f, st))
        if len(jobs) == 1:
            self._fetch_run(*jobs[0], blocking=True)
        elif jobs:
            pool = self._demand_pool()
            futures = [pool.submit(self._fetch_run, *job, True) for job in jobs]
            for fut in futures:
                fut.result()
        for f, st in touched:
            self._maybe_complete(f, st)
            self._raise_if_bad(f)

    def prefetch_ranges(self, f: RemoteFile) -> None:
        """Fetch every missing unit of ``f`` in file order, in requests of up to
        ``prefetch_get_bytes``; units another process is fetching are left to it."""
        if self.present(f) or self.open_partial(f, demand=False) is None:
            return
        st = self._state(f)
        if st is None:
            return
        per_get = max(1, self.config.prefetch_get_bytes // self.config.range_bytes)
        missing = [k for k in range(st.units) if not st.done(k)]
        for k, n in _runs(missing, per_get):
            if not self._fetch_run(f, st, k, n, blocking=False):
                self._fetch_free_runs(f, st, k, n)  # contended: the runs of units left free
        self._maybe_complete(f, st)

    def _fetch_free_runs(self, f: RemoteFile, st: _Partial, k: int, n: int) -> None:
        """Fetch the missing units of ``[k, k + n)`` that no other thread or process holds:
        each stretch of them that this thread can take, unit by unit without waiting, in one
        request (so many processes prefetching the same shard still make large GETs)."""
        j, end = k, k + n
        while j < end:
            taken = 0
            while j + taken < end and not st.done(j + taken) and self._take(st, j + taken):
                taken += 1
            if taken == 0:
                j += 1
                continue
            try:
                self._download_units(f, st, j, taken, demand=False)
            finally:
                self._release(st, j, taken)
            j += taken

    @classmethod
    def _take(cls, st: _Partial, unit: int) -> bool:
        """Claim one unit for this thread and lock it against other processes, without
        waiting; False (nothing held) when either is taken."""
        with st.cond:
            if unit in st.claimed:
                return False
            st.claimed.add(unit)
        try:
            fcntl.lockf(st.map_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, unit, os.SEEK_SET)
        except OSError:
            cls._release(st, unit, 1, locked=False)
            return False
        if st.done(unit):  # fetched by another process between the check and the lock
            cls._release(st, unit, 1)
            return False
        return True

    @staticmethod
    def _release(st: _Partial, k: int, n: int, *, locked: bool = True) -> None:
        """Give units ``[k, k + n)`` back: their map lock (when held) and this thread's claim."""
        if locked:
            fcntl.lockf(st.map_fd, fcntl.LOCK_UN, n, k, os.SEEK_SET)
        with st.cond:
            st.claimed.difference_update(range(k, k + n))
            st.cond.notify_all()

    def _demand_pool(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(8, thread_name_prefix="tyard-range")
            self._pool_pid = os.getpid()
        return self._pool

    def _fetch_run(self, f: RemoteFile, st: _Partial, k: int, n: int, blocking: bool) -> bool:
        """Fetch units ``[k, k + n)`` unless done; False when ``blocking`` is off and another
        thread or process holds one of them."""
        units = range(k, k + n)
        with st.cond:
            while any(j in st.claimed for j in units):
                if not blocking:
                    return False
                st.cond.wait()
            st.claimed.update(units)
        try:
            if not self._lock_units(f, st, k, n, blocking):
                return False
            try:
                todo = [j for j in units if not st.done(j)]
                for start, count in _runs(todo, n):
                    self._download_units(f, st, start, count, demand=blocking)
            finally:
                fcntl.lockf(st.map_fd, fcntl.LOCK_UN, n, k, os.SEEK_SET)
        finally:
            with st.cond:
                st.claimed.difference_update(units)
                st.cond.notify_all()
        return True

    def _lock_units(self, f: RemoteFile, st: _Partial, k: int, n: int, blocking: bool) -> bool:
        """Lock map bytes [k, k + n) against other processes (polling, so that the lock
        timeout holds)."""
        deadline = time.monotonic() + self._lock_wait()
        pause = 0.001
        while True:
            try:
                fcntl.lockf(st.map_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, n, k, os.SEEK_SET)
                return True
            except OSError:
                if not blocking:
                    return False
            if time.monotonic() > deadline:
                raise self._lock_timeout_error(f)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def _download_units(
        self, f: RemoteFile, st: _Partial, k: int, n: int, *, demand: bool = True
    ) -> None:
        """Fetch units ``[k, k + n)`` into the partial file (with retries), verify each of
        their digest blocks when the dataset has units.bin, then mark them in the map. A
        mismatch is fetched once more; a second one marks the file bad for the node."""
        size = self.config.range_bytes
        start, stop = k * size, min(f.nbytes, (k + n) * size)
        fetch = functools.partial(self._fetch_range, f, st, start, stop, demand)
        self._with_retries(f, fetch)
        checked = self._per_unit(f)
        if checked:
            bad = self._bad_unit(f, st, start, stop)
            if bad is not None:
                self.stats.checksum_mismatches += 1
                log.warning(
                    "checksum mismatch in %s bytes [%d, %d), fetching them again",
                    f.key,
                    start,
                    stop,
                )
                self._with_retries(f, fetch)
                bad = self._bad_unit(f, st, start, stop)
                if bad is not None:
                    self.stats.checksum_mismatches += 1
                    self._fail_unit(f, *bad)
        mark = _VERIFIED if checked else _FETCHED
        os.pwrite(st.map_fd, bytes([mark]) * n, k)
        st.mark(k, n, mark)

    def _fetch_range(
        self, f: RemoteFile, st: _Partial, start: int, stop: int, demand: bool
    ) -> None:
        """One request for bytes ``[start, stop)`` of ``f``, written at their offsets into the
        partial file (by the node's fetch service when there is one, else here)."""
        pos = start

        def sink(chunk: bytes) -> None:
            nonlocal pos
            if pos + len(chunk) > stop:
                raise TransientError(f"{self.store.url(f.key)}: range longer than asked")
            os.pwrite(st.part_fd, chunk, pos)
            pos += len(chunk)

        got = None
        if self.service is not None:
            got = self.service.download_range(
                f.key, start, stop, st.part_fd, self.config.chunk_bytes, demand=demand
            )
        if got is not None:
            pos = start + got
        else:
            self.store.download_range(f.key, start, stop, sink, self.config.chunk_bytes)  # type: ignore[attr-defined]
        if pos != stop:
            raise TransientError(f"{self.store.url(f.key)}: range [{start}, {stop}) ended at {pos}")
        self.stats.downloads += 1
        self.stats.range_gets += 1
        self.stats.bytes_downloaded += stop - start

    @staticmethod
    def _bad_unit(
        f: RemoteFile, st: _Partial, start: int, stop: int
    ) -> tuple[int, bytes, bytes] | None:
        """The first digest block of bytes ``[start, stop)`` of the partial file (read back,
        from the page cache) that differs from units.bin: (block, got, want); None if all
        match. ``start`` is a multiple of the block size."""
        assert f.unit_digests is not None
        unit = f.unit_bytes
        for d in range(start // unit, -(-stop // unit)):
            a = d * unit
            data = os.pread(st.part_fd, min(unit, f.nbytes - a), a)
            got = unit_digest(data)
            want = f.unit_digests[UNIT_DIGEST_BYTES * d : UNIT_DIGEST_BYTES * (d + 1)]
            if got != want:
                return d, got, want
        return None

    def _fail_unit(self, f: RemoteFile, d: int, got: bytes, want: bytes) -> None:
        """Mark ``f`` bad for every process of the node (as `_maybe_complete` does) after a
        unit failed verification twice, and raise its DataError."""
        a = d * f.unit_bytes
        b = min(f.nbytes, a + f.unit_bytes)
        message = (
            f"{self.store.url(f.key)} fails verification twice: bytes [{a}, {b}) (checksum "
            f"unit {d} of {f.unit_bytes} bytes) are blake2b-128:{got.hex()} when fetched, "
            f"{UNITS_NAME} says blake2b-128:{want.hex()} (fix: the remote copy is corrupt or "
            "the manifest belongs to another version of the dataset; re-upload the prepared "
            "directory)"
        )
        lock = FileLock(str(self._locks / f"{f.local_name}.lock"), timeout=self._lock_wait())
        try:
            with lock:
                bad = self._bad_path(f)
                bad.parent.mkdir(exist_ok=True)
                bad.write_text(message)
                for path in (self.part_path(f), self._map_path(f)):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                self._states.pop(f.local_name, None)
        except LockTimeout as exc:
            raise self._lock_timeout_error(f) from exc
        raise DataError(message)

    def _maybe_complete(self, f: RemoteFile, st: _Partial) -> None:
        """Once every unit is in: verify the whole shard's hash and move it into place (no
        rehash when every unit was verified against units.bin as it arrived). A mismatch is
        downloaded once more as a whole; a second one marks the file bad for every process of
        the node (their next read raises a DataError naming it)."""
        if not st.all_done():
            return
        lock = FileLock(str(self._locks / f"{f.local_name}.lock"), timeout=self._lock_wait())
        try:
            with lock:
                part = self.part_path(f)
                if self.present(f) or not part.exists() or self._bad_path(f).exists():
                    return
                verified = self._per_unit(f) and st.all_verified()
                got = f.hexdigest if verified else _hash_file(f, part)
                if got == f.hexdigest:
                    os.fsync(st.part_fd)
                    os.replace(part, self.path(f))
                    with contextlib.suppress(FileNotFoundError):
                        self._map_path(f).unlink()
                    self._states.pop(f.local_name, None)
                    return
                self.stats.checksum_mismatches += 1
                log.warning("checksum mismatch for %s, downloading it again", f.key)
                tmp = self.dir / f"{f.local_name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
                tmp.touch()
                try:
                    again = self._download_with_retries(f, tmp)
                    if again == f.hexdigest and tmp.stat().st_size == f.nbytes:
                        os.replace(tmp, self.path(f))
                        part.unlink()
                        return
                    self.stats.checksum_mismatches += 1
                    size = tmp.stat().st_size
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
                message = (
                    f"{self.store.url(f.key)} fails verification twice: the manifest says "
                    f"{f.algorithm}:{f.hexdigest} ({f.nbytes} bytes), the ranged download is "
                    f"{f.algorithm}:{got} and a whole download {f.algorithm}:{again} ({size} "
                    "bytes) (fix: the remote copy is corrupt or the manifest belongs to another "
                    "version of the dataset; re-upload the prepared directory)"
                )
                self._bad_path(f).write_text(message)
                part.unlink()
                with contextlib.suppress(FileNotFoundError):
                    self._map_path(f).unlink()
                raise DataError(message)
        except LockTimeout as exc:
            raise self._lock_timeout_error(f) from exc

    def _lock_timeout_error(self, f: RemoteFile) -> DataError:
        return DataError(
            f"waited {self.config.lock_timeout_s:.0f}s for another process to download "
            f"{self.store.url(f.key)} into {self.dir} (fix: raise lock_timeout_s or look "
            "for a hung process on this node)"
        )

    def _lock_wait(self) -> float:
        return self.config.lock_timeout_s

    def _remove_stale_tmp(self, f: RemoteFile) -> None:
        # We hold the file's lock, so any temporary file of it is from a dead download.
        for stale in self.dir.glob(f"{_glob_escape(f.local_name)}{_TMP_MARK}*"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()

    # -- downloading --------------------------------------------------------------------------

    def _download_verified(self, f: RemoteFile, tmp: Path) -> None:
        """Download with retries; a hash mismatch is downloaded once more, then an error."""
        for attempt in range(2):
            got = self._download_with_retries(f, tmp)
            size = tmp.stat().st_size
            if got == f.hexdigest and size == f.nbytes:
                return
            self.stats.checksum_mismatches += 1
            if attempt == 0:
                log.warning("checksum mismatch for %s, downloading it again", f.key)
        raise DataError(
            f"{self.store.url(f.key)} fails verification twice: the manifest says "
            f"{f.algorithm}:{f.hexdigest} ({f.nbytes} bytes), the download is "
            f"{f.algorithm}:{got} ({size} bytes) (fix: the remote copy is corrupt or the "
            "manifest belongs to another version of the dataset; re-upload the prepared directory)"
        )

    def _download_with_retries(self, f: RemoteFile, tmp: Path) -> str:
        return self._with_retries(f, lambda: self._download_once(f, tmp))

    def _with_retries(self, f: RemoteFile, attempt_once: Callable[[], _T]) -> _T:
        delay = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            try:
                return attempt_once()
            except TransientError as exc:
                if attempt == self.config.retries:
                    raise DataError(
                        f"giving up on {self.store.url(f.key)} after {attempt + 1} attempts: "
                        f"{exc} (fix: check the network and the storage service)"
                    ) from exc
                self.stats.retries += 1
                log.warning("transient error on %s (%s), retrying in %.2fs", f.key, exc, delay)
                self._sleep(delay)
                delay = min(delay * 2, self.config.backoff_max_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def _download_once(self, f: RemoteFile, tmp: Path) -> str:
        try:
            hasher = _hasher(f.algorithm, len(f.hexdigest) // 2)
        except ValueError as exc:
            raise DataError(f"hash {f.digest!r} of {f.key} uses an unknown algorithm") from exc
        got = None
        with open(tmp, "r+b") as out:
            out.truncate(0)  # here, not in the service: a late answer must never shorten it
            if self.service is not None:
                got = self.service.download(
                    f.key, out.fileno(), f.algorithm, len(f.hexdigest) // 2, self.config.chunk_bytes
                )
            if got is None:

                def sink(chunk: bytes) -> None:
                    hasher.update(chunk)
                    out.write(chunk)

                self.store.download(f.key, sink, self.config.chunk_bytes)
                out.flush()
                os.fsync(out.fileno())
        size = tmp.stat().st_size
        self.stats.downloads += 1
        self.stats.bytes_downloaded += size
        return got if got is not None else str(hasher.hexdigest())

    # -- budget -------------------------------------------------------------------------------

    def _reserve(self, f: RemoteFile, demand: bool) -> Path | None:
        """Evict until ``f`` fits, then create its temporary file at full (sparse) size so that
        reservations of other processes count it. None: a prefetch not worth the room."""
        with FileLock(str(self._locks / _BUDGET_LOCK), timeout=self._lock_wait()):
            files = self._scan()
            used = sum(files.values())
            ranks = self.next_use()
            own = ranks.get(f.local_name, _NEVER)
            victims = sorted(
                (name for name in files if _TMP_MARK not in name),
                key=lambda name: ranks.get(name.removesuffix(_PART), _NEVER),
                reverse=True,
            )
            for name in victims:
                if used + f.nbytes <= self.config.max_bytes:
                    break
                rank = ranks.get(name.removesuffix(_PART), _NEVER)
                if rank < 0 or (not demand and rank <= own):
                    # Belady: never evict a file in use, and do not let a prefetch push out
                    # something needed sooner than itself.
                    break
                with contextlib.suppress(FileNotFoundError):
                    (self.dir / name).unlink()
                if name.endswith(_PART):
                    with contextlib.suppress(FileNotFoundError):
                        (self.dir / _RANGES_DIR / f"{name.removesuffix(_PART)}.map").unlink()
                used -= files[name]
                self.stats.evictions += 1
                self.stats.evicted.append(name)
            if used + f.nbytes > self.config.max_bytes:
                if not demand:
                    return None
                log.warning("shard cache over budget to read %s: files in use fill it", f.key)
            tmp = self.dir / f"{f.local_name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as out:
                out.truncate(f.nbytes)
            return tmp

    def _scan(self) -> dict[str, int]:
        """Cached files and their sizes; stale temporary files are deleted on the way."""
        out: dict[str, int] = {}
        with os.scandir(self.dir) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                if _TMP_MARK in entry.name and self._tmp_is_stale(entry.name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    out[entry.name] = entry.stat().st_size
        return out

    def _tmp_is_stale(self, name: str) -> bool:
        """A temporary file is stale when nobody holds its file's lock."""
        owner = name.split(_TMP_MARK, 1)[0]
        probe = FileLock(str(self._locks / f"{owner}.lock"), timeout=0)
        try:
            probe.acquire()
        except LockTimeout:
            return False
        probe.release()
        return True


_FETCHED = 1
"""Map byte of a unit whose bytes are in (checked only with the whole file)."""
_VERIFIED = 2
"""Map byte of a unit whose bytes are in and match their units.bin digests."""


class _Partial:
    """One process's handles on a partial file and its unit map (one byte per unit: 0 missing,
    `_FETCHED` or `_VERIFIED`). A unit counts as done at ``need`` or above: where units are
    verified one by one, a unit only fetched (by a process that did not verify it) is fetched
    again. Other processes' progress is read from the map on demand."""

    def __init__(self, part: Path, map_path: Path, units: int, need: int = _FETCHED) -> None:
        self.map_fd = os.open(map_path, os.O_RDWR)
        try:
            self.part_fd = os.open(part, os.O_RDWR)
        except BaseException:
            os.close(self.map_fd)
            raise
        self.units = units
        self.need = need
        self.known = bytearray(units)
        self.claimed: set[int] = set()
        self.cond = threading.Condition()

    def done(self, k: int) -> bool:
        if self.known[k] >= self.need:
            return True
        got = os.pread(self.map_fd, 1, k)
        if got and got[0] >= self.need:
            self.known[k] = got[0]
            return True
        return False

    def mark(self, k: int, n: int, value: int = _FETCHED) -> None:
        self.known[k : k + n] = bytes([value]) * n

    def all_done(self) -> bool:
        if min(self.known) >= self.need:
            return True
        self.known[:] = os.pread(self.map_fd, self.units, 0).ljust(self.units, b"\0")
        return min(self.known) >= self.need

    def all_verified(self) -> bool:
        """Whether every unit's map byte says verified (after `all_done` read the map)."""
        return min(self.known) >= _VERIFIED

    def __del__(self) -> None:
        for fd in (self.map_fd, self.part_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _runs(units: Sequence[int], longest: int) -> list[tuple[int, int]]:
    """Sorted unit numbers as (first, count) runs of consecutive units, at most `longest`."""
    out: list[tuple[int, int]] = []
    for k in units:
        if out and out[-1][0] + out[-1][1] == k and out[-1][1] < longest:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((k, 1))
    return out


def _hash_file(f: RemoteFile, path: Path) -> str:
    h = _hasher(f.algorithm, len(f.hexdigest) // 2)
    with open(path, "rb") as src:
        while chunk := src.read(8 * _MiB):
            h.update(chunk)
    return str(h.hexdigest())


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


# ---------------------------------------------------------------------------------------------
# The shard source


class ShardCache:
    """`ShardSource` for a prepared dataset at a remote URL, backed by a node-local cache.

    The loader calls ``hint(upcoming)`` with the shards it will read next (first-use order),
    ``shard_path(i, name)`` when it reaches one (blocking until the file is local) and
    ``release(i)`` when it unmaps it. Picklable: each DataLoader worker gets its own threads
    and shares the directory (and the downloads) with every other process of the node.
    """

    def __init__(
        self,
        url: str,
        config: CacheConfig | None = None,
        *,
        store: RemoteStore | None = None,
        storage_options: Mapping[str, Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        fetch_service: bool | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.config = config if config is not None else CacheConfig.from_env()
        # The node's fetch service builds its own store from the URL and storage options, so
        # by default a caller's own `store` is used as given, in this process. With
        # ``fetch_service=True`` that store only serves when the service cannot.
        mine = store if store is not None else open_store(self.url, storage_options)
        mode = self.config.fetch_service
        use_service = mode is not False and (
            fetch_service if fetch_service is not None else store is None
        )
        if use_service and mode == "auto":
            wants = getattr(mine, "wants_fetch_service", None)
            use_service = bool(wants()) if callable(wants) else True
        service = None
        if use_service:
            service = FetchClient(
                self.url,
                dict(storage_options or {}),
                self.config.cache_dir,
                idle_s=self.config.fetch_service_idle_s,
                timeout_s=self.config.fetch_service_timeout_s,
                threads=self.config.fetch_service_threads,
            )
            service.start_soon()  # overlaps the service's start with the rank's own
        self.files = FileCache(
            mine,
            self.config,
            next_use=self._next_use,
            sleep=sleep,
            service=service,
        )
        url_key = hashlib.blake2b(self.url.encode(), digest_size=10).hexdigest()
        self.meta_dir = self.files.dir / _META_DIR / url_key
        self._entries: list[ShardEntry] | None = None
        self._units: UnitDigests | None = None
        self._itemsize = 0
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._meta_lock = threading.Lock()
        self._upcoming: list[int] = []
        self._positions: dict[int, list[int]] = {}
        self._cursor = 0
        self._pinned: Counter[int] = Counter()
        self._inflight: dict[int, Future[Path | None]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._demand_seen = False

    def _this_process(self) -> None:
        """After a fork (DataLoader workers), start with fresh threads and locks: the parent's
        pool threads do not exist here and its locks may have been copied while held."""
        if self._pid != os.getpid():
            self._init_runtime()

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k in ("url", "config", "meta_dir")}
        state |= {"store": self.files.store, "sleep": self.files._sleep}
        state |= {"service": self.files.service}
        state |= {"entries": self._entries, "itemsize": self._itemsize, "units": self._units}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url, self.config, self.meta_dir = state["url"], state["config"], state["meta_dir"]
        self.files = FileCache(
            state["store"],
            self.config,
            next_use=self._next_use,
            sleep=state["sleep"],
            service=state["service"],
        )
        self._entries, self._itemsize = state["entries"], state["itemsize"]
        self._units = state["units"]
        self._init_runtime()

    @property
    def stats(self) -> CacheStats:
        """Counters of this process's downloads, hits and evictions."""
        return self.files.stats

    def __repr__(self) -> str:
        return f"ShardCache({self.url!r}, cache_dir={str(self.files.dir)!r})"

    # -- ShardSource --------------------------------------------------------------------------

    def metadata_path(self, name: str) -> Path:
        """Local copy of manifest.json, index.bin, shards.json or units.bin (fetched on first
        use)."""
        self._this_process()
        self._load_metadata()
        return self.meta_dir / name

    def shard_path(self, index: int, name: str) -> Path:
        """Local path of shard ``index``'s file ``name``, downloading it now if needed."""
        self._this_process()
        f = self._file(index, name)
        # Only token files are mapped (and later released) by the loader; document offsets
        # are read once and need no pin.
        mapped = name == shard_file_name(index)
        with self._mutex:
            if mapped:
                self._pinned[index] += 1
            pos = self._next_position(index)
            if pos is not None:
                self._cursor = pos + 1
            pending = self._inflight.get(index) if mapped else None
        try:
            got = pending.result() if pending is not None else None
            if got is None and mapped and self.files.ranged and f.nbytes > 0:
                # Whole file wanted: its missing ranges, then the verified file.
                self.files.ensure_ranges(f, [(0, f.nbytes)])
            local = got if got is not None else self.files.fetch(f, demand=True)
        except BaseException:
            if mapped:
                self.release(index)
            raise
        assert local is not None  # a demand fetch always returns a path
        self._top_up()
        return local

    def partial_path(self, index: int, name: str) -> Path:
        """Like `shard_path` for a token file, without waiting for its bytes: the complete
        file or its partial copy, whose bytes are valid once `ensure_ranges` returned for
        them. Pins the shard like `shard_path` (``release`` unpins)."""
        self._this_process()
        f = self._file(index, name)
        if name != shard_file_name(index) or not self.files.ranged or f.nbytes == 0:
            return self.shard_path(index, name)
        with self._mutex:
            self._pinned[index] += 1
            pos = self._next_position(index)
            if pos is not None:
                # The cursor stays on this shard: its missing ranges are the first to prefetch.
                self._cursor = pos
        try:
            local = self.files.open_partial(f, demand=True)
        except BaseException:
            self.release(index)
            raise
        assert local is not None  # a demand open always returns a path
        self._top_up()
        return local

    def ensure_ranges(self, index: int, spans: Sequence[tuple[int, int]]) -> None:
        """Block until bytes ``[start, stop)`` of each span of shard ``index``'s token file
        are local (fetched now in ``range_bytes`` units if missing)."""
        self.ensure_many({index: spans})

    def ensure_many(self, wanted: Mapping[int, Sequence[tuple[int, int]]]) -> None:
        """`ensure_ranges` for several shards at once (their missing ranges in parallel).
        Prefetching starts after the first such read of this process, so the first batch does
        not queue behind it."""
        self._this_process()
        self.files.ensure_many(
            [(self._file(i, shard_file_name(i)), spans) for i, spans in wanted.items()]
        )
        if not self._demand_seen:
            self._demand_seen = True
            self._top_up()

    def hint(self, upcoming: Sequence[int]) -> None:
        """The shards the loader reads next, in order: start fetching the first few.

        First-use order (each shard once) is enough for prefetching; a sequence with repeats
        (every access) also lets eviction see second and later uses."""
        self._this_process()
        with self._mutex:
            self._upcoming = [int(i) for i in upcoming]
            self._positions = {}
            for pos, idx in enumerate(self._upcoming):
                self._positions.setdefault(idx, []).append(pos)
            self._cursor = 0
        self._top_up()

    def release(self, index: int) -> None:
        """The loader unmapped shard ``index``: it may now be evicted."""
        self._this_process()
        with self._mutex:
            self._pinned[index] -= 1
            if self._pinned[index] <= 0:
                del self._pinned[index]

    def close(self) -> None:
        """Stop prefetching; cached files stay for the next job on this node."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self.files.service is not None:
            self.files.service.close()

    def __enter__(self) -> ShardCache:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- metadata -----------------------------------------------------------------------------

    def _load_metadata(self) -> list[ShardEntry]:
        with self._meta_lock:
            if self._entries is None:
                self._fetch_metadata_once_per_node()
                manifest = read_manifest(self.meta_dir)
                entries = read_shard_entries(self.meta_dir, manifest)
                self._units = read_units(self.meta_dir, manifest, [e.tokens for e in entries])
                self._itemsize = manifest.np_dtype.itemsize
                self.config.validate(max(e.tokens for e in entries) * self._itemsize)
                self._entries = entries
            return self._entries

    def _fetch_metadata_once_per_node(self) -> None:
        """Bring manifest, index, listing and unit digests (units.bin, when the manifest lists
        one) up to date, once for all processes of the node.

        The first process to come takes the node-wide lock and fetches; the ranks and
        DataLoader workers behind it find a manifest younger than ``metadata_max_age_s`` and
        read the local copies (a 1,000-rank job on 125 nodes reads the index 125 times, not
        1,000). index.bin, shards.json and units.bin are fetched only when their hash differs
        from the manifest's, so a restarted job on a warm node reads only the manifest.
        """
        self.meta_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.meta_dir / ".lock"), timeout=self.config.lock_timeout_s)
        with lock:
            manifest_path = self.meta_dir / MANIFEST_NAME
            try:
                age = time.time() - manifest_path.stat().st_mtime
            except FileNotFoundError:
                age = float("inf")
            if not 0 <= age <= self.config.metadata_max_age_s:
                self.files.fetch_small(MANIFEST_NAME, manifest_path)
                self.stats.metadata_fetches += 1
            manifest = read_manifest(self.meta_dir)
            wanted = [(INDEX_NAME, manifest.index_hash), (SHARDS_NAME, manifest.shards_hash)]
            if manifest.units_hash is not None:
                wanted.append((UNITS_NAME, manifest.units_hash))
            todo = [(n, d) for n, d in wanted if not _matches(self.meta_dir / n, d)]
            if todo:  # at once: a cold start waits for one round trip here, not three
                with ThreadPoolExecutor(len(todo), thread_name_prefix="tyard-meta") as pool:
                    fetches = [
                        pool.submit(self.files.fetch_small, name, self.meta_dir / name, digest)
                        for name, digest in todo
                    ]
                    for fetch in fetches:
                        fetch.result()
            self.stats.metadata_fetches += len(todo)

    def _file(self, index: int, name: str) -> RemoteFile:
        entries = self._load_metadata()
        if not 0 <= index < len(entries):
            raise DataError(f"{self.url}: shard {index} outside [0, {len(entries)})")
        e = entries[index]
        if name == shard_file_name(index):
            units = self._units
            return RemoteFile(
                name,
                e.tokens * self._itemsize,
                e.tokens_hash,
                unit_digests=units.of_shard(index) if units is not None else None,
                unit_bytes=units.unit_bytes if units is not None else 0,
            )
        if name == doc_file_name(index):
            return RemoteFile(name, e.documents * 8, e.docs_hash)
        raise DataError(f"{self.url}: shard {index} has no file {name!r}")

    # -- order and prefetch -------------------------------------------------------------------

    def _next_position(self, index: int) -> int | None:
        """First announced position of ``index`` at or after the cursor (mutex held)."""
        positions = self._positions.get(index)
        if not positions:
            return None
        at = bisect.bisect_left(positions, self._cursor)
        return positions[at] if at < len(positions) else None

    def _next_use(self) -> dict[str, int]:
        """Cached file name -> how far ahead it is needed (negative: mapped right now)."""
        entries = self._entries or []
        ranks: dict[str, int] = {}
        with self._mutex:
            cursor = self._cursor
            ahead = [(i, pos - cursor) for pos, i in enumerate(self._upcoming[cursor:], cursor)]
            pinned = list(self._pinned)
        for idx, rank in ahead:
            for name in (shard_file_name(idx), doc_file_name(idx)):
                ranks.setdefault(self._file_name(entries, idx, name), rank)
        for idx in pinned:
            for name in (shard_file_name(idx), doc_file_name(idx)):
                ranks[self._file_name(entries, idx, name)] = -1
        return ranks

    def _file_name(self, entries: list[ShardEntry], idx: int, name: str) -> str:
        e = entries[idx]
        digest = e.tokens_hash if name.endswith(".tok") else e.docs_hash
        return RemoteFile(name, 0, digest).local_name

    def _top_up(self) -> None:
        """Start downloads of the next ``prefetch_shards`` announced shards not yet local."""
        if self._closed or self.config.prefetch_shards == 0 or self._entries is None:
            return
        ranged = self.files.ranged
        if ranged and not self._demand_seen:
            return
        with self._mutex:
            ahead = self._upcoming[self._cursor :]
            window = list(dict.fromkeys(ahead[: 8 * self.config.prefetch_shards]))
        for idx in window[: self.config.prefetch_shards]:
            f = self._file(idx, shard_file_name(idx))
            if self.files.present(f):
                continue
            with self._mutex:
                if idx in self._inflight:
                    continue
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self.config.download_threads, thread_name_prefix="tyard-shard-cache"
                    )
                if ranged:
                    future = self._pool.submit(self._prefetch_ranges, f)
                else:
                    future = self._pool.submit(self.files.fetch, f, demand=False)
                self._inflight[idx] = future
            future.add_done_callback(functools.partial(self._forget, idx))

    def _prefetch_ranges(self, f: RemoteFile) -> Path | None:
        self.files.prefetch_ranges(f)
        return None

    def _forget(self, index: int, future: Future[Path | None]) -> None:
        with self._mutex:
            if self._inflight.get(index) is future:
                del self._inflight[index]
        if not future.cancelled() and future.exception() is not None:
            log.warning("prefetch of shard %d failed: %s", index, future.exception())


def _matches(path: Path, digest: str) -> bool:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False
    want = RemoteFile("", 0, digest)
    h = _hasher(want.algorithm, len(want.hexdigest) // 2)
    h.update(data)
    return bool(h.hexdigest() == want.hexdigest)


def source_for_url(url: str, config: CacheConfig | None = None) -> ShardCache:
    """The shard source `open_dataset` uses for a remote URL: a cache configured from the
    environment (``TYARD_DATA_CACHE_DIR``, ``TYARD_DATA_CACHE_BYTES``, ``AWS_*``)."""
    return ShardCache(url, config)
