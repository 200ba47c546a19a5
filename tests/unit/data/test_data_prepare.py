"""Preparation: inputs become exact token streams; runs are atomic and resumable."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tensoryard.data import open_dataset, prepare, verify_dataset
from tensoryard.data.format import MANIFEST_NAME, doc_file_name, shard_file_name
from tensoryard.data.preparation import JOURNAL_NAME
from tensoryard.errors import DataError

EOS = 256
DOCS = [f"document {i}: " + "abc " * (i % 17) + "é" * (i % 3) for i in range(300)]


def stream_of(directory: Path) -> np.ndarray:
    ds = open_dataset(directory)
    return ds.read(0, ds.num_tokens)


def expected_stream(docs: list[str]) -> list[int]:
    out: list[int] = []
    for d in docs:
        out += [*d.encode(), EOS]
    return out


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "n": i}) + "\n" for i, d in enumerate(docs)))
    return path


class Interrupt(Exception):
    """Stands in for a crash in the middle of a run."""


def test_jsonl_documents_become_the_stream_with_eos_after_each(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    result = prepare([src], "byte", tmp_path / "out", shard_tokens=1000, chunk_bytes=700)
    assert stream_of(tmp_path / "out").tolist() == expected_stream(DOCS)
    man = result.manifest
    assert man.num_documents == len(DOCS)
    assert man.num_tokens == len(expected_stream(DOCS))
    assert man.dtype == "uint16" and man.tokenizer["eos_id"] == EOS
    assert man.sources[0]["hash"].startswith("blake2b:")
    verify_dataset(tmp_path / "out")


def test_shards_hold_exactly_shard_tokens_and_document_offsets_are_exact(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    prepare([src], "byte", tmp_path / "out", shard_tokens=1000, chunk_bytes=512)
    ds = open_dataset(tmp_path / "out")
    sizes = [len(ds.shard_array(i)) for i in range(ds.num_shards)]
    assert all(s == 1000 for s in sizes[:-1]) and 0 < sizes[-1] <= 1000
    starts, pos = [], 0
    for d in DOCS:
        starts.append(pos)
        pos += len(d.encode()) + 1
    got = np.concatenate([ds.documents(i) + 1000 * i for i in range(ds.num_shards)])
    assert got.tolist() == starts


def test_a_text_file_is_one_document_however_it_is_chunked(tmp_path: Path) -> None:
    text = "".join(f"line {i} of the book\n" for i in range(500))
    (tmp_path / "book.txt").write_text(text)
    for chunk in (64, 1 << 20):
        out = tmp_path / f"out{chunk}"
        man = prepare([tmp_path / "book.txt"], "byte", out, chunk_bytes=chunk).manifest
        assert stream_of(out).tolist() == [*text.encode(), EOS]
        assert man.num_documents == 1


def test_parquet_gzip_jsonl_and_file_urls_are_read(tmp_path: Path) -> None:
    pq.write_table(pa.table({"body": DOCS[:50]}), tmp_path / "a.parquet")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"body": d}) + "\n" for d in DOCS[50:80])
    inputs = [tmp_path / "a.parquet", f"file://{tmp_path / 'b.jsonl.gz'}"]
    man = prepare(inputs, "byte", tmp_path / "out", text_field="body").manifest
    assert stream_of(tmp_path / "out").tolist() == expected_stream(DOCS[:80])
    assert [s["format"] for s in man.sources] == ["parquet", "jsonl"]


def test_a_directory_input_is_read_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "b.jsonl", DOCS[10:20])
    write_jsonl(tmp_path / "in" / "a.jsonl", DOCS[:10])
    prepare([tmp_path / "in"], "byte", tmp_path / "out")
    assert stream_of(tmp_path / "out").tolist() == expected_stream(DOCS[:20])


def test_an_interrupted_run_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    kw = {"shard_tokens": 500, "chunk_bytes": 300}
    clean = prepare([src], "byte", tmp_path / "clean", **kw).manifest  # type: ignore[arg-type]

    def crash_midway(done: int, total: int) -> None:
        if done > total // 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        prepare([src], "byte", tmp_path / "out", progress=crash_midway, **kw)  # type: ignore[arg-type]
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()  # an unfinished run has no manifest
    assert (tmp_path / "out" / JOURNAL_NAME).exists()
    result = prepare([src], "byte", tmp_path / "out", **kw)  # type: ignore[arg-type]
    assert result.resumed_shards > 0
    assert result.manifest.dataset_id == clean.dataset_id
    for i in range(clean.num_shards):
        for name in (shard_file_name(i), doc_file_name(i)):
            assert (tmp_path / "out" / name).read_bytes() == (
                tmp_path / "clean" / name
            ).read_bytes()
    assert not (tmp_path / "out" / JOURNAL_NAME).exists()
    assert not list((tmp_path / "out").glob(".*tmp*"))


def test_a_damaged_shard_of_an_interrupted_run_is_written_again(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    kw = {"shard_tokens": 500, "chunk_bytes": 300}

    def crash_late(done: int, total: int) -> None:
        if done > total * 3 // 4:
            raise Interrupt

    with pytest.raises(Interrupt):
        prepare([src], "byte", tmp_path / "out", progress=crash_late, **kw)  # type: ignore[arg-type]
    (tmp_path / "out" / shard_file_name(1)).write_bytes(b"garbage")
    result = prepare([src], "byte", tmp_path / "out", **kw)  # type: ignore[arg-type]
    assert result.resumed_shards == 1  # shard 0 kept; 1 and later redone
    verify_dataset(tmp_path / "out")
    assert stream_of(tmp_path / "out").tolist() == expected_stream(DOCS)


def test_a_finished_directory_is_up_to_date_and_other_inputs_rebuild_it(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    first = prepare([src], "byte", tmp_path / "out")
    again = prepare([src], "byte", tmp_path / "out")
    assert again.up_to_date and again.manifest.dataset_id == first.manifest.dataset_id
    write_jsonl(src, DOCS[:5])
    rebuilt = prepare([src], "byte", tmp_path / "out")
    assert not rebuilt.up_to_date
    assert stream_of(tmp_path / "out").tolist() == expected_stream(DOCS[:5])


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "expected"),
    [
        ("bad.jsonl", '{"text": "ok"}\n{"text": oops}\n', {}, r"bad\.jsonl:2: not valid JSON"),
        ("f.jsonl", '{"body": "x"}\n', {}, r"f\.jsonl:1: no string field 'text'.*--text-field"),
        ("data.csv", "a,b\n", {}, r"data\.csv: unknown input format"),
        ("p.parquet", "not parquet", {}, r"p\.parquet: not a readable parquet file"),
        ("x.jsonl", '{"text": "x"}\n', {"shard_tokens": 0}, "shard_tokens must be >= 1"),
    ],
    ids=[
        "a jsonl line that is not JSON is named by file and line",
        "a missing text field points at --text-field",
        "an unknown file type lists the supported ones",
        "a corrupt parquet file is named",
        "a zero shard size is refused",
    ],
)
def test_bad_input_is_a_data_error_naming_the_file(
    tmp_path: Path, name: str, content: str, kwargs: dict[str, int], expected: str
) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=expected):
        prepare([tmp_path / name], "byte", tmp_path / "out", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket/corpus.jsonl", "needs s3fs .*pip install s3fs"),
        ("nope://x/y.jsonl", "unsupported URL"),
        ("/does/not/exist.jsonl", "no such file"),
    ],
    ids=[
        "s3 without its fsspec backend names the package to install",
        "an unknown protocol",
        "a missing local file",
    ],
)
def test_unreachable_inputs_are_clear_errors(tmp_path: Path, url: str, expected: str) -> None:
    pytest.importorskip("fsspec")
    if url.startswith("s3://"):
        try:
            import s3fs  # noqa: F401

            pytest.skip("s3fs is installed here, so the missing-backend error cannot occur")
        except ImportError:
            pass
    with pytest.raises(DataError, match=expected):
        prepare([url], "byte", tmp_path / "out")


def test_a_tokenizer_json_with_a_large_vocabulary_writes_uint32_shards(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(70_000)]
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *words])}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    (tmp_path / "tokenizer.json").write_text(tok.to_str())
    src = write_jsonl(tmp_path / "in.jsonl", ["w0 w69999", "w5 nope"])
    man = prepare([src], tmp_path / "tokenizer.json", tmp_path / "out").manifest
    assert man.dtype == "uint32" and man.tokenizer["eos_id"] == 1
    assert stream_of(tmp_path / "out").tolist() == [2, 70_001, 1, 7, 0, 1]
    with pytest.raises(DataError, match="prepared with tokenizer"):
        open_dataset(tmp_path / "out", tokenizer="byte")
    open_dataset(tmp_path / "out", tokenizer=str(tmp_path / "tokenizer.json"))
