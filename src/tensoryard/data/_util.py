"""Small helpers shared by the data modules: hashing, atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

HASH_ALGO = "blake2b"
QUICK_BYTES = 4096


def new_hasher() -> hashlib.blake2b:
    """The content hash used everywhere in manifests (blake2b, 256-bit)."""
    return hashlib.blake2b(digest_size=32)


def digest_bytes(data: bytes | memoryview) -> str:
    """`blake2b:<hex>` of `data`."""
    h = new_hasher()
    h.update(data)
    return f"{HASH_ALGO}:{h.hexdigest()}"


def digest_file(path: Path, chunk: int = 1 << 22) -> str:
    """`blake2b:<hex>` of a file's bytes, read in chunks (constant memory)."""
    h = new_hasher()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return f"{HASH_ALGO}:{h.hexdigest()}"


def quick_digest(head: bytes, tail: bytes, size: int) -> bytes:
    """16-byte fingerprint of a file from its size, first and last few KiB.

    Checked every time the loader first opens a shard: it catches truncation, a swapped file and
    most header damage for the price of two small reads; full hashes are checked on demand.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(size.to_bytes(8, "little"))
    h.update(head)
    h.update(tail)
    return h.digest()


def quick_digest_file(path: Path) -> bytes:
    """`quick_digest` of a file on disk."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(QUICK_BYTES)
        if size > QUICK_BYTES:
            f.seek(max(size - QUICK_BYTES, QUICK_BYTES))
            tail = f.read()
        else:
            tail = b""
    return quick_digest(head, tail, size)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    """`atomic_write_bytes` of pretty, key-sorted JSON (stable bytes, so stable hashes)."""
    atomic_write_bytes(path, canonical_json(obj, indent=1))


def canonical_json(obj: Any, *, indent: int | None = None) -> bytes:
    """Deterministic JSON bytes: sorted keys, no NaN, UTF-8, trailing newline when indented."""
    text = json.dumps(obj, sort_keys=True, indent=indent, allow_nan=False, ensure_ascii=False)
    return (text + ("\n" if indent is not None else "")).encode("utf-8")


def short_hash(obj: Any) -> str:
    """A 16-hex-digit hash of a JSON-able object (config fingerprints)."""
    return hashlib.blake2b(canonical_json(obj), digest_size=8).hexdigest()


def distinct(values: np.ndarray) -> list[int]:
    """Sorted distinct ints of a small array (np.unique imports numpy.ma on first use: 50 ms
    of time to first batch)."""
    return sorted(set(values.tolist()))
