"""Preparation in real worker processes: the output never depends on the worker count."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tensoryard.data import prepare
from tensoryard.data.format import doc_file_name, shard_file_name

documents = st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=120)


def dataset_bytes(directory: Path, num_shards: int) -> list[bytes]:
    names = [f(i) for i in range(num_shards) for f in (shard_file_name, doc_file_name)]
    return [(directory / n).read_bytes() for n in [*names, "index.bin", "shards.json"]]


@settings(max_examples=6, deadline=None)
@given(
    docs=documents,
    shard_tokens=st.integers(1, 2000),
    chunk_bytes=st.integers(64, 4096),
    workers=st.sampled_from([2, 3]),
)
def test_preparation_is_byte_identical_for_any_number_of_workers(
    docs: list[str], shard_tokens: int, chunk_bytes: int, workers: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        half = len(docs) // 2
        (root / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:half]))
        (root / "b.txt").write_text("\n".join(docs[half:]))
        inputs = [root / "a.jsonl", root / "b.txt"]
        kw = {"shard_tokens": shard_tokens, "chunk_bytes": chunk_bytes}
        one = prepare(inputs, "byte", root / "one", workers=1, **kw).manifest  # type: ignore[arg-type]
        many = prepare(inputs, "byte", root / "many", workers=workers, **kw).manifest  # type: ignore[arg-type]
        assert many.dataset_id == one.dataset_id
        assert dataset_bytes(root / "many", many.num_shards) == dataset_bytes(
            root / "one", one.num_shards
        )
