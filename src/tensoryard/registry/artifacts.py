"""Content-addressed artifact store: FastCDC chunks hashed with BLAKE3, manifests, safe GC.

Layout under the store's root (any :class:`~tensoryard.registry.blobs.BlobStore`)::

    chunks/<h[:2]>/<h>        one content-defined chunk, named by its BLAKE3 hash
    manifests/<digest>.json   files -> ordered chunk lists; digest = BLAKE3 of the file list
    leases/<id>.json          an upload in progress: expiry and the chunks it relies on
    gc/condemned.json         chunks found unreferenced by a GC pass, and when

Pushing maps each file and cuts it with FastCDC (``pyfastcdc``), so a file is never read whole;
chunks are hashed and written by a thread pool, and a chunk that is already stored is skipped,
which is how an interrupted upload resumes and how a checkpoint that changed by 10% stores about
10% new bytes. Pulling verifies every chunk's hash and names the corrupted one.

Garbage collection is two-phase, so it is safe while uploads run: a pass *condemns* unreferenced
chunks, and only a later pass at least ``gc_grace_s`` after deletes those still unreferenced and
not rewritten since (the storage's own modified time is compared, so clock skew between this
machine and S3 does not matter). Roots are the manifests the caller keeps (the model
registry's), manifests younger than the grace period and the chunks claimed by unexpired upload
leases. An upload re-reads the condemned list with every batch and rewrites a condemned chunk
instead of relying on it, and before it writes its manifest it checks that every chunk it names
is still stored (pushing a file again if a GC pass took one of its chunks). This holds as long
as one batch of an upload takes less than the grace period; the one window left is a GC pass
that deletes a chunk between an upload's last check and its manifest write, which needs a chunk
condemned a grace period ago that the upload claimed within its last batch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from blake3 import blake3
from pyfastcdc import FastCDC

from tensoryard.errors import DataError, NotFound
from tensoryard.registry.blobs import BlobStore

__all__ = [
    "ArtifactConfig",
    "ArtifactStore",
    "ChunkRef",
    "FileEntry",
    "GcResult",
    "IntegrityError",
    "Manifest",
    "PushResult",
]

Clock = Callable[[], datetime]
Progress = Callable[[int, int], None]
MANIFEST_VERSION = 1
CONDEMNED_KEY = "gc/condemned.json"
_HASH_LEN = 64
_COMMIT_TRIES = 3


def _utcnow() -> datetime:
    return datetime.now(UTC)


class IntegrityError(DataError):
    """A stored chunk does not match its hash (or is missing): names the chunk and the file."""

    def __init__(self, message: str, *, chunk: str, path: str, offset: int) -> None:
        self.chunk = chunk
        self.path = path
        self.offset = offset
        super().__init__(message)


@dataclass(kw_only=True)
class ArtifactConfig:
    """How the artifact store chunks, uploads and collects garbage."""

    avg_chunk: int = 1 << 20
    """Average FastCDC chunk size in bytes (the minimum is a quarter, the maximum four times)."""
    workers: int = 8
    """Threads hashing and writing (or reading and verifying) chunks in parallel."""
    batch_chunks: int = 64
    """Chunks between two lease renewals and progress calls of an upload."""
    lease_ttl_s: float = 600.0
    """An upload's lease lasts this long after its last renewal (a crashed upload's lapses)."""
    gc_grace_s: float = 3600.0
    """A condemned chunk is deleted no sooner than this; must exceed one upload batch."""


@dataclass(frozen=True)
class ChunkRef:
    hash: str
    size: int


@dataclass(frozen=True)
class FileEntry:
    """One file of an artifact: its path relative to the artifact's root and its chunks."""

    path: str
    size: int
    chunks: tuple[ChunkRef, ...]


