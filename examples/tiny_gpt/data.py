"""The training text, prepared once into a tensoryard token dataset.

The corpus is text every machine has offline: the Python standard library's own top-level
``*.py`` files, sorted, one document each, byte-level tokens (256 = end of document).
`ensure_dataset` turns it into a prepared dataset (`tensoryard.data.prepare`) under a data
directory shared by every attempt of a job::

    <data-dir>/
        .prepare.lock          flock: one preparer at a time (ranks, nodes, jobs)
        stdlib-<key>.jsonl     the corpus snapshot, one {"path", "text"} record per file
        stdlib-<key>/          the prepared dataset (manifest.json written last)

``<key>`` fingerprints the interpreter's source files (names, sizes, mtimes) and
``max_bytes``, so another Python or another ``--max-bytes`` gets its own dataset and never
rewrites one that a running job reads. Both steps are atomic: the snapshot is written to a
temporary file and renamed; `prepare` writes the manifest last and resumes from its journal,
so a killed preparation never leaves a directory that looks complete. A later attempt finds
the dataset up to date in milliseconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import sys
import sysconfig
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tensoryard.data import PrepareResult, prepare
from tensoryard.errors import DataError, TensoryardError

if TYPE_CHECKING:
    from tensoryard.runtime import DistContext

__all__ = [
    "INSTRUCTION_TEMPLATE",
    "Corpus",
    "default_data_dir",
    "documents",
    "ensure_dataset",
    "prepare_corpus",
    "stdlib_sources",
]

log = logging.getLogger("tiny_gpt.data")

LOCK_NAME = ".prepare.lock"


def stdlib_sources() -> list[Path]:
    """The top-level *.py files of the standard library, sorted (about 4-5 MB)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise DataError(f"no *.py files under {root} (the standard library's source)")
    return files


def default_data_dir(env: Mapping[str, str]) -> Path:
    """``$TYARD_RUN_DIR/../data/tiny-gpt-stdlib``: next to the job's run directory, so every
    attempt of the job (and later jobs of the same control plane) reuse one prepared copy.
    Where that parent is not writable (a pod that mounts only its job's run directory), inside
    the run directory: every attempt of the job still reuses it."""
    run_dir = Path(env.get("TYARD_RUN_DIR") or os.path.join(".tyard", "tiny-gpt-local")).resolve()
    shared = run_dir.parent / "data"
    if shared.is_dir() or not run_dir.parent.is_dir() or os.access(run_dir.parent, os.W_OK):
        return shared / "tiny-gpt-stdlib"
    return run_dir / "tiny-gpt-data"


@dataclass(frozen=True)
class Corpus:
    """Which files, cut at how many bytes, and the key naming their snapshot."""

    files: tuple[Path, ...]
    max_bytes: int | None = None
    label: str = "stdlib"

    @classmethod
    def stdlib(cls, *, max_bytes: int | None = None) -> Corpus:
        if max_bytes is not None and max_bytes < 2:
            raise DataError(f"--max-bytes {max_bytes}: must be at least 2 (or left out)")
        return cls(tuple(stdlib_sources()), max_bytes)

    @classmethod
    def from_files(cls, files: Sequence[Path], *, max_bytes: int | None = None) -> Corpus:
        """Text files (one document each) or instruction sets (``.jsonl`` of
        ``{"instruction", "response"}``, one document per record; see `documents`)."""
        missing = [str(f) for f in files if not Path(f).is_file()]
        if missing:
            raise DataError(f"--text-file {missing[0]} does not exist (fix: check the path)")
        return cls(tuple(Path(f).resolve() for f in files), max_bytes, label="text")

    @property
    def key(self) -> str:
        """A short fingerprint of the inputs: their names, sizes and mtimes, and max_bytes."""
        h = hashlib.blake2b(digest_size=6)
        h.update(f"{sys.version_info[:2]}|{self.max_bytes}".encode())
        for path in self.files:
            st = path.stat()
            h.update(f"|{path}|{st.st_size}|{st.st_mtime_ns}".encode())
        return h.hexdigest()

    def texts(self) -> Iterator[tuple[str, str]]:
        """(file name, text) of each document, the last one cut so the total is max_bytes."""
        left = self.max_bytes
        for path in self.files:
            for name, data in documents(path):
                if left is not None:
                    data = data[:left]
                    left -= len(data)
                if data:
                    yield name, data.decode("utf-8", errors="replace")
                if left == 0:
                    return


