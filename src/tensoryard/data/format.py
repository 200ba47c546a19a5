"""The on-disk format of a prepared dataset (format version 1).

A prepared directory holds::

    manifest.json        summary: format version, dtype, token/document counts, tokenizer,
                         sources, and the hashes of shards.json, index.bin (and units.bin)
    shards.json          one entry per shard: name, tokens, documents, full content hashes
    index.bin            binary table read at open: cumulative token counts and a 16-byte
                         quick fingerprint per shard (open cost independent of shard count)
    units.bin            optional: a 16-byte blake2b digest of every 1 MiB unit of every .tok
                         file, so a remote reader can verify each unit it fetches before use
    shard-000000.tok     raw token ids (little-endian uint16, or uint32 when the vocabulary
                         needs it): the documents of the corpus in order, each followed by EOS
    shard-000000.doc     uint64 offsets (within the shard) where documents start

The token stream is the concatenation of all shards. In a prepared dataset every shard but the
last holds exactly `shard_tokens` tokens, so documents may continue from one shard into the
next; imported datasets (Megatron) may have shards of any size. Readers use index.bin only.

units.bin (``TYUNIT01``, little-endian)::

    8 bytes   magic b"TYUNIT01"
    <Q        unit size U in bytes (1 MiB when written by this version)
    <Q        shard count N
    <Q[N+1]   cumulative unit counts: shard i's digests are numbers starts[i] .. starts[i+1]-1
    16 bytes  per unit: blake2b (digest_size=16) of bytes [k*U, min((k+1)*U, size)) of the
              shard's .tok file, shards in order (a shard of S bytes has ceil(S/U) units)

The manifest names it with ``units_hash`` (its content hash) and ``unit_bytes``. Both are
absent in datasets prepared before units.bin existed; those are verified by whole-shard hashes
only. units.bin is not part of `dataset_id`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensoryard.data._util import (
    HASH_ALGO,
    atomic_write_bytes,
    atomic_write_json,
    canonical_json,
    digest_bytes,
    new_hasher,
)
from tensoryard.errors import DataError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "MANIFEST_NAME",
    "SHARDS_NAME",
    "UNITS_NAME",
    "UNIT_BYTES",
    "Manifest",
    "ShardEntry",
    "ShardIndex",
    "UnitDigests",
    "UnitHasher",
    "digest_file_with_units",
    "doc_file_name",
    "read_index",
    "read_manifest",
    "read_shard_entries",
    "read_units",
    "shard_file_name",
    "unit_digest",
    "write_dataset_metadata",
]

FORMAT_NAME = "tensoryard-tokens"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SHARDS_NAME = "shards.json"
INDEX_NAME = "index.bin"
_INDEX_MAGIC = b"TYIDX001"
UNITS_NAME = "units.bin"
UNIT_BYTES = 1 << 20
"""Size of the blocks units.bin holds a digest of (each shard's last block may be shorter)."""
UNIT_DIGEST_BYTES = 16
_UNITS_MAGIC = b"TYUNIT01"


def unit_digest(data: bytes | memoryview) -> bytes:
    """The 16-byte digest of one unit, as stored in units.bin."""
    return hashlib.blake2b(data, digest_size=UNIT_DIGEST_BYTES).digest()


class UnitHasher:
    """Unit digests of a byte stream fed in pieces of any size (computed while it is written)."""

    def __init__(self, unit_bytes: int = UNIT_BYTES) -> None:
        self.unit_bytes = unit_bytes
        self._digests: list[bytes] = []
        self._h = hashlib.blake2b(digest_size=UNIT_DIGEST_BYTES)
        self._fill = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(self.unit_bytes - self._fill, len(view))
            self._h.update(view[:take])
            self._fill += take
            view = view[take:]
            if self._fill == self.unit_bytes:
                self._digests.append(self._h.digest())
                self._h = hashlib.blake2b(digest_size=UNIT_DIGEST_BYTES)
                self._fill = 0

    def digests(self) -> bytes:
        """The digests so far, the last partial unit included (16 bytes per unit)."""
        tail = [self._h.digest()] if self._fill else []
        return b"".join(self._digests + tail)


def digest_file_with_units(path: Path, unit_bytes: int = UNIT_BYTES) -> tuple[str, bytes]:
    """(`digest_file` of `path`, its unit digests) in one pass over the file."""
    whole = new_hasher()
    units = UnitHasher(unit_bytes)
    with open(path, "rb") as f:
        while block := f.read(unit_bytes):
            whole.update(block)
            units.update(block)
    return f"{HASH_ALGO}:{whole.hexdigest()}", units.digests()


def shard_file_name(i: int) -> str:
    """Name of shard `i`'s token file."""
    return f"shard-{i:06d}.tok"


def doc_file_name(i: int) -> str:
    """Name of shard `i`'s document-offset file."""
    return f"shard-{i:06d}.doc"


@dataclass(frozen=True)
class ShardEntry:
    """One shard as listed in shards.json."""

    name: str
    tokens: int
    documents: int
    tokens_hash: str
    docs_hash: str
    quick: str  # hex of the 16-byte quick fingerprint of the token file

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tokens": self.tokens,
            "documents": self.documents,
            "tokens_hash": self.tokens_hash,
            "docs_hash": self.docs_hash,
            "quick": self.quick,
        }


