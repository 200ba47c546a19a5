"""Ranged reads of the shard cache over file:// (a real fsspec store, no services)."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.unit.data.recording_store import RecordingStore

from tensoryard.data import build_loader, prepare
from tensoryard.data.cache import CacheConfig, FsspecStore, ShardCache
from tensoryard.data.format import shard_file_name
from tensoryard.errors import DataError

SHARD_TOKENS = 16384
UNIT = 1024


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ranged-prepared")
    rnd = random.Random(3)
    src = root / "docs.jsonl"
    with src.open("w") as f:
        for _ in range(200):
            text = "".join(rnd.choice("abcd ") for _ in range(rnd.randint(200, 800)))
            f.write(json.dumps({"text": text}) + "\n")
    prepare([src], "byte", root / "ds", shard_tokens=SHARD_TOKENS)
    return root / "ds"


def _cache(dataset: Path, cache_dir: Path, store: Any = None, **config: Any) -> ShardCache:
    cfg = CacheConfig(cache_dir=cache_dir, range_bytes=UNIT, prefetch_get_bytes=4 * UNIT, **config)
    return ShardCache(dataset.as_uri(), cfg, store=store)


def _shard_bytes(dataset: Path, i: int) -> bytes:
    return (dataset / shard_file_name(i)).read_bytes()


def test_a_read_waits_only_for_the_units_it_touches(dataset: Path, tmp_path: Path) -> None:
    store = RecordingStore(dataset.as_uri())
    with _cache(dataset, tmp_path / "c", store, prefetch_shards=0) as cache:
        name = shard_file_name(1)
        path = cache.partial_path(1, name)
        cache.ensure_ranges(1, [(5000, 5100), (9 * UNIT - 10, 9 * UNIT + 10)])
        want = _shard_bytes(dataset, 1)
        got = path.read_bytes()
        assert got[5000:5100] == want[5000:5100]
        assert got[9 * UNIT - 10 : 9 * UNIT + 10] == want[9 * UNIT - 10 : 9 * UNIT + 10]
        shard_calls = [c for c in store.calls if c[0] == name]
        # unit 4 (5000..5100) alone, units 8 and 9 together: two requests, three units
        assert sorted(shard_calls) == [(name, 4 * UNIT, 5 * UNIT), (name, 8 * UNIT, 10 * UNIT)]
        assert sum(b - a for _, a, b in shard_calls) == 3 * UNIT < len(want)
        assert cache.stats.range_gets == 2
        assert path.name.endswith(".part")


def test_ranks_on_a_node_fetch_each_unit_once(dataset: Path, tmp_path: Path) -> None:
    stores = [RecordingStore(dataset.as_uri()) for _ in range(3)]
    caches = [_cache(dataset, tmp_path / "node", s, prefetch_shards=0) for s in stores]
    name = shard_file_name(0)
    for k, cache in enumerate(caches):
        cache.partial_path(0, name)
        cache.ensure_ranges(0, [(k * UNIT, (k + 3) * UNIT)])  # overlapping spans
    fetched = [(a, b) for s in stores for key, a, b in s.calls if key == name]
    covered = sorted(u for a, b in fetched for u in range(a // UNIT, -(-b // UNIT)))
    assert covered == list(range(5))  # units 0..4, each once across the three ranks
    for cache in caches:
        cache.close()


def test_a_shard_is_verified_and_moved_into_place_when_its_last_unit_arrives(
    dataset: Path, tmp_path: Path
) -> None:
    with _cache(dataset, tmp_path / "c", prefetch_shards=0) as cache:
        name = shard_file_name(2)
        part = cache.partial_path(2, name)
        n = len(_shard_bytes(dataset, 2))
        cache.ensure_ranges(2, [(0, n // 2)])
        assert part.exists()
        cache.ensure_ranges(2, [(n // 2, n)])
        assert not part.exists()
        final = cache.files.path(cache._file(2, name))
        assert final.read_bytes() == _shard_bytes(dataset, 2)
        # A reader holding the partial path finds the final file (the dataset's open does).
        assert cache.shard_path(2, name) == final


def test_prefetch_fetches_the_rest_of_the_announced_shards_in_large_requests(
    dataset: Path, tmp_path: Path
) -> None:
    store = RecordingStore(dataset.as_uri())
    with _cache(dataset, tmp_path / "c", store, prefetch_shards=2) as cache:
        cache.metadata_path("manifest.json")
        cache.hint([0, 1])
        assert not [c for c in store.calls if c[0].endswith(".tok")]  # nothing before a read
        cache.partial_path(0, shard_file_name(0))
        cache.ensure_ranges(0, [(0, 10)])
        files = [cache._file(i, shard_file_name(i)) for i in (0, 1)]
        deadline = time.monotonic() + 30
        while not all(cache.files.present(f) for f in files):  # only prefetch brings them
            assert time.monotonic() < deadline, "prefetch did not complete the shards"
            time.sleep(0.01)
        sizes = [b - a for key, a, b in store.calls if key.endswith(".tok")]
        assert max(sizes) == 4 * UNIT  # prefetch_get_bytes
        assert sum(sizes) == sum(len(_shard_bytes(dataset, i)) for i in (0, 1))


def test_a_contended_prefetch_fetches_the_free_stretches_of_its_run_in_one_request_each(
    dataset: Path, tmp_path: Path
) -> None:
    """Another reader holds unit 5: the run [4, 8) is fetched as [4, 5) and [6, 8), not unit
    by unit, and unit 5 is left to its holder."""
    store = RecordingStore(dataset.as_uri())
    with _cache(dataset, tmp_path / "c", store, prefetch_shards=0) as cache:
        name = shard_file_name(0)
        cache.partial_path(0, name)
        f = cache._file(0, name)
        st = cache.files._state(f)
        assert st is not None and st.units > 8
        st.claimed.add(5)
        cache.files.prefetch_ranges(f)
        calls = [(a // UNIT, -(-b // UNIT)) for key, a, b in store.calls if key == name]
        assert (4, 5) in calls and (6, 8) in calls and (0, 4) in calls
        assert all(not (a <= 5 < b) for a, b in calls)
        assert not cache.files.present(f)  # unit 5 is still missing
        st.claimed.discard(5)
        cache.files.prefetch_ranges(f)
        assert cache.files.present(f)
        assert cache.files.path(f).read_bytes() == _shard_bytes(dataset, 0)


def _flip(b: bytes) -> bytes:
    return bytes([b[0] ^ 0xFF]) + b[1:] if b else b


def _spoil(key: str, start: int, b: bytes) -> bytes:
    return _flip(b)


def test_a_corrupt_ranged_shard_is_fetched_once_more_as_a_whole(
    dataset: Path, tmp_path: Path
) -> None:
    store = RecordingStore(dataset.as_uri(), alter=_spoil)  # ranges corrupt, whole file fine
    with _cache(dataset, tmp_path / "c", store, prefetch_shards=0) as cache:
        name = shard_file_name(3)
        cache.partial_path(3, name)
        cache.ensure_ranges(3, [(0, len(_shard_bytes(dataset, 3)))])
        assert cache.stats.checksum_mismatches == 1
        assert (name, 0, -1) in store.calls
        assert cache.files.path(cache._file(3, name)).read_bytes() == _shard_bytes(dataset, 3)


def test_a_shard_corrupt_twice_fails_every_reader_naming_it(dataset: Path, tmp_path: Path) -> None:
    class Corrupt(RecordingStore):
        def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
            super().download(key, (lambda b: sink(_flip(b))) if key.endswith(".tok") else sink, 8)

    node = tmp_path / "node"
    name = shard_file_name(4)
    n = len(_shard_bytes(dataset, 4))
    with _cache(dataset, node, Corrupt(dataset.as_uri(), alter=_spoil), prefetch_shards=0) as a:
        a.partial_path(4, name)
        with pytest.raises(DataError, match=rf"{name} fails verification twice.*re-upload"):
            a.ensure_ranges(4, [(0, n)])
        assert a.stats.checksum_mismatches == 2
    # Another rank of the node reading that shard gets the same error, not bad bytes.
    b = _cache(dataset, node, RecordingStore(dataset.as_uri()), prefetch_shards=0)
    with pytest.raises(DataError, match=rf"{name} fails verification twice"):
        b.partial_path(4, name)
    b.close()


def test_the_loader_reads_the_same_batches_through_ranged_reads(
    dataset: Path, tmp_path: Path
) -> None:
    store = RecordingStore(dataset.as_uri())
    cache = _cache(dataset, tmp_path / "c", store, prefetch_shards=0)
    cached = build_loader(dataset.as_uri(), seq_len=64, global_batch=4, sources=[cache])
    local = build_loader(dataset, seq_len=64, global_batch=4)
    for _, (a, b) in zip(range(3), zip(cached, local, strict=False), strict=False):
        np.testing.assert_array_equal(a, b)
    total = sum(
        (dataset / shard_file_name(i)).stat().st_size for i in range(local.datasets[0].num_shards)
    )
    # three batches of random samples need a few units, not the dataset
    ranged = sum(b - a for key, a, b in store.calls if key.endswith(".tok"))
    assert 0 < ranged < total
    cached.close()
    cache.close()


def test_the_first_read_of_a_ranged_shard_fetches_its_samples_units_only(
    dataset: Path, tmp_path: Path
) -> None:
    """No fingerprint units (the shard's first and last 4 KiB) before the first batch: the
    whole-file hash checks the shard once it completes."""
    from tensoryard.data.dataset import TokenDataset

    store = RecordingStore(dataset.as_uri())
    cache = _cache(dataset, tmp_path / "c", store, prefetch_shards=0)
    data = TokenDataset(cache)
    n = int(data._starts[2] - data._starts[1])
    assert n * data._itemsize > 8 * UNIT  # the middle unit is neither the head nor the tail
    middle = int(data._starts[1]) + (n // 2)
    np.testing.assert_array_equal(
        data.read(middle, 8), np.frombuffer(_shard_bytes(dataset, 1), data.dtype)[n // 2 :][:8]
    )
    name = shard_file_name(1)
    units = {(a // UNIT, -(-b // UNIT)) for key, a, b in store.calls if key == name}
    at = (n // 2) * data._itemsize // UNIT
    assert units == {(at, at + 1)}
    cache.close()


def test_a_ranged_shard_that_differs_from_the_manifest_fails_its_reader_once_complete(
    dataset: Path, tmp_path: Path
) -> None:
    """What the skipped fingerprint caught at open is caught by the whole hash: a remote shard
    whose bytes differ (every time) fails the read that completes it, naming the shard."""
    from tensoryard.data.dataset import TokenDataset

    class Corrupt(RecordingStore):
        def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
            super().download(key, (lambda b: sink(_flip(b))) if key.endswith(".tok") else sink, 8)

    cache = _cache(
        dataset, tmp_path / "c", Corrupt(dataset.as_uri(), alter=_spoil), prefetch_shards=0
    )
    data = TokenDataset(cache)
    n = int(data._starts[7] - data._starts[6])
    with pytest.raises(DataError, match=rf"{shard_file_name(6)} fails verification twice"):
        data.read(int(data._starts[6]), n)
    cache.close()


def test_range_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="range_bytes"):
        CacheConfig(cache_dir=tmp_path, range_bytes=-1).validate(10)
    with pytest.raises(DataError, match="prefetch_get_bytes"):
        CacheConfig(cache_dir=tmp_path, range_bytes=4096, prefetch_get_bytes=1024).validate(10)


def test_a_bad_shard_mark_expires_so_a_later_job_tries_again(dataset: Path, tmp_path: Path) -> None:
    class Corrupt(RecordingStore):
        def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
            super().download(key, (lambda b: sink(_flip(b))) if key.endswith(".tok") else sink, 8)

    node = tmp_path / "node"
    name = shard_file_name(5)
    n = len(_shard_bytes(dataset, 5))
    with _cache(dataset, node, Corrupt(dataset.as_uri(), alter=_spoil), prefetch_shards=0) as a:
        a.partial_path(5, name)
        with pytest.raises(DataError, match="fails verification twice"):
            a.ensure_ranges(5, [(0, n)])
    marks = list((node / ".ranges").glob("*.bad"))
    assert len(marks) == 1
    old = time.time() - 301  # older than metadata_max_age_s (300 s)
    os.utime(marks[0], (old, old))
    with _cache(dataset, node, RecordingStore(dataset.as_uri()), prefetch_shards=0) as b:
        b.partial_path(5, name)
        b.ensure_ranges(5, [(0, n)])
        f = b._file(5, name)
        assert b.files.path(f).read_bytes() == _shard_bytes(dataset, 5)
        assert f.local_name not in b.files._states  # handles of a complete shard are dropped
    assert not marks[0].exists()


def test_a_shard_whose_last_unit_another_process_fetched_is_not_downloaded_again_whole(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window that cost CI a second download: one process has every unit of a shard in
    the shared partial file but has not yet moved it into place when another asks for the
    whole shard. The second completes it from the units already there; nothing is fetched."""
    from tensoryard.data.cache import FileCache

    name = shard_file_name(2)
    first_store = RecordingStore(dataset.as_uri())
    with _cache(dataset, tmp_path / "node", first_store, prefetch_shards=0) as first:
        first.partial_path(2, name)
        # The first process is stopped between its last unit and the rename.
        monkeypatch.setattr(FileCache, "_maybe_complete", lambda self, f, st: None)
        first.ensure_ranges(2, [(0, len(_shard_bytes(dataset, 2)))])
        monkeypatch.undo()
        assert len(list((tmp_path / "node").rglob("*.part"))) == 1  # all units in, not moved
        second_store = RecordingStore(dataset.as_uri())
        with _cache(dataset, tmp_path / "node", second_store, prefetch_shards=0) as second:
            got = second.shard_path(2, name).read_bytes()
            assert got == _shard_bytes(dataset, 2)
            assert [c for c in second_store.calls if c[0] == name] == []
            assert second.stats.downloads - second.stats.metadata_fetches == 0
            second.release(2)
        first.release(2)


def test_an_fsspec_range_is_one_request_for_exactly_its_bytes() -> None:
    """A buffered fsspec file (WebHDFS, cloud stores) reads ahead a block beyond what is asked;
    a range goes to the file's fetcher for exactly [start, stop)."""
    import fsspec
    from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

    blob = bytes(range(256)) * 64
    calls: list[tuple[int, int]] = []

    class _File(AbstractBufferedFile):
        def _fetch_range(self, start: int, end: int) -> bytes:
            calls.append((start, end))
            return blob[start:end]

    class _Fs(AbstractFileSystem):
        protocol = "tyardranges"

        def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
            return {"name": path, "size": len(blob), "type": "file"}

        def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> _File:
            return _File(self, path, mode, block_size=1 << 20)

    fsspec.register_implementation("tyardranges", _Fs, clobber=True)
    store = FsspecStore("tyardranges://bucket/data")
    got: list[bytes] = []
    store.download_range("x.tok", 1000, 3000, got.append, 8 << 20)
    assert b"".join(got) == blob[1000:3000]
    assert calls == [(1000, 3000)]
    assert store.wants_fetch_service()  # a remote fsspec client: through the node's service
    assert not FsspecStore("file:///data").wants_fetch_service()  # nothing to share


def test_a_webhdfs_refusal_is_retried_only_where_the_namenode_says_it_passes() -> None:
    """fsspec keeps only the message of the NameNode's RemoteException: a standby NameNode
    or safe mode is transient, a range past the end is a DataError naming the range."""
    from tensoryard.data.stores import TransientError, WebHdfsStore, open_store

    store = open_store("webhdfs://127.0.0.1:9/corpus")  # nothing is contacted yet
    assert isinstance(store, WebHdfsStore)

    def refusing(message: str) -> Any:
        def call(*_a: Any, **_kw: Any) -> Any:
            raise RuntimeError(message)

        return call

    store._fs._call = refusing("Operation category READ is not supported in state standby")
    with pytest.raises(TransientError, match="standby"):
        store.download_range("shard-000000.tok", 0, 10, lambda _: None, 1 << 20)
    store._fs._call = refusing("Offset=8202 out of the range [0, 8192); OPEN")
    with pytest.raises(DataError, match=r"bytes 8202-8300 of webhdfs://.*shard-000000.tok.*fix"):
        store.download_range("shard-000000.tok", 8202, 8300, lambda _: None, 1 << 20)
