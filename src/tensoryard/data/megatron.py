"""Read existing Megatron-LM ``.bin/.idx`` datasets without copying their tokens.

`import_megatron(prefixes, out_dir)` writes a tensoryard manifest next to links to the ``.bin``
files (one shard per prefix), so the loader, `verify` and the cache read them like any prepared
dataset. The ``.idx`` layout read here (``MMIDIDX``, version 1)::

    9 bytes  magic  b"MMIDIDX\\x00\\x00"
    <Q       version (1)
    <B       dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    <Q       sequence count S
    <Q       document count D
    int32[S] sequence lengths (tokens)
    int64[S] sequence byte offsets into the .bin
    int64[D] document boundaries (sequence indices)

Megatron appends an end-of-document token only when preprocessed with ``--append-eod``; the
stream is taken as it is.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensoryard.data._util import digest_bytes, quick_digest_file
from tensoryard.data.format import (
    Manifest,
    ShardEntry,
    digest_file_with_units,
    doc_file_name,
    shard_file_name,
    write_dataset_metadata,
)
from tensoryard.data.tokenizer import Tokenizer, load_tokenizer, tokenizer_meta
from tensoryard.errors import DataError

__all__ = ["MegatronIndex", "import_megatron", "read_megatron_index"]

_MAGIC = b"MMIDIDX\x00\x00"
# int32 ids are stored as uint32 (same bytes for the non-negative ids a tokenizer produces).
_DTYPES: dict[int, str] = {4: "uint32", 8: "uint16"}
_ITEMSIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}


@dataclass(frozen=True)
class MegatronIndex:
    """The parts of a Megatron .idx file the loader needs."""

    dtype: str
    lengths: np.ndarray  # int32, tokens per sequence
    pointers: np.ndarray  # int64, byte offset of each sequence


def read_megatron_index(idx_path: Path) -> MegatronIndex:
    """Parse a Megatron ``.idx`` file; DataError naming the file on anything unexpected."""
    try:
        data = idx_path.read_bytes()
    except OSError as exc:
        raise DataError(f"{idx_path}: cannot read Megatron index ({exc.strerror})") from exc
    head = 9 + 8 + 1 + 8 + 8
    if len(data) < head or data[:9] != _MAGIC:
        raise DataError(f"{idx_path}: not a Megatron MMIDIDX index (bad magic)")
    version, code, n_seq, n_doc = struct.unpack("<QBQQ", data[9:head])
    if version != 1:
        raise DataError(f"{idx_path}: Megatron index version {version}, only 1 is supported")
    if code not in _DTYPES:
        raise DataError(
            f"{idx_path}: token dtype code {code} ({_ITEMSIZE.get(code, '?')}-byte) is not "
            "supported (fix: use a uint16 or int32 Megatron dataset)"
        )
    want = head + 4 * n_seq + 8 * n_seq + 8 * n_doc
    if len(data) != want:
        raise DataError(f"{idx_path}: {len(data)} bytes, expected {want} (truncated?)")
    lengths = np.frombuffer(data, dtype="<i4", count=n_seq, offset=head)
    pointers = np.frombuffer(data, dtype="<i8", count=n_seq, offset=head + 4 * n_seq)
    return MegatronIndex(_DTYPES[code], lengths, pointers)


def _link(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(src.resolve(), tmp)
    os.replace(tmp, dst)


def _import_one(prefix: Path, i: int, out: Path) -> tuple[str, ShardEntry, dict[str, Any], bytes]:
    idx = read_megatron_index(prefix.with_suffix(".idx"))
    bin_path = prefix.with_suffix(".bin")
    itemsize = np.dtype(idx.dtype).itemsize
    tokens = int(idx.lengths.sum(dtype=np.int64))
    try:
        size = bin_path.stat().st_size
    except OSError as exc:
        raise DataError(f"{bin_path}: cannot read Megatron data ({exc.strerror})") from exc
    if size != tokens * itemsize:
        raise DataError(f"{bin_path}: {size} bytes, its .idx lists {tokens} tokens of {itemsize} B")
    _link(bin_path, out / shard_file_name(i))
    doc_bytes = (idx.pointers // itemsize).astype("<u8").tobytes()
    (out / doc_file_name(i)).write_bytes(doc_bytes)
    tokens_hash, units = digest_file_with_units(bin_path)
    entry = ShardEntry(
        name=shard_file_name(i),
        tokens=tokens,
        documents=len(idx.pointers),
        tokens_hash=tokens_hash,
        docs_hash=digest_bytes(doc_bytes),
        quick=quick_digest_file(bin_path).hex(),
    )
    source = {"url": str(bin_path), "format": "megatron", "bytes": size, "hash": tokens_hash}
    return idx.dtype, entry, source, units


def import_megatron(
    prefixes: Sequence[str | Path],
    out_dir: str | Path,
    *,
    tokenizer: Tokenizer | str | None = None,
    vocab_size: int | None = None,
) -> Manifest:
    """Make a loadable dataset of Megatron ``PREFIX.bin/.idx`` pairs (one shard each).

    Name the `tokenizer` the data was made with so loaders can check it; without one the
    manifest records an unknown Megatron tokenizer.
    """
    if not prefixes:
        raise DataError("no Megatron prefixes given")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [
        _import_one(Path(str(p).removesuffix(".bin").removesuffix(".idx")), i, out)
        for i, p in enumerate(prefixes)
    ]
    dtypes = {d for d, _, _, _ in parts}
    if len(dtypes) > 1:
        raise DataError(f"Megatron prefixes mix token widths {sorted(dtypes)}")
    if tokenizer is not None:
        meta = tokenizer_meta(load_tokenizer(tokenizer))
    else:
        meta = {
            "name": "megatron (unknown)",
            "hash": digest_bytes(b"megatron-unknown"),
            "vocab_size": vocab_size,
            "eos_id": None,
            "kind": "megatron",
        }
    return write_dataset_metadata(
        out,
        entries=[e for _, e, _, _ in parts],
        dtype=dtypes.pop(),
        shard_tokens=max(e.tokens for _, e, _, _ in parts),
        tokenizer=meta,
        sources=[s for _, _, s, _ in parts],
        extra={"imported_from": "megatron"},
        unit_digests=[u for _, _, _, u in parts],
    )
