"""Dataset preparation: inputs -> tokenized, fixed-size shards + manifest.

Pipeline: the main process reads inputs into numbered chunks (`tensoryard.data.inputs`), a pool
of worker processes tokenizes them, and the main process writes the results *in chunk order*
into shards of exactly `shard_tokens` tokens (the last one shorter). The output bytes therefore
do not depend on the number of workers.

Crash safety: each shard is written to a temporary file and renamed; after every shard a line is
appended to ``.prepare-journal.jsonl`` (the shard's hashes and where the next shard starts, as
(chunk, offset)). A re-run with the same inputs and settings verifies the journalled shards by
hash, skips the chunks they cover (reading, not tokenizing) and continues. The manifest is
written last, so a directory with a manifest is complete.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from tensoryard.data._util import (
    HASH_ALGO,
    QUICK_BYTES,
    digest_bytes,
    digest_file,
    new_hasher,
    quick_digest,
    short_hash,
)
from tensoryard.data.format import (
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    UnitHasher,
    digest_file_with_units,
    doc_file_name,
    read_manifest,
    shard_file_name,
    write_dataset_metadata,
)
from tensoryard.data.inputs import Chunk, InputFile, expand_inputs, iter_chunks
from tensoryard.data.tokenizer import (
    BYTE_EOS_ID,
    ByteTokenizer,
    Tokenizer,
    load_tokenizer,
    token_dtype,
    tokenizer_from_spec,
    tokenizer_meta,
)
from tensoryard.errors import DataError

__all__ = ["DEFAULT_SHARD_TOKENS", "PrepareResult", "prepare", "write_token_dataset"]

DEFAULT_SHARD_TOKENS = 1 << 26  # 64 Mi tokens: 128 MiB shards at uint16
JOURNAL_NAME = ".prepare-journal.jsonl"
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class PrepareResult:
    """What `prepare` produced."""

    out_dir: Path
    manifest: Manifest
    resumed_shards: int  # shards kept from an interrupted run
    up_to_date: bool  # the directory was already complete for these inputs


# ---------------------------------------------------------------------------- workers
_WORKER_TOKENIZER: Any = None


def _init_worker(spec: dict[str, Any]) -> None:
    global _WORKER_TOKENIZER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER_TOKENIZER = tokenizer_from_spec(spec)


def _worker_tokenize(chunk: Chunk, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    return tokenize_chunk(_WORKER_TOKENIZER, chunk, np.dtype(dtype))


def _texts_of(chunk: Chunk) -> list[str]:
    if chunk.kind == "texts":
        assert isinstance(chunk.payload, list)
        return chunk.payload
    assert isinstance(chunk.payload, bytes)
    if chunk.kind == "text":
        return [_decode(chunk)]
    # Split on "\n" only: JSON strings may hold other line separators (U+2028) unescaped.
    lines = [(n, line) for n, line in enumerate(_decode(chunk).split("\n")) if line.strip()]
    records = _parse_records(chunk, lines)
    field = chunk.text_field
    texts = [r.get(field) if isinstance(r, dict) else None for r in records]
    for (n, _), text in zip(lines, texts, strict=True):
        if not isinstance(text, str):
            raise DataError(
                f"{_line_where(chunk, n)}: no string field {field!r} (fix: --text-field NAME)"
            )
    return texts  # type: ignore[return-value]


def _decode(chunk: Chunk) -> str:
    assert isinstance(chunk.payload, bytes)
    return chunk.payload.decode("utf-8", errors="replace")


def _parse_records(chunk: Chunk, lines: list[tuple[int, str]]) -> list[Any]:
    """All lines in one json.loads call (C speed); line by line only to name a bad line."""
    try:
        records = json.loads("[" + ",".join(line for _, line in lines) + "]")
        if isinstance(records, list) and len(records) == len(lines):
            return records
    except ValueError:
        pass
    out = []
    for n, line in lines:
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            raise DataError(f"{_line_where(chunk, n)}: not valid JSON ({exc})") from exc
    return out


def _line_where(chunk: Chunk, n: int) -> str:
    url, _, first = chunk.where.rpartition(":")
    return f"{url}:{int(first) + n}" if first.isdigit() else chunk.where


def tokenize_chunk(
    tok: Tokenizer, chunk: Chunk, dtype: np.dtype[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens with EOS after each finished document, offsets where documents start)."""
    texts = _texts_of(chunk)
    ends = chunk.kind != "text" or chunk.ends_doc
    if isinstance(tok, ByteTokenizer):
        tokens, starts_arr = _byte_tokens(texts, dtype, ends)
    else:
        tokens, starts_arr = _joined(tok.encode_batch(texts) if texts else [], tok, dtype, ends)
    if chunk.kind == "text" and not chunk.starts_doc:
        starts_arr = starts_arr[1:]  # the continuation of a document started in an earlier chunk
    return tokens, starts_arr


