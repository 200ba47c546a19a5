"""The shard cache without services: digests, config, error translation, file:// sources."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensoryard.data import build_loader, prepare
from tensoryard.data.cache import (
    CacheConfig,
    RemoteFile,
    ShardCache,
    TransientError,
    open_store,
)
from tensoryard.data.format import shard_file_name
from tensoryard.data.stores import _translate_s3_client_error
from tensoryard.errors import DataError

SHARD_TOKENS = 2048


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unit-prepared")
    rnd = random.Random(1)
    src = root / "docs.jsonl"
    with src.open("w") as f:
        for _ in range(60):
            text = "".join(rnd.choice("xyz ") for _ in range(rnd.randint(50, 300)))
            f.write(json.dumps({"text": text}) + "\n")
    prepare([src], "byte", root / "ds", shard_tokens=SHARD_TOKENS)
    return root / "ds"


def _cache(dataset: Path, tmp_path: Path, **config: Any) -> ShardCache:
    cfg = CacheConfig(cache_dir=tmp_path / "cache", **config)
    return ShardCache(dataset.as_uri(), cfg)


@pytest.mark.parametrize(
    ("digest", "algorithm", "hexdigest"),
    [
        ("blake2b:" + "ab" * 32, "blake2b", "ab" * 32),
        ("sha256:" + "cd" * 32, "sha256", "cd" * 32),
        ("ef" * 32, "sha256", "ef" * 32),
    ],
    ids=["a blake2b digest", "a sha256 digest", "a bare hex digest means sha256"],
)
def test_a_remote_file_reads_its_digest(digest: str, algorithm: str, hexdigest: str) -> None:
    f = RemoteFile("dir/shard-000001.tok", 10, digest)
    assert (f.algorithm, f.hexdigest) == (algorithm, hexdigest)
    assert f.local_name == f"{hexdigest[:24]}-shard-000001.tok"


def test_the_budget_must_hold_two_of_the_largest_shards(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="raise it to at least 200"):
        CacheConfig(cache_dir=tmp_path, max_bytes=150).validate(100)


def test_the_cache_config_comes_from_the_environment(tmp_path: Path) -> None:
    env = {"TYARD_DATA_CACHE_DIR": str(tmp_path), "TYARD_DATA_CACHE_BYTES": "12345"}
    cfg = CacheConfig.from_env(env)
    assert (cfg.cache_dir, cfg.max_bytes) == (tmp_path, 12345)
    with pytest.raises(DataError, match="TYARD_DATA_CACHE_BYTES='lots' is not an integer"):
        CacheConfig.from_env({"TYARD_DATA_CACHE_BYTES": "lots"})


class _S3Error(Exception):
    def __init__(self, code: str, status: int) -> None:
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


@pytest.mark.parametrize(
    ("code", "status", "expect"),
    [
        ("SlowDown", 503, "transient"),
        ("InternalError", 500, "transient"),
        ("", 429, "transient"),
        ("NoSuchBucket", 404, "bucket 'b' does not exist"),
        ("NoSuchKey", 404, "does not exist (fix: upload"),
        ("AccessDenied", 403, "grant s3:GetObject"),
        ("InvalidAccessKeyId", 403, "rejected the credentials"),
        ("PermanentRedirect", 301, "(fix: set AWS_REGION"),
    ],
    ids=[
        "throttling is retried",
        "a server error is retried",
        "too many requests is retried",
        "a missing bucket names the bucket",
        "a missing object says to upload it",
        "access denied names the permission",
        "bad keys say to refresh them",
        "a bucket in another region names the setting",
    ],
)
def test_s3_errors_are_sorted_into_retryable_and_clear_permanent_ones(
    code: str, status: int, expect: str
) -> None:
    err = _translate_s3_client_error(_S3Error(code, status), "s3://b/k", "b")
    if expect == "transient":
        assert isinstance(err, TransientError)
    else:
        assert isinstance(err, DataError) and expect in str(err)


def test_a_plain_path_and_file_urls_use_fsspec(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"hello")
    chunks: list[bytes] = []
    open_store(tmp_path.as_uri()).download("x.bin", chunks.append, 2)
    assert b"".join(chunks) == b"hello"
    with pytest.raises(DataError, match="does not exist"):
        open_store(str(tmp_path)).download("missing.bin", chunks.append, 2)


def test_the_loader_reads_the_same_batches_through_a_file_url_cache(
    dataset: Path, tmp_path: Path
) -> None:
    cache = _cache(dataset, tmp_path, max_bytes=6 * SHARD_TOKENS * 2)
    cached = build_loader(dataset.as_uri(), seq_len=128, global_batch=4, sources=[cache])
    local = build_loader(dataset, seq_len=128, global_batch=4)
    for _, got, want in zip(range(40), cached, local, strict=False):
        np.testing.assert_array_equal(got, want)
    assert cache.stats.downloads >= 1
    cached.close()
    cache.close()


def test_a_cache_survives_pickling_into_a_dataloader_worker(dataset: Path, tmp_path: Path) -> None:
    cache = _cache(dataset, tmp_path)
    cache.metadata_path("manifest.json")
    clone = pickle.loads(pickle.dumps(cache))
    path = clone.shard_path(1, shard_file_name(1))
    assert path.read_bytes() == (dataset / shard_file_name(1)).read_bytes()
    assert clone.files.dir == cache.files.dir
    clone.close()
    cache.close()


def test_a_read_goes_over_budget_rather_than_evicting_mapped_shards(
    dataset: Path, tmp_path: Path
) -> None:
    shard_bytes = SHARD_TOKENS * 2
    with _cache(dataset, tmp_path, max_bytes=2 * shard_bytes, prefetch_shards=0) as cache:
        paths = [cache.shard_path(i, shard_file_name(i)) for i in range(3)]  # none released
        assert all(p.exists() for p in paths)
        assert cache.stats.evictions == 0


def test_a_stale_temporary_file_of_another_shard_is_removed_when_making_room(
    dataset: Path, tmp_path: Path
) -> None:
    with _cache(dataset, tmp_path, prefetch_shards=0) as cache:
        cache.metadata_path("manifest.json")
        other = cache._file(2, shard_file_name(2))
        stale = cache.files.dir / f"{other.local_name}.tmp-4242-cafe0000"
        stale.write_bytes(b"partial")
        cache.shard_path(0, shard_file_name(0))
        assert not stale.exists()


def _prefetch_in_child(cache: ShardCache, index: int) -> None:
    import time

    cache.hint([index])
    # Ranged prefetch starts after the process's first read: read one byte of the shard; the
    # rest of it can only come from a working prefetch thread.
    cache.ensure_ranges(index, [(0, 1)])
    f = cache._file(index, shard_file_name(index))
    deadline = time.monotonic() + 20
    while not cache.files.present(f):  # only a working prefetch thread can bring it
        if time.monotonic() > deadline:
            raise SystemExit(3)
        time.sleep(0.02)
    raise SystemExit(0)


def test_a_forked_dataloader_worker_gets_its_own_download_threads(
    dataset: Path, tmp_path: Path
) -> None:
    import multiprocessing

    # Units of 512 bytes: a shard is several of them, so the child's one-byte read leaves
    # the rest of the shard to its prefetch threads.
    ranges = {"range_bytes": 512, "prefetch_get_bytes": 1024}
    with _cache(dataset, tmp_path, prefetch_shards=2, **ranges) as cache:
        cache.metadata_path("manifest.json")
        cache.hint([0, 1])
        cache.ensure_ranges(0, [(0, 1)])  # the parent's pool threads exist when it forks
        child = multiprocessing.get_context("fork").Process(
            target=_prefetch_in_child, args=(cache, 4)
        )
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
