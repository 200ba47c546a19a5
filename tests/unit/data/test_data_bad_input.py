"""Bad data never trains silently: each problem is a DataError naming the file and the fault."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tensoryard.data import build_loader, open_dataset, verify_dataset, write_token_dataset
from tensoryard.data.format import INDEX_NAME, MANIFEST_NAME, SHARDS_NAME, shard_file_name
from tensoryard.data.source import LocalShardSource
from tensoryard.errors import DataError


@pytest.fixture
def dataset(counting_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the counting dataset, free to damage."""
    return Path(shutil.copytree(counting_dir, tmp_path / "ds"))


def read_everything(directory: Path) -> None:
    """Read every shard through both read paths."""
    for io in ("pread", "mmap"):
        ds = open_dataset(directory, io=io)  # type: ignore[arg-type]
        ds.read(0, ds.num_tokens)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_truncated_shard_is_refused_at_open_naming_it_and_both_sizes(dataset: Path) -> None:
    shard = dataset / shard_file_name(3)
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"shard-000003\.tok: 7990 bytes, the index says 4000"):
        read_everything(dataset)


def test_a_corrupt_shard_head_is_caught_by_the_quick_check_at_open(dataset: Path) -> None:
    flip_byte(dataset / shard_file_name(2), 100)
    with pytest.raises(DataError, match=r"shard-000002\.tok: content differs"):
        read_everything(dataset)


def test_corruption_in_the_middle_of_a_shard_is_caught_by_verify(
    write_counting_dataset: Callable[..., Path], tmp_path: Path
) -> None:
    directory = write_counting_dataset(tmp_path / "big", 40_000, 20_000)  # 40 KB shards
    flip_byte(directory / shard_file_name(1), 20_000)  # outside the quick check's 4 KiB ends
    open_dataset(directory).shard_array(1)  # the cheap check cannot see it...
    with pytest.raises(DataError, match=r"shard-000001\.tok: content hash .* differs"):
        verify_dataset(directory)  # ...the full check does
    with pytest.raises(DataError, match="content hash"):
        open_dataset(directory, check="full").shard_array(1)


def test_a_missing_shard_is_named(dataset: Path) -> None:
    (dataset / shard_file_name(5)).unlink()
    with pytest.raises(DataError, match=r"shard-000005\.tok: cannot open shard"):
        read_everything(dataset)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda m: m | {"num_tokens": m["num_tokens"] + 1}, "index.bin"),
        (lambda m: m | {"format_version": 2}, "format_version 2"),
        (lambda m: m | {"dtype": "float32"}, "dtype"),
        (lambda m: m | {"shards_hash": "blake2b:00"}, "dataset_id"),
        (lambda m: {k: v for k, v in m.items() if k != "index_hash"}, "index_hash"),
    ],
    ids=[
        "a token count that disagrees with the index",
        "a format version from the future",
        "a dtype that is not a token type",
        "a shard list hash edited by hand",
        "a missing field",
    ],
)
def test_a_manifest_that_does_not_match_its_shards_is_refused(
    dataset: Path, edit: Callable[[dict[str, object]], dict[str, object]], expected: str
) -> None:
    path = dataset / MANIFEST_NAME
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    with pytest.raises(DataError, match=expected) as err:
        open_dataset(dataset)
    assert str(dataset) in str(err.value)


def test_an_index_from_another_dataset_is_refused(dataset: Path, other_counting_dir: Path) -> None:
    shutil.copy(other_counting_dir / INDEX_NAME, dataset / INDEX_NAME)
    with pytest.raises(DataError, match=r"index\.bin: content hash differs"):
        open_dataset(dataset)


def test_shards_swapped_with_another_dataset_are_refused(
    dataset: Path, other_counting_dir: Path
) -> None:
    shutil.copy(other_counting_dir / shard_file_name(0), dataset / shard_file_name(0))
    with pytest.raises(DataError, match=r"shard-000000\.tok"):
        read_everything(dataset)
    with pytest.raises(DataError, match=r"shard-000000\.tok"):
        verify_dataset(dataset)


def test_a_shard_list_edited_by_hand_fails_verify(dataset: Path) -> None:
    path = dataset / SHARDS_NAME
    path.write_text(path.read_text().replace('"documents": 0', '"documents": 1', 1))
    with pytest.raises(DataError, match=r"shards\.json: content hash differs"):
        verify_dataset(dataset)


def test_a_directory_without_a_manifest_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="tyard data prepare"):
        open_dataset(tmp_path)


def test_data_prepared_with_another_tokenizer_is_refused_naming_both(tmp_path: Path) -> None:
    write_token_dataset(tmp_path / "d", [np.arange(100, dtype=np.uint16)], vocab_size=1000)
    with pytest.raises(DataError, match=r"prepared with tokenizer 'synthetic'.*'byte'"):
        open_dataset(tmp_path / "d", tokenizer="byte")
    with pytest.raises(DataError, match="prepared with tokenizer"):
        build_loader(tmp_path / "d", seq_len=8, global_batch=1, tokenizer="byte")


def test_datasets_of_different_tokenizers_cannot_be_blended(tmp_path: Path) -> None:
    write_token_dataset(tmp_path / "a", [np.arange(100, dtype=np.uint16)], vocab_size=1000)
    write_token_dataset(tmp_path / "b", [np.arange(100, dtype=np.uint16)], vocab_size=2000)
    with pytest.raises(DataError, match="different tokenizers"):
        build_loader([tmp_path / "a", tmp_path / "b"], seq_len=8, global_batch=2)


class HoldCountingSource(LocalShardSource):
    """A local source that counts how often each shard is held and released."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.held: Counter[int] = Counter()
        self.released: Counter[int] = Counter()

    def shard_path(self, index: int, name: str) -> Path:
        self.held[index] += 1
        return super().shard_path(index, name)

    def release(self, index: int) -> None:
        self.released[index] += 1


@pytest.mark.parametrize("io", ["pread", "mmap"], ids=["with pread", "with mmap"])
def test_a_shard_that_fails_its_check_is_released_so_a_cache_may_evict_it(
    dataset: Path, io: str
) -> None:
    flip_byte(dataset / shard_file_name(2), 100)
    source = HoldCountingSource(dataset)
    ds = open_dataset(dataset, source=source, io=io)  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"shard-000002\.tok"):
        ds.read(0, ds.num_tokens)
    assert source.held[2] >= 1
    assert source.released[2] >= 1
