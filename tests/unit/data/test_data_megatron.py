"""Existing Megatron .bin/.idx datasets load without copying their tokens."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from tensoryard.data import build_loader, import_megatron, open_dataset, verify_dataset
from tensoryard.errors import DataError


def write_megatron(prefix: Path, docs: list[np.ndarray], code: int = 8) -> None:
    """Write a Megatron MMIDIDX v1 pair (the layout documented in tensoryard.data.megatron)."""
    dtype = {8: np.uint16, 4: np.int32}[code]
    arrays = [d.astype(dtype) for d in docs]
    prefix.with_suffix(".bin").write_bytes(b"".join(a.tobytes() for a in arrays))
    lengths = np.array([len(a) for a in arrays], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1]) * np.dtype(dtype).itemsize])
    doc_idx = np.arange(len(arrays) + 1, dtype="<i8")
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(arrays), len(doc_idx))
    body = lengths.tobytes() + pointers.astype("<i8").tobytes() + doc_idx.tobytes()
    prefix.with_suffix(".idx").write_bytes(head + body)


@pytest.mark.parametrize("code", [8, 4], ids=["uint16 tokens", "int32 tokens"])
def test_megatron_pairs_become_a_verified_loadable_dataset(tmp_path: Path, code: int) -> None:
    rng = np.random.default_rng(0)
    docs_a = [rng.integers(0, 1000, rng.integers(1, 300)) for _ in range(40)]
    docs_b = [rng.integers(0, 1000, rng.integers(1, 300)) for _ in range(25)]
    write_megatron(tmp_path / "a_text_document", docs_a, code)
    write_megatron(tmp_path / "b_text_document", docs_b, code)
    man = import_megatron(
        [tmp_path / "a_text_document", tmp_path / "b_text_document.bin"], tmp_path / "ds"
    )
    stream = np.concatenate(docs_a + docs_b)
    assert man.num_tokens == len(stream) and man.num_shards == 2
    assert man.num_documents == 65
    assert man.dtype == ("uint16" if code == 8 else "uint32")
    verify_dataset(tmp_path / "ds")
    ds = open_dataset(tmp_path / "ds")
    assert np.array_equal(ds.read(0, ds.num_tokens), stream)
    assert ds.documents(1).tolist()[:3] == [0, len(docs_b[0]), len(docs_b[0]) + len(docs_b[1])]
    batch = next(iter(build_loader(tmp_path / "ds", seq_len=50, global_batch=4, shuffle=False)))
    assert np.array_equal(batch[1], stream[50:101])


def test_a_truncated_megatron_bin_is_refused(tmp_path: Path) -> None:
    write_megatron(tmp_path / "x", [np.arange(100)])
    path = tmp_path / "x.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"x\.bin: 198 bytes, its \.idx lists 100 tokens"):
        import_megatron([tmp_path / "x"], tmp_path / "ds")


def test_a_file_that_is_not_a_megatron_index_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.idx").write_bytes(b"not an index at all, really not")
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"x\.idx: not a Megatron MMIDIDX index"):
        import_megatron([tmp_path / "x"], tmp_path / "ds")
