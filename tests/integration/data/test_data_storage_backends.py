"""The node-local shard cache against real HDFS (NameNode + DataNode) and real JuiceFS.

HDFS is a MiniDFSCluster from Hadoop's own jars, read through hdfs-native (``hdfs://``) and
through WebHDFS (``webhdfs://``); JuiceFS is a volume with SQLite metadata and local-directory
object storage, read through its S3 gateway as S3 clients read it. Both are started by
``scripts/storage-testenv`` (see storage_env.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensoryard.data import build_loader, prepare
from tensoryard.data.cache import CacheConfig, ShardCache
from tensoryard.data.format import shard_file_name
from tensoryard.errors import DataError

SHARD_TOKENS = 4096
PREFIX = "corpus/v1"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared dataset of about 10 shards of 4096 byte-level tokens."""
    root = tmp_path_factory.mktemp("prepared")
    rnd = random.Random(11)
    src = root / "docs.jsonl"
    with src.open("w") as f:
        for _ in range(150):
            text = "".join(rnd.choice("abcdefgh ") for _ in range(rnd.randint(100, 500)))
            f.write(json.dumps({"text": text}) + "\n")
    prepare([src], "byte", root / "ds", shard_tokens=SHARD_TOKENS)
    return root / "ds"


@dataclass
class Backend:
    """A prepared dataset uploaded to one real backend."""

    name: str
    url: str
    storage_options: dict[str, Any]
    put: Callable[[str, bytes], None]
    env: dict[str, str]

    def cache(self, cache_dir: Path, **config: Any) -> ShardCache:
        cfg = CacheConfig(cache_dir=cache_dir, backoff_s=0.01, **config)
        return ShardCache(self.url, cfg, storage_options=self.storage_options)


def _hdfs_backend(
    env: Any, dataset: Path, scheme: str, tmp: Path, hdfs_upload: Callable[..., None]
) -> Backend:
    root = f"/{scheme}/{PREFIX}"
    namenode = env["TYARD_HDFS_URL"]

    def put(name: str, body: bytes) -> None:
        local = tmp / name
        local.write_bytes(body)
        hdfs_upload(namenode, {f"{root}/{name}": local})

    hdfs_upload(namenode, {f"{root}/{p.name}": p for p in sorted(dataset.iterdir())})
    base = namenode if scheme == "hdfs" else env["TYARD_WEBHDFS_URL"]
    return Backend(scheme, f"{base}{root}", {}, put, {})


