"""Reading preparation inputs (jsonl, plain text, parquet) from local paths or fsspec URLs.

Every input is cut into *chunks* at fixed, content-determined boundaries (about `chunk_bytes`
of text, ending at a newline; or `rows` parquet rows), numbered in input order. Chunk numbering
depends only on the inputs, never on the number of workers, which is what makes preparation
deterministic and resumable at a chunk boundary.
"""

from __future__ import annotations

import glob as _glob
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tensoryard.data._util import HASH_ALGO, new_hasher
from tensoryard.errors import DataError

__all__ = ["Chunk", "InputFile", "expand_inputs", "iter_chunks"]

Format = Literal["jsonl", "text", "parquet"]
_EXT: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".lz4")
# Backends fsspec needs for a protocol, to name in the error when one is missing.
_BACKENDS = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "hdfs": "pyarrow",
    "az": "adlfs",
    "abfs": "adlfs",
    "http": "aiohttp",
    "https": "aiohttp",
}


@dataclass(frozen=True)
class InputFile:
    """One input file: where, which format, and a cheap identity (size + mtime/etag)."""

    url: str
    fmt: Format
    size: int
    stamp: str

    def identity(self) -> dict[str, Any]:
        return {"url": self.url, "format": self.fmt, "size": self.size, "stamp": self.stamp}


@dataclass(frozen=True)
class Chunk:
    """A unit of tokenisation work."""

    index: int  # global chunk number across all inputs
    kind: Literal["jsonl", "text", "texts"]
    payload: bytes | list[str]
    starts_doc: bool  # text chunks: does a new document begin here
    ends_doc: bool  # text chunks: does the document end here (EOS after it)
    where: str  # file and first line, for error messages
    text_field: str = "text"


def _fs_for(url: str) -> tuple[Any, str]:
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)  # type: ignore[no-any-return]
    except ImportError as exc:
        proto = url.split("://", 1)[0]
        pkg = _BACKENDS.get(proto, f"the fsspec backend for {proto}://")
        raise DataError(f"{url}: reading {proto}:// needs {pkg} (fix: pip install {pkg})") from exc
    except ValueError as exc:
        raise DataError(f"{url}: unsupported URL ({exc})") from exc
    except OSError as exc:  # e.g. hdfs:// without a Java runtime / libhdfs
        proto = url.split("://", 1)[0]
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fix = (
            "install a Hadoop client with libhdfs and set JAVA_HOME and HADOOP_HOME"
            if proto == "hdfs"
            else "check the URL and credentials"
        )
        raise DataError(f"{url}: cannot connect to {proto}:// ({first}) (fix: {fix})") from exc


def _format_of(path: str) -> Format:
    name = path.lower()
    for comp in _COMPRESSION:
        name = name.removesuffix(comp)
    for ext, fmt in _EXT.items():
        if name.endswith(ext):
            return fmt
    raise DataError(
        f"{path}: unknown input format (fix: use .jsonl, .txt or .parquet, optionally compressed)"
    )


def expand_inputs(inputs: Sequence[str]) -> list[InputFile]:
    """Expand directories and globs (sorted), detect formats, stat each file."""
    if not inputs:
        raise DataError("no inputs given (fix: pass at least one file, directory or URL)")
    files: list[InputFile] = []
    for raw in inputs:
        fs, path = _fs_for(str(raw))
        proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        try:
            if _glob.has_magic(path):
                paths = sorted(fs.glob(path))
            elif fs.isdir(path):
                paths = sorted(p for p in fs.find(path) if not _is_hidden(p))
            else:
                paths = [path]
            infos = [fs.info(p) for p in paths]
        except FileNotFoundError as exc:
            raise DataError(f"{raw}: no such file or directory") from exc
        except OSError as exc:
            raise DataError(f"{raw}: cannot list ({exc})") from exc
        if not paths:
            raise DataError(f"{raw}: matches no files")
        for p, info in zip(paths, infos, strict=True):
            url = p if proto in ("file", "local") else f"{proto}://{p}"
            files.append(InputFile(url, _format_of(p), int(info.get("size") or 0), _stamp(info)))
    return files


