"""A prepared dataset opened for reading: a flat token stream over memory-mapped shards.

Opening reads two small files (manifest.json, index.bin) and nothing per shard, so its cost does
not grow with the number of shards. Each shard is opened the first time it is read, checked
(size always; a quick fingerprint of its first and last 4 KiB by default; the full hash with
``check="full"``) and kept in an LRU of at most `max_open_shards` open files (or maps), which
bounds file descriptors. Windows are read with one ``pread`` each straight into the batch
(``io="pread"``, the default: RSS stays flat) or gathered from memory maps (``io="mmap"``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tensoryard.data._util import (
    HASH_ALGO,
    QUICK_BYTES,
    digest_file,
    distinct,
    new_hasher,
    quick_digest,
)
from tensoryard.data.format import (
    INDEX_NAME,
    MANIFEST_NAME,
    SHARDS_NAME,
    UNITS_NAME,
    Manifest,
    ShardIndex,
    doc_file_name,
    read_index,
    read_manifest,
    read_shard_entries,
    read_units,
    shard_file_name,
    unit_digest,
)
from tensoryard.data.source import LocalShardSource, ShardSource
from tensoryard.data.tokenizer import Tokenizer, load_tokenizer
from tensoryard.errors import DataError

__all__ = ["CheckLevel", "ReadMode", "TokenDataset", "open_dataset", "verify_dataset"]

CheckLevel = Literal["size", "quick", "full"]
ReadMode = Literal["pread", "mmap"]


class TokenDataset:
    """Random access to the token stream of a prepared dataset."""

    def __init__(
        self,
        source: ShardSource,
        *,
        check: CheckLevel = "quick",
        max_open_shards: int = 64,
        tokenizer: Tokenizer | str | None = None,
        where: str = "",
        io: ReadMode = "pread",
        max_resident_bytes: int = 64 << 20,
    ) -> None:
        if max_open_shards < 1:
            raise DataError("max_open_shards must be >= 1")
        self.source = source
        self.where = where or repr(source)
        self.check: CheckLevel = check
        self.max_open_shards = max_open_shards
        # "pread" copies each window with one system call straight into the batch: nothing is
        # mapped, so RSS stays flat whatever the dataset size. "mmap" gathers with numpy from
        # mapped shards; the kernel maps whole page-cache folios on each fault (measured here:
        # ~1 MB of RSS per random 4 KB window), so RSS grows towards the touched data.
        self.io: ReadMode = io
        # Pages of a shared file map count in RSS once touched; dropping them from the page
        # tables (they stay in the page cache) keeps RSS flat however large the dataset.
        self.max_resident_bytes = max_resident_bytes
        self._touched = 0
        meta_dir = source.metadata_path(MANIFEST_NAME).parent
        self.manifest: Manifest = read_manifest(meta_dir)
        self.index: ShardIndex = read_index(meta_dir, self.manifest)
        self._starts = self.index.starts.astype(np.int64)
        self.dtype: np.dtype[Any] = self.manifest.np_dtype
        self._itemsize = self.dtype.itemsize
        # A source that fetches shards in byte ranges (the remote-shard cache): reads wait
        # only for the ranges they touch.
        self._ranged = callable(getattr(source, "ensure_many", None))
        self._maps: OrderedDict[int, tuple[mmap.mmap | None, np.ndarray]] = OrderedDict()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._checked = bytearray(self.manifest.num_shards)
        if tokenizer is not None:
            self.check_tokenizer(tokenizer)

    # ----------------------------------------------------------------- construction, identity
    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        source: ShardSource | None = None,
        check: CheckLevel = "quick",
        max_open_shards: int = 64,
        tokenizer: Tokenizer | str | None = None,
        io: ReadMode = "pread",
    ) -> TokenDataset:
        """Open a prepared directory (or a remote URL through a cache `source`)."""
        return cls(
            source or _default_source(str(path)),
            check=check,
            max_open_shards=max_open_shards,
            tokenizer=tokenizer,
            where=str(path),
            io=io,
        )

    @property
    def num_tokens(self) -> int:
        return self.manifest.num_tokens

    @property
    def num_shards(self) -> int:
        return self.manifest.num_shards

    @property
    def dataset_id(self) -> str:
        return self.manifest.dataset_id

    def num_samples(self, seq_len: int) -> int:
        """Samples of `seq_len + 1` tokens at stride `seq_len` (the last token overlaps)."""
        return max(0, (self.num_tokens - 1) // seq_len)

    def check_tokenizer(self, tokenizer: Tokenizer | str) -> None:
        """Raise DataError unless the data was prepared with `tokenizer`."""
        tok = load_tokenizer(tokenizer)
        want = self.manifest.tokenizer.get("hash")
        if tok.fingerprint() != want:
            raise DataError(
                f"{self.where}/{MANIFEST_NAME}: prepared with tokenizer "
                f"{self.manifest.tokenizer.get('name')!r} ({want}), but {tok.name!r} "
                f"({tok.fingerprint()}) was given (fix: use the same tokenizer or prepare again)"
            )

    def __getstate__(self) -> dict[str, Any]:
        # Maps do not cross process boundaries (DataLoader workers re-map on first read).
        state = self.__dict__.copy()
        state["_maps"] = OrderedDict()
        state["_fds"] = OrderedDict()
        return state

    # ----------------------------------------------------------------- reading
    def locate(self, token_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, offset within shard) of each global token offset."""
        shard = np.searchsorted(self._starts, token_starts, side="right") - 1
        return shard, token_starts - self._starts[shard]

    def shard_array(self, i: int) -> np.ndarray:
        """The tokens of shard `i` (a read-only view on its map)."""
        got = self._maps.get(i)
        if got is not None:
            self._maps.move_to_end(i)
            return got[1]
        return self._open_shard(i)

    def read(self, start: int, length: int, out: np.ndarray | None = None) -> np.ndarray:
        """Tokens `[start, start + length)` of the global stream, across shard boundaries."""
        if start < 0 or start + length > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + length}) outside [0, {self.num_tokens})")
        dst = np.empty(length, dtype=self.dtype) if out is None else out
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        done = 0
        while done < length:
            local = start + done - int(self._starts[shard])
            take = min(length - done, int(self._starts[shard + 1]) - start - done)
            self._copy(shard, local, dst[done : done + take])
            done += take
            shard += 1
        return dst

    def _ensure_windows(self, shard: np.ndarray, local: np.ndarray, stop: np.ndarray) -> None:
        """Have a ranged source fetch tokens [local, stop) of each window's shard, and the
        bytes the first open of a shard checks, all in one call (fetched in parallel)."""
        isz = self._itemsize
        wanted: dict[int, list[tuple[int, int]]] = {}
        for sh in distinct(shard):
            sel = shard == sh
            spans = zip((local[sel] * isz).tolist(), (stop[sel] * isz).tolist(), strict=True)
            wanted[sh] = list(spans)
            if not self._checked[sh]:
                wanted[sh] += self._check_spans(sh)
        self.source.ensure_many(wanted)  # type: ignore[attr-defined]

    @property
    def _cache_checks(self) -> bool:
        """A ranged source checks each shard's whole content hash once its last range is in
        (and fails every reader naming a shard that differs); the quick fingerprint at open
        is left to it there: its head and tail would cost two ranges of every shard before
        the first batch (on a 64 MB dataset read by 16 workers: most of the data)."""
        return self._ranged and self.check == "quick"

    def _check_spans(self, i: int) -> list[tuple[int, int]]:
        """Byte spans of shard i that `_check_shard` reads."""
        if self.check == "size" or self._cache_checks:
            return []
        n = int(self._starts[i + 1] - self._starts[i]) * self._itemsize
        if self.check == "full":
            return [(0, n)]
        return [(0, min(n, QUICK_BYTES)), (max(n - QUICK_BYTES, QUICK_BYTES), n)]

    def _token_path(self, i: int) -> Path:
        """Path of shard i's token file; from a ranged source possibly partial (reads call
        `ensure_ranges` first)."""
        if self._ranged:
            return self.source.partial_path(i, shard_file_name(i))  # type: ignore[attr-defined,no-any-return]
        return self.source.shard_path(i, shard_file_name(i))

    def _copy(self, shard: int, local: int, out: np.ndarray) -> None:
        """Copy tokens [local, local + len(out)) of one shard into `out` (contiguous)."""
        if self._ranged and len(out):
            isz = self._itemsize
            self.source.ensure_many({shard: [(local * isz, (local + len(out)) * isz)]})  # type: ignore[attr-defined]
        if self.io == "mmap":
            out[:] = self.shard_array(shard)[local : local + len(out)]
            return
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._open_fd(shard)
        else:
            self._fds.move_to_end(shard)
        if os.preadv(fd, [out.data], local * self._itemsize) != out.nbytes:
            self._short_read(shard)

    def copy_window(self, shard: int, local: int, out: np.ndarray) -> None:
        """Fill `out` with tokens starting at `local` in `shard` (spilling into later shards)."""
        if local + len(out) <= int(self._starts[shard + 1] - self._starts[shard]):
            self._copy(shard, local, out)
        else:
            self.read(int(self._starts[shard]) + local, len(out), out)

    def gather(self, token_starts: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
        """Copy the window of `out.shape[1]` tokens at each global start into `out[rows[j]]`.

        With ``io="pread"``, one pread per window straight into its row. With ``io="mmap"``,
        windows inside one shard are gathered with one fancy-indexing copy per shard (a
        strided "every window" view, no Python loop per sample) as long as the shards of the
        request fit in the open-map LRU; otherwise, and for windows that cross a shard end,
        window by window.
        """
        shard, local = self.locate(np.asarray(token_starts, dtype=np.int64))
        self.gather_located(shard, local, out, rows)

    def gather_located(
        self, shard: np.ndarray, local: np.ndarray, out: np.ndarray, rows: np.ndarray
    ) -> None:
        """`gather` of windows already located: `(shard, local) = self.locate(token_starts)`."""
        length = out.shape[1]
        sizes = self._starts[shard + 1] - self._starts[shard]
        inside = local + length <= sizes
        if self._ranged and len(shard):
            self._ensure_windows(shard, local, np.minimum(local + length, sizes))
        if self.io == "pread":
            self._pread_windows(shard, local, inside, out, rows)
            return
        uniq = distinct(shard)
        if len(uniq) <= max(1, self.max_open_shards // 2):
            for sh in uniq:
                sel = inside & (shard == sh)
                if sel.any():
                    view = self._windows(self.shard_array(sh), length)
                    out[rows[sel]] = view[local[sel]]
            rest = np.flatnonzero(~inside)
        else:
            rest = np.arange(len(shard))
        inside_l = inside[rest].tolist()
        shard_l, local_l, row_l = shard[rest].tolist(), local[rest].tolist(), rows[rest].tolist()
        for k, sh in enumerate(shard_l):
            if inside_l[k]:
                self._copy(sh, local_l[k], out[row_l[k]])
            else:
                self.read(int(self._starts[sh]) + local_l[k], length, out[row_l[k]])
        self._touched += len(shard) * (length * self._itemsize + mmap.PAGESIZE)
        if self._touched > self.max_resident_bytes:
            self.drop_resident_pages()

    def _pread_windows(
        self,
        shard: np.ndarray,
        local: np.ndarray,
        inside: np.ndarray,
        out: np.ndarray,
        rows: np.ndarray,
    ) -> None:
        """One pread per window, straight into its row of `out` (the hot loop).

        Everything per window that is not the system call is done for the whole request at
        once: shard -> fd through one dict lookup per window, byte offsets and destination
        views as lists, and the reads in one map(). Shards are opened in first-use
        order, at most `max_open_shards` at a time, so the fd LRU bound holds for any request.
        """
        if out.dtype != self.dtype:  # a blend of datasets with different token widths
            tmp = np.empty((len(rows), out.shape[1]), dtype=self.dtype)
            self._pread_windows(shard, local, inside, tmp, np.arange(len(rows)))
            out[rows] = tmp
            return
        crossing = np.flatnonzero(~inside)
        if len(crossing):  # rare: windows across a shard end, copied piece by piece
            length = out.shape[1]
            for k in crossing.tolist():
                sh, row = int(shard[k]), int(rows[k])
                self.read(int(self._starts[sh] + local[k]), length, out[row])
            keep = np.flatnonzero(inside)
            shard, local, rows = shard[keep], local[keep], rows[keep]
        if len(shard) == 0:
            return
        views = _row_views(out, rows)
        shards = shard.tolist()
        offsets = (local * self._itemsize).tolist()
        first_use = list(dict.fromkeys(shards))
        cap = self.max_open_shards
        if len(first_use) <= cap:
            self._pread_group(first_use, shards, offsets, views, out.shape[1])
            return
        # More shards than open files allowed: one group of `cap` shards after another.
        group_of = {sh: n // cap for n, sh in enumerate(first_use)}
        groups = np.array([group_of[sh] for sh in shards], dtype=np.int64)
        for g in range(0, len(first_use), cap):
            sel = np.flatnonzero(groups == g // cap).tolist()
            self._pread_group(
                first_use[g : g + cap],
                [shards[k] for k in sel],
                [offsets[k] for k in sel],
                [views[k] for k in sel],
                out.shape[1],
            )

    def _pread_group(
        self,
        group: list[int],
        shards: list[int],
        offsets: list[int],
        views: list[Any],
        length: int,
    ) -> None:
        """Read windows of at most `max_open_shards` distinct shards (`group`, first-use order)."""
        fds = self._fds
        fd_of: dict[int, int] = {}
        for sh in group:  # open (or refresh in the LRU) every shard of the group first
            fd = fds.get(sh)
            if fd is None:
                fd = self._open_fd(sh)
            else:
                fds.move_to_end(sh)
            fd_of[sh] = fd
        nbytes = length * self._itemsize
        preadv = os.preadv
        # map() calls preadv from C: no bytecode runs per window but building its iovec list.
        got = list(map(preadv, map(fd_of.__getitem__, shards), [[v] for v in views], offsets))
        if got.count(nbytes) != len(got):
            bad = next(k for k, n in enumerate(got) if n != nbytes)
            self._short_read(shards[bad])

    def _short_read(self, shard: int) -> None:
        path = self.source.shard_path(shard, shard_file_name(shard))
        raise DataError(f"{path}: short read: the shard was truncated while open")

    def drop_resident_pages(self) -> None:
        """Unmap touched pages of every open shard from this process (not from the cache)."""
        self._touched = 0
        for mm, _ in self._maps.values():
            if mm is not None:
                mm.madvise(mmap.MADV_DONTNEED)

    @staticmethod
    def _windows(arr: np.ndarray, length: int) -> np.ndarray:
        """A read-only (n - length + 1, length) view: row k is arr[k : k + length]."""
        n = max(0, len(arr) - length + 1)
        step = arr.strides[0]
        return np.lib.stride_tricks.as_strided(
            arr, shape=(n, length), strides=(step, step), writeable=False
        )

    def documents(self, i: int) -> np.ndarray:
        """Offsets within shard `i` where documents start."""
        path = self.source.shard_path(i, doc_file_name(i))
        try:
            return np.fromfile(path, dtype="<u8")
        except OSError as exc:
            raise DataError(f"{path}: cannot read document offsets ({exc})") from exc

    def close(self) -> None:
        """Unmap and close every shard."""
        while self._maps:
            self._evict()
        while self._fds:
            i, fd = self._fds.popitem(last=False)
            os.close(fd)
            self.source.release(i)

    def _open_fd(self, i: int) -> int:
        """Open shard i for pread (LRU-bounded), checking it the first time."""
        if not 0 <= i < self.num_shards:
            raise IndexError(f"shard {i} outside [0, {self.num_shards})")
        while len(self._fds) >= self.max_open_shards:
            old, old_fd = self._fds.popitem(last=False)
            os.close(old_fd)
            self.source.release(old)
        path = self._token_path(i)
        try:
            fd = self._open_checked_size(path, int(self._starts[i + 1] - self._starts[i]))
        except DataError:
            self.source.release(i)  # not kept open: the source may evict it again
            raise
        if not self._checked[i]:
            try:
                self._check_shard(i, path, fd)
            except DataError:
                os.close(fd)
                self.source.release(i)
                raise
            self._checked[i] = 1
        self._fds[i] = fd
        return fd

    # ----------------------------------------------------------------- shard maps
    def _open_shard(self, i: int) -> np.ndarray:
        if not 0 <= i < self.num_shards:
            raise IndexError(f"shard {i} outside [0, {self.num_shards})")
        while len(self._maps) >= self.max_open_shards:
            self._evict()
        path = self._token_path(i)
        want_tokens = int(self._starts[i + 1] - self._starts[i])
        try:
            mm, arr = self._map(path, want_tokens)
            if not self._checked[i]:
                fd = _open_shard_file(path)
                try:
                    self._check_shard(i, path, fd)
                finally:
                    os.close(fd)
                self._checked[i] = 1
        except DataError:
            self.source.release(i)  # not kept mapped: the source may evict it again
            raise
        self._maps[i] = (mm, arr)
        return arr

    def _open_checked_size(self, path: Path, want_tokens: int) -> int:
        """An fd of `path` after checking its size against the index."""
        fd = _open_shard_file(path)
        size = os.fstat(fd).st_size
        if size != want_tokens * self._itemsize:
            os.close(fd)
            raise DataError(
                f"{path}: {size} bytes, the index says {want_tokens} tokens "
                f"({want_tokens * self._itemsize} bytes): the shard is truncated or does "
                "not belong to this manifest (fix: re-run `tyard data prepare`)"
            )
        return fd

    def _map(self, path: Path, want_tokens: int) -> tuple[mmap.mmap | None, np.ndarray]:
        fd = self._open_checked_size(path, want_tokens)
        try:
            if want_tokens == 0:
                return None, np.empty(0, dtype=self.dtype)
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # dups fd: one per open map
        finally:
            os.close(fd)
        return mm, np.frombuffer(mm, dtype=self.dtype)

    def _check_shard(self, i: int, path: Path, fd: int) -> None:
        if self.check == "size" or self._cache_checks:
            return
        if self._ranged:  # the bytes the check reads: all, or the fingerprint's head and tail
            self.source.ensure_many({i: self._check_spans(i)})  # type: ignore[attr-defined]
        if self.check == "full":
            got_full = digest_file(path)
            want_full = read_shard_entries(self._meta_dir, self.manifest)[i].tokens_hash
            if got_full != want_full:
                raise DataError(f"{path}: content hash {got_full} differs from {SHARDS_NAME}")
        size = os.fstat(fd).st_size
        head = os.pread(fd, QUICK_BYTES, 0)
        tail_at = max(size - QUICK_BYTES, QUICK_BYTES)
        tail = os.pread(fd, size - tail_at, tail_at) if size > QUICK_BYTES else b""
        got = quick_digest(head, tail, size)
        if got != bytes(self.index.quick[i]):
            raise DataError(
                f"{path}: content differs from {INDEX_NAME} (quick fingerprint mismatch): the "
                "shard is corrupt or from another dataset (fix: re-run `tyard data prepare`)"
            )

    @property
    def _meta_dir(self) -> Path:
        return self.source.metadata_path(MANIFEST_NAME).parent

    def _evict(self) -> None:
        i, (mm, arr) = self._maps.popitem(last=False)
        del arr
        if mm is not None:
            # A caller may still hold a view; then the GC closes the map later.
            with contextlib.suppress(BufferError):
                mm.close()
        self.source.release(i)

    # ----------------------------------------------------------------- verification
    def verify(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Check every shard's full content hash and document offsets (reads everything)."""
        verify_dataset(self.source, self.manifest, progress=progress)


def verify_dataset(
    source: ShardSource | str | Path,
    manifest: Manifest | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Full check of a prepared dataset: every hash, size and count, and each unit digest of
    units.bin where the dataset has one. Raises DataError."""
    src = source if isinstance(source, ShardSource) else LocalShardSource(source)
    meta_dir = src.metadata_path(MANIFEST_NAME).parent
    man = manifest or read_manifest(meta_dir)
    index = read_index(meta_dir, man)
    entries = read_shard_entries(meta_dir, man)
    if len(entries) != man.num_shards:
        raise DataError(
            f"{meta_dir / SHARDS_NAME}: {len(entries)} shards, manifest says {man.num_shards}"
        )
    itemsize = man.np_dtype.itemsize
    units = read_units(meta_dir, man, [e.tokens for e in entries])
    docs = 0
    for i, entry in enumerate(entries):
        want = int(index.starts[i + 1] - index.starts[i])
        if entry.tokens != want:
            raise DataError(
                f"{meta_dir / SHARDS_NAME}: shard {i} lists {entry.tokens} tokens, index has {want}"
            )
        tok = src.shard_path(i, shard_file_name(i))
        if units is None:
            _verify_file(tok, want * itemsize, entry.tokens_hash)
        else:
            _verify_file(
                tok, want * itemsize, entry.tokens_hash, units.of_shard(i), units.unit_bytes
            )
        _verify_file(src.shard_path(i, doc_file_name(i)), entry.documents * 8, entry.docs_hash)
        docs += entry.documents
        if progress is not None:
            progress(i + 1, len(entries))
    if docs != man.num_documents:
        raise DataError(
            f"{meta_dir / MANIFEST_NAME}: {man.num_documents} documents, shards hold {docs}"
        )
    return man


def _verify_file(
    path: Path, size: int, digest: str, units: bytes | None = None, unit_bytes: int = 0
) -> None:
    """Size and content hash of one file; with ``units`` (its units.bin digests) each unit
    too, in the same pass."""
    try:
        got_size = path.stat().st_size
    except OSError as exc:
        raise DataError(f"{path}: missing or unreadable ({exc.strerror})") from exc
    if got_size != size:
        raise DataError(f"{path}: {got_size} bytes, the manifest says {size} (truncated?)")
    got = digest_file(path) if units is None else _hash_checking_units(path, units, unit_bytes)
    if got != digest:
        raise DataError(f"{path}: content hash {got} differs from the manifest's {digest}")


def _hash_checking_units(path: Path, want: bytes, unit_bytes: int) -> str:
    """`digest_file` of ``path``, raising at the first unit whose digest differs from ``want``."""
    whole = new_hasher()
    with open(path, "rb") as f:
        k = 0
        while block := f.read(unit_bytes):
            whole.update(block)
            got_unit, want_unit = unit_digest(block), want[16 * k : 16 * k + 16]
            if got_unit != want_unit:
                start = k * unit_bytes
                raise DataError(
                    f"{path}: content hash of unit {k} (bytes [{start}, {start + len(block)})) "
                    f"blake2b-128:{got_unit.hex()} differs from {UNITS_NAME}'s "
                    f"blake2b-128:{want_unit.hex()}: the shard is corrupt (fix: copy or "
                    "prepare the dataset again)"
                )
            k += 1
    return f"{HASH_ALGO}:{whole.hexdigest()}"


def _default_source(path: str) -> ShardSource:
    if "://" not in path or path.startswith("file://"):
        return LocalShardSource(path.removeprefix("file://"))
    try:
        from tensoryard.data import cache
    except ImportError as exc:  # pragma: no cover - cache.py ships with the package
        raise DataError(f"{path}: remote datasets need tensoryard.data.cache") from exc
    factory = getattr(cache, "source_for_url", None)
    if factory is None:
        raise DataError(
            f"{path}: remote dataset given without a source (fix: pass source= a shard cache)"
        )
    src: ShardSource = factory(path)
    return src


def open_dataset(
    path: str | Path,
    *,
    source: ShardSource | None = None,
    check: CheckLevel = "quick",
    max_open_shards: int = 64,
    tokenizer: Tokenizer | str | None = None,
    io: ReadMode = "pread",
) -> TokenDataset:
    """Open a prepared dataset; see `TokenDataset.open`."""
    return TokenDataset.open(
        path,
        source=source,
        check=check,
        max_open_shards=max_open_shards,
        tokenizer=tokenizer,
        io=io,
    )


def _row_views(out: np.ndarray, rows: np.ndarray) -> list[Any]:
    """Views of `out[rows[k]]` (no copies); `list(out)` when rows are all rows in order.

    Typed Any: numpy arrays are buffers at runtime, which the stubs do not say."""
    n = len(rows)
    every_row = n == len(out) and (n == 0 or (int(rows[0]) == 0 and int(rows[-1]) == n - 1))
    if every_row and (n < 2 or bool((rows[1:] > rows[:-1]).all())):
        return list(out)
    return [out[r] for r in rows.tolist()]


def _open_shard_file(path: Path) -> int:
    """A read-only fd of a shard file. A ranged source's partial file (``*.part``) may have
    been completed, verified and renamed to its final name since the source named it."""
    try:
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if path.suffix != ".part":
                raise
            return os.open(path.with_suffix(""), os.O_RDONLY)
    except OSError as exc:
        raise DataError(f"{path}: cannot open shard ({exc.strerror})") from exc