@dataclass(frozen=True)
class Manifest:
    """Summary of a prepared dataset (manifest.json)."""

    dtype: str
    num_tokens: int
    num_documents: int
    num_shards: int
    shard_tokens: int
    tokenizer: dict[str, Any]
    sources: list[dict[str, Any]]
    shards_hash: str
    index_hash: str
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    units_hash: str | None = None
    """Content hash of units.bin; None for datasets written without one."""
    unit_bytes: int = 0
    """The unit size units.bin uses (0 without units.bin)."""

    @property
    def dataset_id(self) -> str:
        """Content identity: changes when any shard, the tokenizer or the dtype changes
        (units.bin is derived from the shards and left out)."""
        tok = self.tokenizer.get("hash")
        ident = f"{self.format_version}|{self.dtype}|{tok}|{self.shards_hash}"
        return digest_bytes(ident.encode())[len("blake2b:") :][:32]

    @property
    def np_dtype(self) -> np.dtype[Any]:
        return np.dtype(self.dtype).newbyteorder("<")

    def as_dict(self) -> dict[str, Any]:
        units: dict[str, Any] = {}
        if self.units_hash is not None:  # absent, not null, in a dataset without units.bin
            units = {"units_hash": self.units_hash, "unit_bytes": self.unit_bytes}
        return units | {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "dtype": self.dtype,
            "num_tokens": self.num_tokens,
            "num_documents": self.num_documents,
            "num_shards": self.num_shards,
            "shard_tokens": self.shard_tokens,
            "tokenizer": self.tokenizer,
            "sources": self.sources,
            "shards_hash": self.shards_hash,
            "index_hash": self.index_hash,
            "dataset_id": self.dataset_id,
            "extra": self.extra,
        }


@dataclass(frozen=True)
class ShardIndex:
    """The binary table read at open: `starts[i]` is the first global token of shard i."""

    starts: np.ndarray  # uint64, length num_shards + 1 (last = total tokens)
    quick: np.ndarray  # uint8 (num_shards, 16)

    @property
    def num_shards(self) -> int:
        return len(self.starts) - 1

    def to_bytes(self) -> bytes:
        n = self.num_shards
        head = _INDEX_MAGIC + struct.pack("<Q", n)
        return head + self.starts.astype("<u8").tobytes() + self.quick.astype(np.uint8).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> ShardIndex:
        if len(data) < 16 or data[:8] != _INDEX_MAGIC:
            raise DataError(f"{where}: not a tensoryard index file (bad magic)")
        (n,) = struct.unpack("<Q", data[8:16])
        want = 16 + 8 * (n + 1) + 16 * n
        if len(data) != want:
            raise DataError(f"{where}: {len(data)} bytes, expected {want} for {n} shards")
        starts = np.frombuffer(data, dtype="<u8", count=n + 1, offset=16)
        quick = np.frombuffer(data, dtype=np.uint8, count=16 * n, offset=16 + 8 * (n + 1))
        return cls(starts=starts, quick=quick.reshape(n, 16))