def _is_hidden(path: str) -> bool:
    return path.rsplit("/", 1)[-1].startswith(".")


def _stamp(info: dict[str, Any]) -> str:
    for key in ("mtime", "ETag", "etag", "LastModified", "last_modified", "modificationTime"):
        if info.get(key) is not None:
            return str(info[key])
    return ""


class _Reader:
    """Counts bytes read (for progress) and hashes the content (for the manifest)."""

    def __init__(self) -> None:
        self.hasher = new_hasher()
        self.nbytes = 0

    def feed(self, data: bytes) -> None:
        self.hasher.update(data)
        self.nbytes += len(data)

    @property
    def digest(self) -> str:
        return f"{HASH_ALGO}:{self.hasher.hexdigest()}"


def iter_chunks(
    files: Sequence[InputFile],
    *,
    text_field: str = "text",
    chunk_bytes: int = 1 << 20,
    parquet_rows: int = 1024,
    hashes: dict[str, str] | None = None,
) -> Iterator[Chunk]:
    """Chunks of all inputs in order; fills `hashes[url]` with each file's content hash."""
    index = 0
    for f in files:
        reader = _Reader()
        if f.fmt == "parquet":
            gen: Iterator[Chunk] = _parquet_chunks(f, text_field, parquet_rows, index, reader)
        else:
            gen = _line_chunks(f, text_field, chunk_bytes, index, reader)
        for chunk in gen:
            index += 1
            yield chunk
        if hashes is not None:
            hashes[f.url] = reader.digest


def _open(url: str, mode: str = "rb") -> Any:
    import fsspec

    try:
        return fsspec.open(url, mode, compression="infer").open()
    except ImportError as exc:
        _fs_for(url)  # raises the named-package DataError
        raise DataError(f"{url}: {exc}") from exc
    except OSError as exc:
        raise DataError(f"{url}: cannot open ({exc})") from exc


def _line_chunks(
    f: InputFile, text_field: str, chunk_bytes: int, index: int, reader: _Reader
) -> Iterator[Chunk]:
    kind: Literal["jsonl", "text"] = "jsonl" if f.fmt == "jsonl" else "text"
    line = 1
    first = True
    carry = b""
    with _open(f.url) as fh:
        while True:
            try:
                block = fh.read(chunk_bytes)
            except OSError as exc:
                raise DataError(f"{f.url}: read failed ({exc})") from exc
            reader.feed(block)
            data = carry + block
            if not block:
                # A text file's last chunk carries the document end (EOS), even when empty.
                if data or (kind == "text" and not first):
                    yield Chunk(index, kind, data, first, True, f"{f.url}:{line}", text_field)
                return
            cut = data.rfind(b"\n")
            if cut < 0:  # no newline yet: keep reading (bounded by the longest line)
                carry = data
                continue
            body, carry = data[: cut + 1], data[cut + 1 :]
            yield Chunk(index, kind, body, first, False, f"{f.url}:{line}", text_field)
            index += 1
            first = False
            line += body.count(b"\n")


def _parquet_chunks(
    f: InputFile, text_field: str, rows: int, index: int, reader: _Reader
) -> Iterator[Chunk]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise DataError(f"{f.url}: parquet needs pyarrow (fix: pip install pyarrow)") from exc
    with _open(f.url) as raw:  # content hash over the file's bytes
        while block := raw.read(1 << 22):
            reader.feed(block)
    with _open(f.url) as fh:
        try:
            pf = pq.ParquetFile(fh)
            if text_field not in pf.schema_arrow.names:
                raise DataError(
                    f"{f.url}: no column {text_field!r} (columns: {pf.schema_arrow.names}) "
                    "(fix: --text-field NAME)"
                )
            row = 0
            for batch in pf.iter_batches(batch_size=rows, columns=[text_field]):
                texts = [t if isinstance(t, str) else "" for t in batch.column(0).to_pylist()]
                yield Chunk(index, "texts", texts, True, True, f"{f.url} row {row}", text_field)
                index += 1
                row += len(texts)
        except DataError:
            raise
        except Exception as exc:  # pyarrow raises ArrowInvalid and friends
            raise DataError(f"{f.url}: not a readable parquet file ({exc})") from exc