def _byte_tokens(
    texts: list[str], dtype: np.dtype[Any], ends: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The byte tokenizer, vectorised over a chunk: one join, one copy, one EOS scatter."""
    raw = [t.encode("utf-8", errors="replace") for t in texts]
    lens = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
    sep = 1 if ends else 0
    starts = np.zeros(len(raw), dtype=np.int64)
    np.cumsum(lens[:-1] + sep, out=starts[1:])
    joined = (b"\0".join(raw) + b"\0") if ends else b"".join(raw)
    tokens = np.frombuffer(joined, dtype=np.uint8).astype(dtype)
    if ends:
        tokens[starts + lens] = BYTE_EOS_ID
    return tokens, starts


def _joined(
    ids: list[np.ndarray], tok: Tokenizer, dtype: np.dtype[Any], ends: bool
) -> tuple[np.ndarray, np.ndarray]:
    eos = np.array([tok.eos_id], dtype=dtype)
    parts: list[np.ndarray] = []
    starts: list[int] = []
    pos = 0
    for arr in ids:
        starts.append(pos)
        parts.append(arr.astype(dtype, copy=False))
        pos += len(arr)
        if ends:
            parts.append(eos)
            pos += 1
    tokens = np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
    return tokens, np.array(starts, dtype=np.int64)


# ---------------------------------------------------------------------------- shard writing
class _ShardWriter:
    """Streams tokens into fixed-size shard files; calls `on_shard` after each rename with the
    shard's entry and its unit digests (units.bin), both computed while it is written."""

    def __init__(
        self,
        out_dir: Path,
        dtype: np.dtype[Any],
        shard_tokens: int,
        first_shard: int,
        on_shard: Callable[[ShardEntry, bytes, int, int], None],
    ) -> None:
        self.out_dir = out_dir
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.index = first_shard
        self.on_shard = on_shard
        self._fh: Any = None

    def _start(self) -> None:
        self._tmp = self.out_dir / f".{shard_file_name(self.index)}.tmp"
        self._fh = open(self._tmp, "wb")  # noqa: SIM115 - spans many feed() calls
        self._hasher = new_hasher()
        self._units = UnitHasher()
        self._head = b""
        self._tail = b""
        self._count = 0
        self._docs: list[np.ndarray] = []

    def feed(self, chunk_index: int, tokens: np.ndarray, doc_starts: np.ndarray) -> None:
        pos = 0
        while pos < len(tokens):
            if self._fh is None:
                self._start()
            take = min(self.shard_tokens - self._count, len(tokens) - pos)
            self._write(tokens[pos : pos + take])
            sel = doc_starts[(doc_starts >= pos) & (doc_starts < pos + take)]
            self._docs.append((sel - pos + self._count).astype(np.uint64))
            self._count += take
            pos += take
            if self._count == self.shard_tokens:
                self.finish(chunk_index, pos)

    def _write(self, arr: np.ndarray) -> None:
        data = arr.astype(self.dtype.newbyteorder("<"), copy=False).tobytes()
        self._fh.write(data)
        self._hasher.update(data)
        self._units.update(data)
        if len(self._head) < QUICK_BYTES:
            self._head += data[: QUICK_BYTES - len(self._head)]
        self._tail = (self._tail + data[-QUICK_BYTES:])[-QUICK_BYTES:]

    def finish(self, next_chunk: int, next_offset: int) -> None:
        """Close the open shard (if any) and publish it; the next shard starts at
        (`next_chunk`, `next_offset`)."""
        if self._fh is None:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        size = self._count * self.dtype.itemsize
        # Same bytes as `quick_digest_file`: the last 4 KiB not already in the head.
        keep = min(QUICK_BYTES, size - QUICK_BYTES)
        tail = self._tail[len(self._tail) - keep :] if keep > 0 else b""
        docs = np.concatenate(self._docs) if self._docs else np.empty(0, dtype=np.uint64)
        doc_bytes = docs.astype("<u8").tobytes()
        doc_tmp = self.out_dir / f".{doc_file_name(self.index)}.tmp"
        doc_tmp.write_bytes(doc_bytes)
        doc_hasher = new_hasher()
        doc_hasher.update(doc_bytes)
        os.replace(doc_tmp, self.out_dir / doc_file_name(self.index))
        os.replace(self._tmp, self.out_dir / shard_file_name(self.index))
        entry = ShardEntry(
            name=shard_file_name(self.index),
            tokens=self._count,
            documents=len(docs),
            tokens_hash=f"{HASH_ALGO}:{self._hasher.hexdigest()}",
            docs_hash=f"{HASH_ALGO}:{doc_hasher.hexdigest()}",
            quick=quick_digest(self._head, tail, size).hex(),
        )
        self.index += 1
        self.on_shard(entry, self._units.digests(), next_chunk, next_offset)


# ---------------------------------------------------------------------------- journal
def _config_of(
    files: list[InputFile], tok: Tokenizer, shard_tokens: int, text_field: str, chunk_bytes: int
) -> dict[str, Any]:
    return {
        "inputs": [f.identity() for f in files],
        "tokenizer": tok.fingerprint(),
        "shard_tokens": shard_tokens,
        "text_field": text_field,
        "chunk_bytes": chunk_bytes,
    }


def _read_journal(out_dir: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Journal records whose shard files still hash right (a torn last line is dropped)."""
    path = out_dir / JOURNAL_NAME
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        head = json.loads(lines[0]) if lines else None
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("config") != config:
        return []  # another configuration: start over
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines[1:]):
        try:
            rec = json.loads(line)
        except ValueError:
            break
        entry = ShardEntry(**rec["entry"])
        if entry.name != shard_file_name(i) or not _shard_intact(out_dir, i, entry):
            break
        records.append(rec)
    return records


def _shard_intact(out_dir: Path, i: int, entry: ShardEntry) -> bool:
    tok, doc = out_dir / shard_file_name(i), out_dir / doc_file_name(i)
    if not (tok.exists() and doc.exists()):
        return False
    return digest_file(tok) == entry.tokens_hash and digest_file(doc) == entry.docs_hash


def _journalled_units(out_dir: Path, i: int, rec: dict[str, Any]) -> bytes:
    """Unit digests of a journalled shard: from the journal, or (a journal written before
    units.bin existed) read from the shard file."""
    if isinstance(rec.get("units"), str):
        return bytes.fromhex(rec["units"])
    return digest_file_with_units(out_dir / shard_file_name(i))[1]


def _write_journal(out_dir: Path, config: dict[str, Any], records: list[dict[str, Any]]) -> Any:
    path = out_dir / JOURNAL_NAME
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"config": config}, sort_keys=True) + "\n")
        for rec in records:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return open(path, "a", encoding="utf-8")


# ---------------------------------------------------------------------------- driver
def _tokenized(
    chunks: Iterator[Chunk], tok: Tokenizer, dtype: np.dtype[Any], workers: int, skip_before: int
) -> Iterator[tuple[Chunk, np.ndarray, np.ndarray]]:
    """(chunk, tokens, doc starts) in chunk order; chunks before `skip_before` are read only."""
    empty = (np.empty(0, dtype=dtype), np.empty(0, dtype=np.int64))
    if workers <= 1:
        for c in chunks:
            yield (c, *empty) if c.index < skip_before else (c, *tokenize_chunk(tok, c, dtype))
        return
    # fork is unsafe beside the progress thread; a forkserver forks clean, pre-imported workers.
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(["tensoryard.data.preparation"])
    with ProcessPoolExecutor(workers, ctx, _init_worker, (tok.spec(),)) as pool:
        window: deque[tuple[Chunk, Future[tuple[np.ndarray, np.ndarray]] | None]] = deque()
        for c in chunks:
            fut = None if c.index < skip_before else pool.submit(_worker_tokenize, c, dtype.str)
            window.append((c, fut))
            while len(window) > 3 * workers:  # bounded memory: a few chunks per worker
                yield _resolve(window.popleft(), empty)
        while window:
            yield _resolve(window.popleft(), empty)


def _resolve(
    item: tuple[Chunk, Future[tuple[np.ndarray, np.ndarray]] | None],
    empty: tuple[np.ndarray, np.ndarray],
) -> tuple[Chunk, np.ndarray, np.ndarray]:
    c, fut = item
    return (c, *empty) if fut is None else (c, *fut.result())


def prepare(
    inputs: Sequence[str | Path],
    tokenizer: Tokenizer | str,
    out_dir: str | Path,
    *,
    workers: int = 1,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    text_field: str = "text",
    eos_token: str = "",
    chunk_bytes: int = 1 << 20,
    progress: ProgressFn | None = None,
) -> PrepareResult:
    """Tokenize `inputs` into shards under `out_dir`; deterministic, atomic and resumable.

    `progress(done_bytes, total_bytes)` is called as input is consumed.
    """
    if shard_tokens < 1:
        raise DataError(f"shard_tokens must be >= 1, got {shard_tokens}")
    if workers < 1:
        raise DataError(f"workers must be >= 1, got {workers}")
    tok = load_tokenizer(
        tokenizer if not isinstance(tokenizer, Path) else str(tokenizer), eos_token=eos_token
    )
    files = expand_inputs([str(i) for i in inputs])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = _config_of(files, tok, shard_tokens, text_field, chunk_bytes)
    config_id = short_hash(config)
    done = _existing(out, config_id)
    if done is not None:
        return PrepareResult(out, done, resumed_shards=done.num_shards, up_to_date=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)  # stale manifest of other inputs
    records = _read_journal(out, config)
    journal = _write_journal(out, config, records)
    dtype = token_dtype(tok.vocab_size)
    entries = [ShardEntry(**r["entry"]) for r in records]
    units = [_journalled_units(out, i, r) for i, r in enumerate(records)]
    start_chunk, start_off = (
        (records[-1]["next_chunk"], records[-1]["next_offset"]) if records else (0, 0)
    )

    def on_shard(entry: ShardEntry, digests: bytes, next_chunk: int, next_offset: int) -> None:
        entries.append(entry)
        units.append(digests)
        rec = {"entry": entry.as_dict(), "next_chunk": next_chunk, "next_offset": next_offset}
        rec["units"] = digests.hex()
        journal.write(json.dumps(rec, sort_keys=True) + "\n")
        journal.flush()
        os.fsync(journal.fileno())

    writer = _ShardWriter(out, dtype, shard_tokens, len(entries), on_shard)
    hashes: dict[str, str] = {}
    total = sum(f.size for f in files)
    seen = 0
    try:
        chunks = iter_chunks(files, text_field=text_field, chunk_bytes=chunk_bytes, hashes=hashes)
        last = start_chunk
        for chunk, tokens, docs in _tokenized(chunks, tok, dtype, workers, start_chunk):
            last = chunk.index
            if chunk.index == start_chunk and start_off:
                tokens, docs = tokens[start_off:], docs[docs >= start_off] - start_off
            writer.feed(chunk.index, tokens, docs)
            seen += _payload_size(chunk)
            if progress is not None:
                progress(min(seen, total), total)
        writer.finish(last + 1, 0)
    finally:
        journal.close()
    sources = [
        {"url": f.url, "format": f.fmt, "bytes": f.size, "hash": hashes.get(f.url, "")}
        for f in files
    ]
    man = write_dataset_metadata(
        out,
        entries=entries,
        dtype=dtype.name,
        shard_tokens=shard_tokens,
        tokenizer=tokenizer_meta(tok),
        sources=sources,
        extra={"prepare_config": config_id, "text_field": text_field},
        unit_digests=units,
    )
    (out / JOURNAL_NAME).unlink(missing_ok=True)
    return PrepareResult(out, man, resumed_shards=len(records), up_to_date=False)


def _payload_size(chunk: Chunk) -> int:
    if isinstance(chunk.payload, bytes):
        return len(chunk.payload)
    return sum(len(t) for t in chunk.payload)


def _existing(out: Path, config_id: str) -> Manifest | None:
    """The manifest already in `out` if it was made from the same inputs and settings."""
    if not (out / MANIFEST_NAME).exists():
        return None
    try:
        man = read_manifest(out)
    except DataError:
        return None
    return man if man.extra.get("prepare_config") == config_id else None


def write_token_dataset(
    out_dir: str | Path,
    documents: Iterable[np.ndarray],
    *,
    vocab_size: int,
    eos_id: int | None = None,
    tokenizer: Tokenizer | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
) -> Manifest:
    """Write already tokenized documents as a prepared dataset (synthetic corpora, imports).

    Each array is one document; EOS is appended after it when `eos_id` is given (pass None to
    write a raw token stream, e.g. one huge array for a benchmark). Without `tokenizer` the
    manifest records a synthetic tokenizer identified by (vocab_size, eos_id).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(vocab_size)
    entries: list[ShardEntry] = []
    units: list[bytes] = []

    def on_shard(entry: ShardEntry, digests: bytes, _chunk: int, _offset: int) -> None:
        entries.append(entry)
        units.append(digests)

    writer = _ShardWriter(out, dtype, shard_tokens, 0, on_shard)
    eos = None if eos_id is None else np.array([eos_id], dtype=dtype)
    for i, doc in enumerate(documents):
        arr = np.asarray(doc)
        start = np.zeros(1, dtype=np.int64)
        writer.feed(i, arr, start)
        if eos is not None:  # an empty document is just its EOS, which then starts it
            writer.feed(i, eos, start if len(arr) == 0 else start[:0])
    writer.finish(0, 0)
    if tokenizer is not None:
        meta = tokenizer_meta(tokenizer)
    else:
        ident = f"synthetic:{vocab_size}:{eos_id}".encode()
        meta = {
            "name": "synthetic",
            "hash": digest_bytes(ident),
            "vocab_size": vocab_size,
            "eos_id": eos_id,
            "kind": "synthetic",
        }
    return write_dataset_metadata(
        out,
        entries=entries,
        dtype=dtype.name,
        shard_tokens=shard_tokens,
        tokenizer=meta,
        sources=[],
        unit_digests=units,
    )