def _juicefs_backend(env: Any, dataset: Path) -> Backend:
    import boto3

    creds = {
        "AWS_ACCESS_KEY_ID": env["TYARD_JUICEFS_S3_ACCESS_KEY"],
        "AWS_SECRET_ACCESS_KEY": env["TYARD_JUICEFS_S3_SECRET_KEY"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    endpoint, bucket = env["TYARD_JUICEFS_S3_ENDPOINT"], env["TYARD_JUICEFS_S3_BUCKET"]
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
        region_name=creds["AWS_DEFAULT_REGION"],
    )

    def put(name: str, body: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"{PREFIX}/{name}", Body=body)

    for path in sorted(dataset.iterdir()):
        put(path.name, path.read_bytes())
    os.environ.update(creds)  # module scope: boto3's default chain in this process
    return Backend("juicefs", f"s3://{bucket}/{PREFIX}", {"endpoint_url": endpoint}, put, creds)


@pytest.fixture(scope="module", params=["hdfs", "webhdfs", "juicefs"])
def backend(request: pytest.FixtureRequest, dataset: Path) -> Backend:
    if request.param == "juicefs":
        return _juicefs_backend(request.getfixturevalue("juicefs"), dataset)
    tmp = request.getfixturevalue("tmp_path_factory").mktemp("hdfs-upload")
    upload = request.getfixturevalue("hdfs_uploader")
    return _hdfs_backend(request.getfixturevalue("hdfs"), dataset, request.param, tmp, upload)


@contextlib.contextmanager
def _replaced(backend: Backend, dataset: Path, name: str, body: bytes) -> Iterator[None]:
    backend.put(name, body)
    try:
        yield
    finally:
        backend.put(name, (dataset / name).read_bytes())


def _num_shards(dataset: Path) -> int:
    return int(json.loads((dataset / "manifest.json").read_text())["num_shards"])


# ---------------------------------------------------------------------------------------------


def test_the_loader_reads_identical_batches_from_the_backend_and_from_local_disk(
    backend: Backend, dataset: Path, tmp_path: Path
) -> None:
    cfg = CacheConfig(cache_dir=tmp_path / "cache")
    source = ShardCache(backend.url, cfg, storage_options=backend.storage_options)
    remote = build_loader(backend.url, sources=[source], seq_len=512, global_batch=8, seed=3)
    local = build_loader(dataset, seq_len=512, global_batch=8, seed=3)
    batches = 0
    for got, want in zip(remote, local, strict=False):
        np.testing.assert_array_equal(got, want)
        batches += 1
        if remote.consumed >= remote.samples_per_epoch:
            break
    assert batches > 5
    source.close()  # waits for the prefetch threads: their counters are final after this
    # The epoch reads every shard many times; each file crossed the network once: the four
    # metadata files and the token shards (document offsets are not needed to train).
    needed = ["manifest.json", "index.bin", "shards.json", "units.bin"]
    needed += [shard_file_name(i) for i in range(_num_shards(dataset))]
    assert source.stats.downloads == len(needed)
    assert source.stats.bytes_downloaded == sum((dataset / n).stat().st_size for n in needed)
    remote.close()


RANK_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    from pathlib import Path
    from tensoryard.data.cache import CacheConfig, ShardCache
    from tensoryard.data.format import shard_file_name
    url, options, cache_dir, n = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    cfg = CacheConfig(cache_dir=Path(cache_dir), prefetch_shards=4)
    with ShardCache(url, cfg, storage_options=options) as cache:
        cache.metadata_path("manifest.json")
        cache.hint(list(range(n)))
        out = {}
        for i in range(n):
            data = cache.shard_path(i, shard_file_name(i)).read_bytes()
            out[i] = hashlib.sha256(data).hexdigest()
            cache.release(i)
    stats = cache.stats
    print(json.dumps({"hashes": out, "downloads": stats.downloads, "meta": stats.metadata_fetches}))
    """
)


@pytest.mark.slow
def test_four_ranks_on_one_node_download_each_shard_once_between_them(
    backend: Backend, dataset: Path, tmp_path: Path
) -> None:
    n = _num_shards(dataset)
    argv = [backend.url, json.dumps(backend.storage_options), str(tmp_path / "node"), str(n)]
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=os.environ | backend.env,
        )
        for _ in range(4)
    ]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=180)
        assert rank.returncode == 0, err.decode()
        results.append(json.loads(out))
    want = {
        str(i): hashlib.sha256((dataset / shard_file_name(i)).read_bytes()).hexdigest()
        for i in range(n)
    }
    assert all(r["hashes"] == want for r in results)
    # Each shard, and the manifest, index, listing and unit digests, crossed the network once
    # for the node.
    assert sum(r["downloads"] for r in results) == n + 4
    assert sum(r["meta"] for r in results) == 4


def test_a_corrupt_shard_is_fetched_again_then_fails_naming_the_shard(
    backend: Backend, dataset: Path, tmp_path: Path
) -> None:
    name = shard_file_name(3)
    body = bytearray((dataset / name).read_bytes())
    body[100] ^= 0xFF
    cache = backend.cache(tmp_path / "c", prefetch_shards=0)
    with _replaced(backend, dataset, name, bytes(body)), cache:
        with pytest.raises(DataError, match=rf"{name} fails verification twice") as err:
            cache.shard_path(3, name)
        assert backend.url.split("://", 1)[1] in str(err.value)
        assert cache.stats.checksum_mismatches == 2
        assert cache.stats.downloads - cache.stats.metadata_fetches == 2


def test_an_unreachable_backend_is_a_clear_error_naming_the_url(
    backend: Backend, tmp_path: Path, closed_port: int
) -> None:
    port = closed_port  # the same dataset path where nothing listens
    options = dict(backend.storage_options)
    if backend.name == "juicefs":
        options["endpoint_url"] = f"http://127.0.0.1:{port}"
        url = backend.url
    else:
        scheme, rest = backend.url.split("://", 1)
        url = f"{scheme}://127.0.0.1:{port}/{rest.split('/', 1)[1]}"
    cfg = CacheConfig(cache_dir=tmp_path / "c", retries=1, backoff_s=0.01)
    with pytest.raises(DataError, match=r"giving up on .*manifest\.json after 2 attempts") as err:
        ShardCache(url, cfg, storage_options=options).metadata_path("manifest.json")
    assert "fix: check" in str(err.value)
    assert f"127.0.0.1:{port}" in str(err.value)


def test_two_dataloader_workers_read_the_same_batches_as_one_process(
    backend: Backend, dataset: Path, tmp_path: Path
) -> None:
    """The rank opens the backend before its workers fork (hdfs-native's runtime does not
    survive a fork: every process reads HDFS through a helper interpreter)."""
    import itertools

    from tensoryard.data import build_torch_loader

    cfg = {"seq_len": 512, "global_batch": 8, "seed": 3}
    source = backend.cache(tmp_path / "cache")
    remote = build_torch_loader(backend.url, sources=[source], num_workers=2, **cfg)  # type: ignore[arg-type]
    local = build_loader(dataset, **cfg)  # type: ignore[arg-type]
    got = [t.numpy() for t in itertools.islice(remote, 12)]
    want = list(itertools.islice(local, 12))
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    remote.close()


def test_download_threads_of_a_forked_worker_share_its_hdfs_helper_safely(
    hdfs: Any, dataset: Path, tmp_path: Path, hdfs_uploader: Callable[..., None]
) -> None:
    """Four threads of a process forked after HDFS was opened fetch different shards at once
    through the one helper; each file arrives whole and verified."""
    backend = _hdfs_backend(hdfs, dataset, "hdfs", tmp_path, hdfs_uploader)
    script = textwrap.dedent(
        """
        import os, sys
        from concurrent.futures import ThreadPoolExecutor
        from pathlib import Path
        from tensoryard.data.cache import CacheConfig, ShardCache
        from tensoryard.data.format import shard_file_name
        cache = ShardCache(sys.argv[1], CacheConfig(cache_dir=Path(sys.argv[2]), prefetch_shards=0))
        cache.metadata_path("manifest.json")  # opens HDFS in this process
        pid = os.fork()
        if pid == 0:
            with ThreadPoolExecutor(4) as pool:
                paths = list(pool.map(lambda i: cache.shard_path(i, shard_file_name(i)), range(8)))
            print(sum(p.stat().st_size for p in paths), flush=True)
            os._exit(0)
        os._exit(os.waitpid(pid, 0)[1])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, backend.url, str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == sum((dataset / shard_file_name(i)).stat().st_size for i in range(8))


def test_a_webhdfs_read_is_two_http_requests_and_a_range_past_the_end_is_a_clear_error(
    hdfs: Any, dataset: Path, tmp_path: Path, hdfs_uploader: Callable[..., None]
) -> None:
    """A read is OPEN at the NameNode, then the DataNode it redirects to: no status request
    before it (fsspec's file object makes one)."""
    from tensoryard.data.stores import WebHdfsStore, open_store

    backend = _hdfs_backend(hdfs, dataset, "webhdfs", tmp_path, hdfs_uploader)
    store = open_store(backend.url)
    assert isinstance(store, WebHdfsStore)
    session = store._fs.session
    sent: list[str] = []
    send = session.send

    def counting(request: Any, **kw: Any) -> Any:
        sent.append(request.url.split("?")[0].split("/", 3)[2])  # host:port
        return send(request, **kw)

    session.send = counting
    name = shard_file_name(2)
    body = (dataset / name).read_bytes()
    got: list[bytes] = []
    store.download_range(name, 100, 3000, got.append, 1 << 20)
    assert b"".join(got) == body[100:3000]
    assert len(sent) == 2 and sent[0] != sent[1]  # the NameNode, then the DataNode
    got.clear()
    sent.clear()
    store.download(name, got.append, 1000)  # a whole file, streamed
    assert b"".join(got) == body and len(got) > 1
    assert len(sent) == 2
    with pytest.raises(DataError, match=rf"bytes {len(body) + 10}-.*{name}.*fix: the file"):
        store.download_range(name, len(body) + 10, len(body) + 20, got.append, 1 << 20)
    with pytest.raises(DataError, match=r"does not exist"):
        store.download_range("shard-999999.tok", 0, 10, got.append, 1 << 20)