@dataclass(frozen=True)
class UnitDigests:
    """units.bin: shard i's unit digests are ``digests[16*starts[i] : 16*starts[i+1]]``."""

    unit_bytes: int
    starts: np.ndarray  # uint64, length num_shards + 1
    digests: bytes

    @property
    def num_shards(self) -> int:
        return len(self.starts) - 1

    def of_shard(self, i: int) -> bytes:
        """Shard ``i``'s digests, 16 bytes per unit in file order."""
        a, b = int(self.starts[i]), int(self.starts[i + 1])
        return self.digests[UNIT_DIGEST_BYTES * a : UNIT_DIGEST_BYTES * b]

    def to_bytes(self) -> bytes:
        head = _UNITS_MAGIC + struct.pack("<QQ", self.unit_bytes, self.num_shards)
        return head + self.starts.astype("<u8").tobytes() + self.digests

    @classmethod
    def build(cls, unit_bytes: int, per_shard: list[bytes]) -> UnitDigests:
        counts = np.array([len(d) // UNIT_DIGEST_BYTES for d in per_shard], dtype=np.uint64)
        starts = np.zeros(len(per_shard) + 1, dtype=np.uint64)
        np.cumsum(counts, out=starts[1:])
        return cls(unit_bytes=unit_bytes, starts=starts, digests=b"".join(per_shard))

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> UnitDigests:
        if len(data) < 24 or data[:8] != _UNITS_MAGIC:
            raise DataError(f"{where}: not a tensoryard unit digest file (bad magic)")
        unit_bytes, n = struct.unpack("<QQ", data[8:24])
        if unit_bytes < 1 or len(data) < 24 + 8 * (n + 1):
            raise DataError(f"{where}: unit size {unit_bytes} or shard count {n} is malformed")
        starts = np.frombuffer(data, dtype="<u8", count=n + 1, offset=24)
        want = 24 + 8 * (n + 1) + UNIT_DIGEST_BYTES * int(starts[-1])
        if len(data) != want or int(starts[0]) != 0 or bool((starts[1:] < starts[:-1]).any()):
            raise DataError(f"{where}: {len(data)} bytes, expected {want} for {n} shards")
        return cls(unit_bytes=unit_bytes, starts=starts, digests=data[24 + 8 * (n + 1) :])


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise DataError(
            f"{path}: missing (fix: point at a directory written by `tyard data prepare`)"
        ) from exc
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable or not JSON ({exc})") from exc


def read_manifest(directory: Path) -> Manifest:
    """Parse and sanity-check manifest.json of a prepared directory."""
    path = directory / MANIFEST_NAME
    raw = _load_json(path)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise DataError(f"{path}: not a tensoryard dataset manifest (format field missing)")
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(
            f"{path}: format_version {version!r}, this tensoryard reads {FORMAT_VERSION} "
            "(fix: prepare the data again with this version)"
        )
    try:
        man = Manifest(
            dtype=str(raw["dtype"]),
            num_tokens=int(raw["num_tokens"]),
            num_documents=int(raw["num_documents"]),
            num_shards=int(raw["num_shards"]),
            shard_tokens=int(raw["shard_tokens"]),
            tokenizer=dict(raw["tokenizer"]),
            sources=list(raw["sources"]),
            shards_hash=str(raw["shards_hash"]),
            index_hash=str(raw["index_hash"]),
            extra=dict(raw.get("extra", {})),
            units_hash=None if raw.get("units_hash") is None else str(raw["units_hash"]),
            unit_bytes=int(raw.get("unit_bytes", 0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: field {exc} missing or malformed") from exc
    if man.units_hash is not None and man.unit_bytes < 1:
        raise DataError(f"{path}: units_hash given with unit_bytes {man.unit_bytes}, expected >= 1")
    if man.dtype not in ("uint16", "uint32"):
        raise DataError(f"{path}: dtype {man.dtype!r}, expected uint16 or uint32")
    if raw.get("dataset_id") not in (None, man.dataset_id):
        raise DataError(f"{path}: dataset_id does not match the manifest's own hashes (edited?)")
    return man


def read_index(directory: Path, manifest: Manifest) -> ShardIndex:
    """Read index.bin and check it against the manifest (hash, shard count, token total)."""
    path = directory / INDEX_NAME
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from exc
    if digest_bytes(data) != manifest.index_hash:
        raise DataError(f"{path}: content hash differs from {MANIFEST_NAME}'s index_hash")
    index = ShardIndex.from_bytes(data, str(path))
    if index.num_shards != manifest.num_shards or int(index.starts[-1]) != manifest.num_tokens:
        raise DataError(
            f"{path}: {index.num_shards} shards / {int(index.starts[-1])} tokens, manifest says "
            f"{manifest.num_shards} / {manifest.num_tokens}"
        )
    return index


def read_shard_entries(directory: Path, manifest: Manifest) -> list[ShardEntry]:
    """Read shards.json (the full per-shard hash list) and check it against the manifest."""
    path = directory / SHARDS_NAME
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from exc
    if digest_bytes(data) != manifest.shards_hash:
        raise DataError(f"{path}: content hash differs from {MANIFEST_NAME}'s shards_hash")
    try:
        return [ShardEntry(**e) for e in json.loads(data)["shards"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: malformed shard list ({exc})") from exc


def read_units(
    directory: Path, manifest: Manifest, shard_tokens: Sequence[int]
) -> UnitDigests | None:
    """units.bin checked against the manifest (hash, unit size) and the shards' token counts;
    None for a dataset written without one."""
    if manifest.units_hash is None:
        return None
    path = directory / UNITS_NAME
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(
            f"{path}: cannot read ({exc.strerror}); {MANIFEST_NAME} lists units_hash "
            "(fix: copy the whole prepared directory)"
        ) from exc
    if digest_bytes(data) != manifest.units_hash:
        raise DataError(f"{path}: content hash differs from {MANIFEST_NAME}'s units_hash")
    units = UnitDigests.from_bytes(data, str(path))
    if units.num_shards != manifest.num_shards or units.unit_bytes != manifest.unit_bytes:
        raise DataError(
            f"{path}: {units.num_shards} shards of {units.unit_bytes}-byte units, manifest says "
            f"{manifest.num_shards} of {manifest.unit_bytes}"
        )
    size = np.asarray(shard_tokens, dtype=np.int64) * manifest.np_dtype.itemsize
    want = -(-size // units.unit_bytes)
    got = np.diff(units.starts.astype(np.int64))
    if len(want) != len(got) or not np.array_equal(want, got):
        if len(want) != len(got):
            raise DataError(f"{path}: {len(got)} shards, the shard list has {len(want)}")
        bad = int(np.flatnonzero(want != got)[0])
        raise DataError(
            f"{path}: {shard_file_name(bad)} has {int(got[bad])} unit digests, its "
            f"{int(size[bad])} bytes make {int(want[bad])} units"
        )
    return units


def write_dataset_metadata(
    directory: Path,
    *,
    entries: list[ShardEntry],
    dtype: str,
    shard_tokens: int,
    tokenizer: dict[str, Any],
    sources: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
    unit_digests: list[bytes] | None = None,
) -> Manifest:
    """Write shards.json, index.bin, units.bin (when `unit_digests`, one string of 16-byte
    `UNIT_BYTES` digests per shard, is given) and finally manifest.json (the commit point),
    atomically."""
    shards_bytes = canonical_json({"shards": [e.as_dict() for e in entries]}, indent=1)
    counts = np.array([e.tokens for e in entries], dtype=np.uint64)
    starts = np.zeros(len(entries) + 1, dtype=np.uint64)
    np.cumsum(counts, out=starts[1:])
    quick = np.array([bytes.fromhex(e.quick) for e in entries] or [b"\0" * 16], dtype="S16")
    quick_arr = np.frombuffer(quick.tobytes(), dtype=np.uint8).reshape(-1, 16)[: len(entries)]
    index_bytes = ShardIndex(starts=starts, quick=quick_arr).to_bytes()
    atomic_write_bytes(directory / SHARDS_NAME, shards_bytes)
    atomic_write_bytes(directory / INDEX_NAME, index_bytes)
    units_hash = None
    if unit_digests is not None:
        if len(unit_digests) != len(entries):
            raise ValueError(f"{len(unit_digests)} unit digest lists for {len(entries)} shards")
        units_bytes = UnitDigests.build(UNIT_BYTES, unit_digests).to_bytes()
        atomic_write_bytes(directory / UNITS_NAME, units_bytes)
        units_hash = digest_bytes(units_bytes)
    else:
        (directory / UNITS_NAME).unlink(missing_ok=True)  # never one of other shards
    man = Manifest(
        dtype=dtype,
        num_tokens=int(starts[-1]),
        num_documents=sum(e.documents for e in entries),
        num_shards=len(entries),
        shard_tokens=shard_tokens,
        tokenizer=tokenizer,
        sources=sources,
        shards_hash=digest_bytes(shards_bytes),
        index_hash=digest_bytes(index_bytes),
        extra=extra or {},
        units_hash=units_hash,
        unit_bytes=UNIT_BYTES if units_hash is not None else 0,
    )
    atomic_write_json(directory / MANIFEST_NAME, man.as_dict())
    return man