INSTRUCTION_TEMPLATE = "### Instruction:\n{instruction}\n### Response:\n{response}\n"
"""How an instruction record becomes training text (and evaluation text)."""


def documents(path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, UTF-8 bytes) of each document in a file: the whole file, or for ``.jsonl`` one
    document per ``{"instruction": ..., "response": ...}`` record."""
    if path.suffix != ".jsonl":
        yield path.name, path.read_bytes()
        return
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                text = INSTRUCTION_TEMPLATE.format(
                    instruction=record["instruction"], response=record["response"]
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(
                    f"{path}:{number} is not an instruction record ({exc}); fix: write "
                    '{"instruction": "...", "response": "..."} on each line'
                ) from exc
            yield f"{path.name}:{number}", text.encode("utf-8")


def _write_snapshot(corpus: Corpus, path: Path) -> None:
    """The corpus as jsonl (an input format `prepare` reads), written atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as out:
            for name, text in corpus.texts():
                out.write(json.dumps({"path": name, "text": text}) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Hold an exclusive flock on the data directory; the kernel drops it if we are killed."""
    with (data_dir / LOCK_NAME).open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def prepare_corpus(corpus: Corpus, data_dir: Path) -> PrepareResult:
    """Snapshot and prepare `corpus` under `data_dir` (idempotent; safe across processes)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with _locked(data_dir):
            key = corpus.key
            snapshot = data_dir / f"{corpus.label}-{key}.jsonl"
            if not snapshot.exists():
                _write_snapshot(corpus, snapshot)
            return prepare([snapshot], "byte", data_dir / f"{corpus.label}-{key}")
    except OSError as exc:
        raise DataError(
            f"cannot prepare the training data in {data_dir}: {exc.strerror or exc} "
            "(fix: pass a writable --data-dir)"
        ) from exc


def ensure_dataset(corpus: Corpus, data_dir: Path, dist: DistContext) -> Path:
    """The prepared dataset's directory, on every rank (collective).

    Local rank 0 of each node prepares (under the file lock, so nodes that share storage take
    turns and the later ones find it up to date); the all-gather is the barrier, and it carries
    any error to every rank so none waits for a peer that gave up. Each rank reads the
    directory its own node's preparer named.
    """
    outcome: tuple[str, str] | None = None
    if dist.local_rank == 0:
        try:
            result = prepare_corpus(corpus, data_dir)
            outcome = ("ok", str(result.out_dir))
            _log_result(result)
        except TensoryardError as exc:
            outcome = ("error", str(exc))
    outcomes: Sequence[tuple[str, str] | None] = dist.all_gather_object(outcome)
    errors = [o[1] for o in outcomes if o is not None and o[0] == "error"]
    if errors:
        raise DataError(errors[0])
    mine = outcomes[dist.rank - dist.local_rank]  # torchrun numbers a node's ranks together
    if mine is None:
        raise DataError(f"rank {dist.rank}: no local rank 0 prepared the data on this node")
    return Path(mine[1])


def _log_result(result: PrepareResult) -> None:
    man = result.manifest
    state = "up to date" if result.up_to_date else "prepared"
    log.info(
        "dataset %s %s: %d documents, %d tokens, %d shard(s)",
        result.out_dir,
        state,
        man.num_documents,
        man.num_tokens,
        man.num_shards,
    )
