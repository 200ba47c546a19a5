"""The on-disk format of a prepared dataset (format version 1).

A prepared directory holds::

    manifest.json        summary: format version, dtype, token/document counts, tokenizer,
                         sources, and the hashes of shards.json and index.bin
    shards.json          one entry per shard: name, tokens, documents, full content hashes
    index.bin            binary table read at open: cumulative token counts and a 16-byte
                         quick fingerprint per shard (open cost independent of shard count)
    shard-000000.tok     raw token ids (little-endian uint16, or uint32 when the vocabulary
                         needs it): the documents of the corpus in order, each followed by EOS
    shard-000000.doc     uint64 offsets (within the shard) where documents start

The token stream is the concatenation of all shards. In a prepared dataset every shard but the
last holds exactly `shard_tokens` tokens, so documents may continue from one shard into the
next; imported datasets (Megatron) may have shards of any size. Readers use index.bin only.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensoryard.data._util import (
    atomic_write_bytes,
    atomic_write_json,
    canonical_json,
    digest_bytes,
)
from tensoryard.errors import DataError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "MANIFEST_NAME",
    "SHARDS_NAME",
    "Manifest",
    "ShardEntry",
    "ShardIndex",
    "doc_file_name",
    "read_index",
    "read_manifest",
    "read_shard_entries",
    "shard_file_name",
    "write_dataset_metadata",
]

FORMAT_NAME = "tensoryard-tokens"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SHARDS_NAME = "shards.json"
INDEX_NAME = "index.bin"
_INDEX_MAGIC = b"TYIDX001"


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

    @property
    def dataset_id(self) -> str:
        """Content identity: changes when any shard, the tokenizer or the dtype changes."""
        tok = self.tokenizer.get("hash")
        ident = f"{self.format_version}|{self.dtype}|{tok}|{self.shards_hash}"
        return digest_bytes(ident.encode())[len("blake2b:") :][:32]

    @property
    def np_dtype(self) -> np.dtype[Any]:
        return np.dtype(self.dtype).newbyteorder("<")

    def as_dict(self) -> dict[str, Any]:
        return {
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
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: field {exc} missing or malformed") from exc
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


def write_dataset_metadata(
    directory: Path,
    *,
    entries: list[ShardEntry],
    dtype: str,
    shard_tokens: int,
    tokenizer: dict[str, Any],
    sources: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> Manifest:
    """Write shards.json, index.bin and finally manifest.json (the commit point), atomically."""
    shards_bytes = canonical_json({"shards": [e.as_dict() for e in entries]}, indent=1)
    counts = np.array([e.tokens for e in entries], dtype=np.uint64)
    starts = np.zeros(len(entries) + 1, dtype=np.uint64)
    np.cumsum(counts, out=starts[1:])
    quick = np.array([bytes.fromhex(e.quick) for e in entries] or [b"\0" * 16], dtype="S16")
    quick_arr = np.frombuffer(quick.tobytes(), dtype=np.uint8).reshape(-1, 16)[: len(entries)]
    index_bytes = ShardIndex(starts=starts, quick=quick_arr).to_bytes()
    atomic_write_bytes(directory / SHARDS_NAME, shards_bytes)
    atomic_write_bytes(directory / INDEX_NAME, index_bytes)
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
    )
    atomic_write_json(directory / MANIFEST_NAME, man.as_dict())
    return man