@dataclass(frozen=True)
class Manifest:
    """An artifact: a set of files, each an ordered list of chunks. Immutable, content-named."""

    digest: str
    files: tuple[FileEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def chunk_hashes(self) -> set[str]:
        return {c.hash for f in self.files for c in f.chunks}

    def body(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "files": [
                {"path": f.path, "size": f.size, "chunks": [[c.hash, c.size] for c in f.chunks]}
                for f in self.files
            ],
        }

    @classmethod
    def build(cls, files: Iterable[FileEntry]) -> Manifest:
        entries = tuple(sorted(files, key=lambda f: f.path))
        body = cls(digest="", files=entries).body()
        return cls(digest=_digest(body), files=entries)

    @classmethod
    def parse(cls, raw: bytes, digest: str) -> Manifest:
        try:
            body = json.loads(raw)
            files = tuple(
                FileEntry(
                    path=str(f["path"]),
                    size=int(f["size"]),
                    chunks=tuple(ChunkRef(str(h), int(n)) for h, n in f["chunks"]),
                )
                for f in body["files"]
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"manifest {digest} is unreadable: {exc}") from exc
        if _digest(body) != digest:
            raise DataError(
                f"manifest {digest} does not match its digest (corrupted on disk; "
                "fix: push the artifact again from its source)"
            )
        return cls(digest=digest, files=files)


@dataclass(frozen=True)
class PushResult:
    """What one push stored: the manifest, and how many bytes were new."""

    manifest: Manifest
    bytes_total: int
    bytes_new: int
    chunks_total: int
    chunks_new: int
    seconds: float


@dataclass(frozen=True)
class GcResult:
    """What one GC pass did (or, with ``dry_run``, would do)."""

    chunks_deleted: int
    """Chunks freed: unreferenced for a whole grace period."""
    bytes_deleted: int
    chunks_condemned: int
    """Chunks newly found unreferenced; a pass at least ``gc_grace_s`` later frees them."""
    manifests_deleted: int
    leases_expired: int
    chunks_kept: int = 0
    """Chunks referenced by a kept or young manifest or by an unexpired upload lease."""
    bytes_kept: int = 0
    chunks_waiting: int = 0
    """Condemned chunks still inside their grace period after this pass (newly condemned
    included)."""
    dry_run: bool = False


@dataclass
class _Lease:
    id: str
    claims: set[str] = field(default_factory=set)


class ArtifactStore:
    """Push, pull, verify and garbage-collect content-addressed artifacts on a blob store."""

    def __init__(
        self, blobs: BlobStore, *, config: ArtifactConfig | None = None, clock: Clock = _utcnow
    ) -> None:
        self.blobs = blobs
        self.config = config or ArtifactConfig()
        self._clock = clock

    # -- push --------------------------------------------------------------------------------

    def push(self, source: Path | str, *, progress: Progress | None = None) -> PushResult:
        """Store a file or a directory tree; returns its manifest and what was new.

        Idempotent: pushing the same bytes again stores nothing and returns the same digest.
        Interrupted (an error, a kill), it leaves the chunks already written, and the next push
        of the same source skips them."""
        files = _walk(Path(source))
        total = sum(size for _, _, size in files)
        started = time.perf_counter()
        lease = _Lease(id=uuid.uuid4().hex)
        self._write_lease(lease)
        counters = {"new_bytes": 0, "new_chunks": 0, "chunks": 0, "done": 0}
        try:
            with ThreadPoolExecutor(self.config.workers, thread_name_prefix="tyard-push") as pool:
                entries = [
                    self._push_file(pool, rel, path, size, lease, counters, total, progress)
                    for rel, path, size in files
                ]
                for _ in range(_COMMIT_TRIES):
                    lost = self._files_missing_chunks(pool, entries)
                    if not lost:
                        break
                    for i in lost:  # a GC pass raced us: write those files' chunks again
                        rel, path, size = files[i]
                        entries[i] = self._push_file(
                            pool, rel, path, size, lease, counters, total, None
                        )
                else:
                    raise DataError(
                        f"chunks of {source} kept vanishing while it was pushed to "
                        f"{self.blobs.url} (fix: raise gc_grace_s, or stop the GC and retry)"
                    )
            manifest = Manifest.build(entries)
            self.blobs.put(_manifest_key(manifest.digest), _dumps(manifest.body()))
            # Durable before anyone is told (a registry row may reference it next): one flush
            # of the store for every chunk and the manifest, not an fsync per chunk.
            self.blobs.sync()
        finally:
            self.blobs.delete(_lease_key(lease.id))
        return PushResult(
            manifest=manifest,
            bytes_total=total,
            bytes_new=counters["new_bytes"],
            chunks_total=counters["chunks"],
            chunks_new=counters["new_chunks"],
            seconds=time.perf_counter() - started,
        )

    def _push_file(
        self,
        pool: ThreadPoolExecutor,
        rel: str,
        path: Path,
        size: int,
        lease: _Lease,
        counters: dict[str, int],
        total: int,
        progress: Progress | None,
    ) -> FileEntry:
        condemned = self._condemned()
        window: deque[Future[tuple[str, int, bool]]] = deque()
        refs: list[ChunkRef] = []
        since_batch = 0

        def collect() -> None:
            nonlocal since_batch, condemned
            digest, length, new = window.popleft().result()
            refs.append(ChunkRef(digest, length))
            lease.claims.add(digest)
            counters["chunks"] += 1
            counters["done"] += length
            if new:
                counters["new_bytes"] += length
                counters["new_chunks"] += 1
            since_batch += 1
            if since_batch >= self.config.batch_chunks:
                since_batch = 0
                self._write_lease(lease)
                condemned = self._condemned()
                if progress is not None:
                    progress(counters["done"], total)

        avg = self.config.avg_chunk
        chunker = FastCDC(avg, min_size=max(64, avg // 4), max_size=avg * 4)
        try:
            # cut_file maps the file: chunks are views of the page cache, never a copy of the
            # whole file in memory, and each view lives until its chunk is written.
            for chunk in chunker.cut_file(str(path)) if size else ():
                window.append(pool.submit(self._store_chunk, chunk.data, condemned))
                while len(window) > 2 * self.config.workers:
                    collect()
            while window:
                collect()
        except BaseException:
            for pending in window:
                pending.cancel()
            raise
        self._write_lease(lease)  # claim the last partial batch before anyone is told
        if progress is not None:
            progress(counters["done"], total)
        return FileEntry(path=rel, size=size, chunks=tuple(refs))

    def _files_missing_chunks(
        self, pool: ThreadPoolExecutor, entries: list[FileEntry]
    ) -> list[int]:
        """Indexes of files with a chunk no longer stored (the last check before commit)."""
        hashes = sorted({c.hash for e in entries for c in e.chunks})
        present = dict(zip(hashes, pool.map(self._present, hashes), strict=True))
        return [i for i, e in enumerate(entries) if not all(present[c.hash] for c in e.chunks)]

    def _present(self, digest: str) -> bool:
        return self.blobs.info(_chunk_key(digest)) is not None

    def _store_chunk(self, data: memoryview, condemned: frozenset[str]) -> tuple[str, int, bool]:
        digest = blake3(data).hexdigest()
        key = _chunk_key(digest)
        if digest not in condemned and self.blobs.info(key) is not None:
            return digest, len(data), False
        self.blobs.put(key, data)
        return digest, len(data), True

    # -- read --------------------------------------------------------------------------------

    def manifest(self, digest: str) -> Manifest:
        """The manifest ``digest``; NotFound if it was never pushed (or was collected)."""
        _check_digest(digest)
        if self.blobs.info(_manifest_key(digest)) is None:
            raise NotFound(
                f"artifact {digest} is not in the artifact store {self.blobs.url} "
                "(fix: push it first, or check the store URL)"
            )
        return Manifest.parse(self.blobs.get(_manifest_key(digest)), digest)

    def pull(self, digest: str, dest: Path | str) -> Manifest:
        """Write the artifact's files under ``dest``, verifying every chunk on the way.

        A corrupted or missing chunk raises IntegrityError naming the chunk, the file and the
        offset; the file being written is removed (never left half-written)."""
        manifest = self.manifest(digest)
        root = Path(dest)
        with ThreadPoolExecutor(self.config.workers, thread_name_prefix="tyard-pull") as pool:
            for entry in manifest.files:
                target = _safe_join(root, entry.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
                try:
                    with open(tmp, "wb") as out:
                        for data in self._read_chunks(pool, entry):
                            out.write(data)
                    os.replace(tmp, target)
                finally:
                    tmp.unlink(missing_ok=True)
        return manifest

    def pull_into(self, digest: str, dest: Path | str) -> bool:
        """Pull the artifact as the directory ``dest``, complete or not at all: into a sibling
        temporary directory renamed to ``dest`` at the end, so an interrupted pull is never
        taken for the artifact. False (nothing pulled) when ``dest`` is already there, also
        when another pull of the same artifact finished first."""
        dest = Path(dest)
        if dest.is_dir():
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}"
        try:
            self.pull(digest, tmp)
            try:
                tmp.rename(dest)
            except OSError:
                if not dest.is_dir():
                    raise
                return False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return True

    def verify(self, digest: str) -> Manifest:
        """Read and check every chunk of an artifact; IntegrityError names the first bad one."""
        manifest = self.manifest(digest)
        with ThreadPoolExecutor(self.config.workers, thread_name_prefix="tyard-verify") as pool:
            for entry in manifest.files:
                for _ in self._read_chunks(pool, entry):
                    pass
        return manifest

    def _read_chunks(self, pool: ThreadPoolExecutor, entry: FileEntry) -> Iterator[bytes]:
        window: deque[Future[bytes]] = deque()
        offsets = iter(_offsets(entry))
        refs = iter(entry.chunks)
        for ref in refs:
            window.append(pool.submit(self._read_chunk, ref, entry.path, next(offsets)))
            if len(window) > 2 * self.config.workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()

    def _read_chunk(self, ref: ChunkRef, path: str, offset: int) -> bytes:
        where = f"chunk {ref.hash} of {path} at byte {offset}"
        try:
            data = self.blobs.get(_chunk_key(ref.hash))
        except DataError as exc:
            raise IntegrityError(
                f"{where} is missing from {self.blobs.url} ({exc}); "
                "(fix: push the artifact again from its source)",
                chunk=ref.hash,
                path=path,
                offset=offset,
            ) from exc
        if len(data) != ref.size or blake3(data).hexdigest() != ref.hash:
            raise IntegrityError(
                f"{where} is corrupted in {self.blobs.url} (its content no longer matches its "
                "BLAKE3 hash; fix: delete that chunk file and push the artifact again from "
                "its source, which rewrites only the missing chunk)",
                chunk=ref.hash,
                path=path,
                offset=offset,
            )
        return data

    # -- garbage collection -----------------------------------------------------------------

    def gc(self, keep: Iterable[str], *, dry_run: bool = False) -> GcResult:
        """One GC pass keeping the manifests ``keep`` (and everything young or leased).

        ``dry_run`` counts what the pass would delete and condemn and changes nothing (no
        manifest, chunk, lease or condemned list is touched)."""
        now = self._clock()
        grace = timedelta(seconds=self.config.gc_grace_s)
        keep_set = set(keep)
        referenced, leases_expired = self._leased_chunks(now, dry_run=dry_run)
        manifests_deleted = 0
        for blob in list(self.blobs.list("manifests/")):
            digest = blob.key.rsplit("/", 1)[-1].removesuffix(".json")
            if digest in keep_set or blob.modified > now - grace:
                referenced |= Manifest.parse(self.blobs.get(blob.key), digest).chunk_hashes()
            else:
                if not dry_run:
                    self.blobs.delete(blob.key)
                manifests_deleted += 1
        condemned = self._condemned_times()
        still: dict[str, tuple[datetime, datetime]] = {}
        deleted = deleted_bytes = newly = kept = kept_bytes = 0
        for blob in list(self.blobs.list("chunks/")):
            digest = blob.key.rsplit("/", 1)[-1]
            if len(digest) != _HASH_LEN:
                continue
            if digest in referenced:
                kept += 1
                kept_bytes += blob.size
                continue
            since, seen_modified = condemned.get(digest, (None, None))
            if since is None or blob.modified != seen_modified:
                still[digest] = (now, blob.modified)  # newly unreferenced, or rewritten
                newly += 1
            elif now - since >= grace:
                if not dry_run:
                    self.blobs.delete(blob.key)
                deleted += 1
                deleted_bytes += blob.size
            else:
                still[digest] = (since, seen_modified)
        if not dry_run:
            body = {h: [t.isoformat(), m.isoformat()] for h, (t, m) in sorted(still.items())}
            self.blobs.put(CONDEMNED_KEY, _dumps(body))
        return GcResult(
            deleted,
            deleted_bytes,
            newly,
            manifests_deleted,
            leases_expired,
            chunks_kept=kept,
            bytes_kept=kept_bytes,
            chunks_waiting=len(still),
            dry_run=dry_run,
        )

    def _leased_chunks(self, now: datetime, *, dry_run: bool = False) -> tuple[set[str], int]:
        claims: set[str] = set()
        expired = 0
        for blob in list(self.blobs.list("leases/")):
            try:
                body = json.loads(self.blobs.get(blob.key))
                expires = datetime.fromisoformat(body["expires_at"])
            except (DataError, ValueError, KeyError):
                continue  # vanished (the upload finished) or being rewritten: skip
            if expires < now:
                if not dry_run:
                    self.blobs.delete(blob.key)
                expired += 1
            else:
                claims.update(body.get("claims", []))
        return claims, expired

    def _write_lease(self, lease: _Lease) -> None:
        expires = self._clock() + timedelta(seconds=self.config.lease_ttl_s)
        body = {"expires_at": expires.isoformat(), "claims": sorted(lease.claims)}
        self.blobs.put(_lease_key(lease.id), _dumps(body))

    def _condemned_times(self) -> dict[str, tuple[datetime, datetime]]:
        """Condemned chunk -> (when condemned by our clock, its modified time then)."""
        if self.blobs.info(CONDEMNED_KEY) is None:
            return {}
        try:
            raw = json.loads(self.blobs.get(CONDEMNED_KEY))
            return {
                str(h): (datetime.fromisoformat(t), datetime.fromisoformat(m))
                for h, (t, m) in raw.items()
            }
        except (DataError, ValueError, TypeError, AttributeError):
            return {}

    def _condemned(self) -> frozenset[str]:
        return frozenset(self._condemned_times())


# -- helpers ---------------------------------------------------------------------------------


def _walk(source: Path) -> list[tuple[str, Path, int]]:
    if source.is_file():
        return [(source.name, source, source.stat().st_size)]
    if not source.is_dir():
        raise DataError(
            f"{source} does not exist (fix: pass a checkpoint file or directory that exists)"
        )
    files = [
        (p.relative_to(source).as_posix(), p, p.stat().st_size)
        for p in sorted(source.rglob("*"))
        if p.is_file()
    ]
    if not files:
        raise DataError(f"{source} holds no files (fix: pass a directory with the artifact)")
    return files


def _offsets(entry: FileEntry) -> list[int]:
    out, at = [], 0
    for ref in entry.chunks:
        out.append(at)
        at += ref.size
    return out


def _safe_join(root: Path, rel: str) -> Path:
    target = (root / rel).resolve()
    if not target.is_relative_to(root.resolve()):
        raise DataError(f"manifest path {rel!r} escapes the destination directory")
    return target


def _check_digest(digest: str) -> None:
    if len(digest) != _HASH_LEN or any(c not in "0123456789abcdef" for c in digest):
        raise DataError(
            f"{digest!r} is not an artifact digest (fix: use the 64-hex-digit digest "
            "printed by the push)"
        )


def _digest(body: dict[str, Any]) -> str:
    return blake3(_dumps(body)).hexdigest()


def _dumps(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _chunk_key(digest: str) -> str:
    return f"chunks/{digest[:2]}/{digest}"


def _manifest_key(digest: str) -> str:
    return f"manifests/{digest}.json"


def _lease_key(lease_id: str) -> str:
    return f"leases/{lease_id}.json"
