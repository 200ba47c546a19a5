"""The node-local shard cache against a real S3 API on loopback.

`moto_server` runs as a subprocess (a real HTTP S3 endpoint, not a mock of boto). Between the
cache and moto sits a small HTTP proxy that records every object GET and can inject faults into
the next ones: cut the body mid-stream, drop the connection, answer 503 SlowDown, flip a byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

from tensoryard.data import build_loader, prepare
from tensoryard.data.cache import CacheConfig, ShardCache, source_for_url
from tensoryard.data.format import UNIT_BYTES, doc_file_name, shard_file_name, unit_digest
from tensoryard.errors import DataError

BUCKET = "tyard-data"
PREFIX = "corpus/v1"
SHARD_TOKENS = 4096
CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# ---------------------------------------------------------------------------------------------
# moto server, fault-injecting proxy, a prepared dataset uploaded to the bucket


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError(f"moto_server did not listen on {port} within {timeout_s}s")


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        pytest.skip(
            f"moto_server not installed next to {sys.executable} (pip install moto[server])"
        )
    port = _free_port()
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass
class Proxy:
    """Forwards HTTP to moto; records object GETs and applies queued faults to the next ones."""

    upstream: int
    port: int = 0
    faults: deque[str] = field(default_factory=deque)
    delay_s: float = 0.0
    gets: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def shard_gets(self) -> list[str]:
        with self.lock:
            return [g.rsplit("/", 1)[-1] for g in self.gets if g.endswith(".tok")]

    def next_fault(self, path: str) -> str:
        with self.lock:
            self.gets.append(path)
            if path.endswith(".tok") and self.faults:
                return self.faults.popleft()
        return ""


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length", 0) or 0)
            body = self.rfile.read(length) if length else None
            fault = self.next_fault_for_get()
            if fault == "drop":
                self.close_connection = True
                return
            if fault == "503":
                self._reply(503, b"<Error><Code>SlowDown</Code><Message>slow</Message></Error>")
                return
            conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "content-length"}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            if proxy.delay_s and self.command == "GET":
                time.sleep(proxy.delay_s)
            if fault == "corrupt" and data:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            self.send_response(resp.status)
            for key, value in resp.getheaders():
                if key.lower() in ("content-length", "transfer-encoding", "connection"):
                    continue
                # A corrupted body also loses S3's transfer checksum, so only the manifest
                # hash can catch it.
                if fault != "corrupt" or not key.lower().startswith("x-amz-checksum"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if fault == "cut":
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if self.command != "HEAD":
                self.wfile.write(data)

        def next_fault_for_get(self) -> str:
            return proxy.next_fault(self.path.split("?")[0]) if self.command == "GET" else ""

        def _reply(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

    return Handler


@pytest.fixture
def proxy(moto_port: int) -> Iterator[Proxy]:
    p = Proxy(upstream=moto_port)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(p))
    server.daemon_threads = True
    p.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield p
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared dataset of 10 shards of 4096 byte-level tokens."""
    root = tmp_path_factory.mktemp("prepared")
    rnd = random.Random(7)
    src = root / "docs.jsonl"
    with src.open("w") as f:
        for _ in range(150):
            text = "".join(rnd.choice("abcdefgh ") for _ in range(rnd.randint(100, 500)))
            f.write(json.dumps({"text": text}) + "\n")
    prepare([src], "byte", root / "ds", shard_tokens=SHARD_TOKENS)
    return root / "ds"


@pytest.fixture(scope="module")
def bucket(moto_port: int, dataset: Path) -> Iterator[Any]:
    """The prepared dataset uploaded once per module; yields a boto3 client straight to moto.
    Tests that change an object put it back."""
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{moto_port}",
        aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDS["AWS_DEFAULT_REGION"],
    )
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(dataset.iterdir()):
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{path.name}", Body=path.read_bytes())
    yield client


@contextlib.contextmanager
def _replaced(bucket: Any, dataset: Path, name: str, body: bytes | None) -> Iterator[None]:
    """Object `name` replaced by `body` (deleted when None) for the duration of a test."""
    key = f"{PREFIX}/{name}"
    if body is None:
        bucket.delete_object(Bucket=BUCKET, Key=key)
    else:
        bucket.put_object(Bucket=BUCKET, Key=key, Body=body)
    try:
        yield
    finally:
        bucket.put_object(Bucket=BUCKET, Key=key, Body=(dataset / name).read_bytes())


def _num_shards(dataset: Path) -> int:
    return int(json.loads((dataset / "manifest.json").read_text())["num_shards"])


def _cache(
    proxy: Proxy, cache_dir: Path, sleeps: list[float] | None = None, **config: Any
) -> ShardCache:
    cfg = CacheConfig(cache_dir=cache_dir, backoff_s=0.01, **config)
    return ShardCache(
        f"s3://{BUCKET}/{PREFIX}",
        cfg,
        storage_options={"endpoint_url": proxy.endpoint},
        sleep=(sleeps.append if sleeps is not None else time.sleep),
    )


def _wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def _tok_bytes(dataset: Path, i: int) -> bytes:
    return (dataset / shard_file_name(i)).read_bytes()


# ---------------------------------------------------------------------------------------------
# prefetch order and the loader end to end


def test_shards_are_downloaded_ahead_in_the_announced_order_within_the_window(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    order = [5, 2, 7, 1, 9, 0]
    # Whole-file mode (range_bytes=0): prefetch starts on the hint alone.
    cfg = {"prefetch_shards": 3, "download_threads": 1, "range_bytes": 0}
    with _cache(proxy, tmp_path / "c", **cfg) as cache:
        cache.metadata_path("manifest.json")
        cache.hint(order)
        _wait_for(lambda: len(proxy.shard_gets()) == 3)
        time.sleep(0.2)  # nothing beyond the window may follow
        assert proxy.shard_gets() == [shard_file_name(i) for i in order[:3]]
        assert cache.shard_path(5, shard_file_name(5)).read_bytes() == _tok_bytes(dataset, 5)
        # Reading shard 5 moves the window one shard on: shard 1 is next.
        _wait_for(lambda: len(proxy.shard_gets()) == 4)
        assert proxy.shard_gets()[-1] == shard_file_name(1)
        assert cache.stats.hits == 1


def test_the_loader_reads_identical_batches_from_s3_and_from_local_disk(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TYARD_DATA_CACHE_DIR", str(tmp_path / "env-cache"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    remote = build_loader(f"s3://{BUCKET}/{PREFIX}", seq_len=512, global_batch=8, seed=3)
    local = build_loader(dataset, seq_len=512, global_batch=8, seed=3)
    for got, want in zip(remote, local, strict=False):
        np.testing.assert_array_equal(got, want)
        if remote.consumed >= remote.samples_per_epoch:
            break
    source = remote.datasets[0].source
    assert isinstance(source, ShardCache)
    assert source.files.dir == tmp_path / "env-cache"
    # Each shard crossed the network once even though the epoch reads each many times.
    assert sorted(proxy.shard_gets()) == sorted(set(proxy.shard_gets()))
    remote.close()


# ---------------------------------------------------------------------------------------------
# one download per node


RANK_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    from pathlib import Path
    from tensoryard.data.cache import CacheConfig, ShardCache
    from tensoryard.data.format import shard_file_name
    url, endpoint, cache_dir, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    cfg = CacheConfig(cache_dir=Path(cache_dir), prefetch_shards=4)
    with ShardCache(url, cfg, storage_options={"endpoint_url": endpoint}) as cache:
        cache.metadata_path("manifest.json")
        cache.hint(list(range(n)))
        out = {}
        for i in range(n):
            data = cache.shard_path(i, shard_file_name(i)).read_bytes()
            out[i] = hashlib.sha256(data).hexdigest()
            cache.release(i)
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_ranks_on_one_node_share_a_single_download_of_each_shard(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    n = _num_shards(dataset)
    proxy.delay_s = 0.05  # long enough for the ranks to contend for the same shards
    env = os.environ | CREDS
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK_SCRIPT,
                f"s3://{BUCKET}/{PREFIX}",
                proxy.endpoint,
                str(tmp_path / "node-cache"),
                str(n),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(4)
    ]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, err.decode()
        results.append({int(k): v for k, v in json.loads(out).items()})
    want = {i: hashlib.sha256(_tok_bytes(dataset, i)).hexdigest() for i in range(n)}
    assert all(r == want for r in results)
    assert sorted(proxy.shard_gets()) == sorted(shard_file_name(i) for i in range(n))
    leftovers = [p.name for p in (tmp_path / "node-cache").iterdir() if ".tmp-" in p.name]
    assert leftovers == []


SERVICE_RANK_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    from pathlib import Path
    from tensoryard.data.cache import CacheConfig, ShardCache
    from tensoryard.data.format import shard_file_name
    url, endpoint, cache_dir, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    mode = {"always": True, "auto": "auto"}[sys.argv[5]]
    cfg = CacheConfig(
        cache_dir=Path(cache_dir), prefetch_shards=2, fetch_service_idle_s=2, fetch_service=mode
    )
    with ShardCache(url, cfg, storage_options={"endpoint_url": endpoint}) as cache:
        cache.metadata_path("manifest.json")
        cache.hint(list(range(n)))
        out = {}
        for i in range(n):
            data = cache.shard_path(i, shard_file_name(i)).read_bytes()
            out[i] = hashlib.sha256(data).hexdigest()
            cache.release(i)
        service = cache.files.service
        stats = service.stats() if service is not None else None
    print(json.dumps({"digests": out, "service": stats, "boto3": "boto3" in sys.modules}))
    """
)


def _s3_ranks(proxy: Proxy, dataset: Path, tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    n = _num_shards(dataset)
    argv = [f"s3://{BUCKET}/{PREFIX}", proxy.endpoint, str(tmp_path / "node-cache"), str(n), mode]
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", SERVICE_RANK_SCRIPT, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=os.environ | CREDS,
        )
        for _ in range(4)
    ]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, err.decode()
        assert b"fetch service" not in err  # nobody fell back
        results.append(json.loads(out))
    want = {str(i): hashlib.sha256(_tok_bytes(dataset, i)).hexdigest() for i in range(n)}
    assert all(r["digests"] == want for r in results)
    assert sorted(proxy.shard_gets()) == sorted(shard_file_name(i) for i in range(n))
    return results


@pytest.mark.slow
def test_with_static_keys_ranks_read_s3_themselves_without_boto3_each_byte_once(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    """The default (auto): S3 with static keys is read by each rank over the standard-library
    client, no service; the node's ranks still fetch each shard once between them."""
    proxy.delay_s = 0.02
    results = _s3_ranks(proxy, dataset, tmp_path, "auto")
    assert all(r["service"] is None and not r["boto3"] for r in results)


@pytest.mark.slow
def test_ranks_read_s3_through_one_node_service_without_a_client_of_their_own(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    n = _num_shards(dataset)
    proxy.delay_s = 0.02
    results = _s3_ranks(proxy, dataset, tmp_path, "always")
    assert not any(r["boto3"] for r in results)  # the service holds the node's only client
    assert len({r["service"]["pid"] for r in results}) == 1
    by_key = max((r["service"] for r in results), key=lambda s: s["bytes"])["bytes_by_key"]
    for i in range(n):
        assert by_key[shard_file_name(i)] == len(_tok_bytes(dataset, i))
    assert by_key["manifest.json"] == (dataset / "manifest.json").stat().st_size


# ---------------------------------------------------------------------------------------------
# eviction


@pytest.mark.parametrize(
    ("announced", "reads", "mapped", "victim"),
    [
        ([0, 1, 2, 3, 1, 2, 0], [0, 1, 2, 3], [], 0),
        ([0, 1, 2, 3, 0, 2, 1], [0, 1, 2, 3], [], 1),
        ([0, 1, 2, 3, 0, 1], [0, 1, 2, 3], [], 2),
        ([0, 1, 2, 3, 1, 2, 0], [0, 1, 2, 3], [0], 2),
    ],
    ids=[
        "the shard needed last of all is evicted",
        "a different future order picks a different victim",
        "a shard never needed again goes first",
        "a shard the loader still maps is never evicted",
    ],
)
def test_eviction_picks_the_shard_needed_furthest_in_the_future(
    proxy: Proxy,
    bucket: Any,
    dataset: Path,
    tmp_path: Path,
    announced: list[int],
    reads: list[int],
    mapped: list[int],
    victim: int,
) -> None:
    shard_bytes = SHARD_TOKENS * 2
    cfg = {"prefetch_shards": 0, "max_bytes": 3 * shard_bytes + shard_bytes // 2}
    with _cache(proxy, tmp_path / "c", **cfg) as cache:
        cache.metadata_path("manifest.json")
        cache.hint(announced)
        for i in reads:
            cache.shard_path(i, shard_file_name(i))
            if i not in mapped:
                cache.release(i)
        assert [n.split("-", 1)[1] for n in cache.stats.evicted] == [shard_file_name(victim)]
        present = sorted(p.name.split("-", 1)[1] for p in cache.files.dir.glob("*.tok"))
        assert present == sorted(shard_file_name(i) for i in reads if i != victim)


@pytest.mark.parametrize("range_bytes", [0, 1024], ids=["whole files", "ranges"])
def test_a_prefetch_never_evicts_a_shard_needed_sooner_than_itself(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path, range_bytes: int
) -> None:
    shard_bytes = SHARD_TOKENS * 2
    cfg = {"prefetch_shards": 4, "download_threads": 1, "max_bytes": 2 * shard_bytes + 100}
    with _cache(proxy, tmp_path / "c", range_bytes=range_bytes, **cfg) as cache:
        cache.metadata_path("manifest.json")
        cache.hint([0, 1, 2, 3])
        if range_bytes:  # ranged prefetch starts after the first read
            cache.partial_path(0, shard_file_name(0))
            cache.ensure_ranges(0, [(0, 1)])
        _wait_for(lambda: cache.stats.skipped_prefetches >= 1)
        assert cache.stats.evictions == 0
        assert sorted(set(proxy.shard_gets())) == [shard_file_name(0), shard_file_name(1)]


def test_ranged_prefetch_follows_the_announced_order_after_the_first_read(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    order = [5, 2, 7, 1, 9, 0]
    shard_bytes = SHARD_TOKENS * 2
    cfg = {"prefetch_shards": 3, "download_threads": 1, "range_bytes": 1024}
    with _cache(proxy, tmp_path / "c", **cfg) as cache:
        cache.metadata_path("manifest.json")
        cache.hint(order)
        time.sleep(0.2)
        assert proxy.shard_gets() == []  # the first read goes first
        path = cache.partial_path(5, shard_file_name(5))
        cache.ensure_ranges(5, [(3000, 3100)])
        assert path.read_bytes()[3000:3100] == _tok_bytes(dataset, 5)[3000:3100]
        # Then the rest of shard 5 (two requests: before and after the unit read), 2 and 7,
        # each in one request of up to prefetch_get_bytes (16 MiB).
        want = [shard_file_name(i) for i in (5, 5, 5, 2, 7)]
        _wait_for(lambda: len(proxy.shard_gets()) == len(want))
        time.sleep(0.2)  # nothing beyond the window may follow
        assert proxy.shard_gets() == want
        f = cache._file(5, shard_file_name(5))
        _wait_for(lambda: cache.files.present(f))
        assert cache.files.path(f).read_bytes() == _tok_bytes(dataset, 5)
        assert (
            cache.stats.bytes_downloaded
            - sum(
                (Path(cache.meta_dir) / n).stat().st_size
                for n in ("manifest.json", "index.bin", "shards.json", "units.bin")
            )
            == 3 * shard_bytes
        )


# ---------------------------------------------------------------------------------------------
# verification, retries, leftovers


def test_a_corrupted_download_is_fetched_again_and_then_accepted(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    proxy.faults.append("corrupt")
    with _cache(proxy, tmp_path / "c", prefetch_shards=0) as cache:
        path = cache.shard_path(3, shard_file_name(3))
        assert path.read_bytes() == _tok_bytes(dataset, 3)
        assert cache.stats.checksum_mismatches == 1
    assert proxy.shard_gets() == [shard_file_name(3)] * 2


def test_a_remote_shard_that_differs_from_the_manifest_is_an_error_naming_both_hashes(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    original = _tok_bytes(dataset, 4)
    tampered = bytes([original[0] ^ 1]) + original[1:]
    # One checksum unit (1 MiB) holds the whole shard: the error names its two digests.
    assert len(original) <= UNIT_BYTES
    want = unit_digest(original).hex()
    got = unit_digest(tampered).hex()
    cache = _cache(proxy, tmp_path / "c", prefetch_shards=0)
    with _replaced(bucket, dataset, shard_file_name(4), tampered), cache:
        with pytest.raises(DataError) as err:
            cache.shard_path(4, shard_file_name(4))
        assert not cache.files.path(cache._file(4, shard_file_name(4))).exists()
    message = str(err.value)
    assert f"s3://{BUCKET}/{PREFIX}/{shard_file_name(4)}" in message
    assert want in message and got in message
    assert proxy.shard_gets() == [shard_file_name(4)] * 2


@pytest.mark.parametrize(
    "fault",
    ["cut", "drop", "503"],
    ids=[
        "a body cut off halfway",
        "a connection dropped before any answer",
        "a 503 SlowDown answer",
    ],
)
def test_a_transient_failure_is_retried_with_exponential_backoff(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path, fault: str
) -> None:
    proxy.faults.extend([fault, fault])
    sleeps: list[float] = []
    with _cache(proxy, tmp_path / "c", sleeps, prefetch_shards=0) as cache:
        path = cache.shard_path(2, shard_file_name(2))
        assert path.read_bytes() == _tok_bytes(dataset, 2)
        assert cache.stats.retries == 2
    assert sleeps == [0.01, 0.02]
    assert proxy.shard_gets() == [shard_file_name(2)] * 3


def test_persistent_transient_failures_give_up_with_a_clear_error(
    proxy: Proxy, bucket: Any, tmp_path: Path
) -> None:
    proxy.faults.extend(["503"] * 10)
    sleeps: list[float] = []
    cache = _cache(proxy, tmp_path / "c", sleeps, prefetch_shards=0, retries=2)
    with cache, pytest.raises(DataError, match=r"giving up on s3://.*shard-000001\.tok after 3"):
        cache.shard_path(1, shard_file_name(1))
    assert len(sleeps) == 2


def test_a_half_downloaded_temporary_file_is_ignored_and_removed(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    with _cache(proxy, tmp_path / "c", prefetch_shards=0) as cache:
        f = cache._file(6, shard_file_name(6))
        half = _tok_bytes(dataset, 6)[: f.nbytes // 2]
        stale = cache.files.dir / f"{f.local_name}.tmp-99999-deadbeef"
        stale.write_bytes(half)  # what a crashed download leaves behind
        path = cache.shard_path(6, shard_file_name(6))
        assert path.read_bytes() == _tok_bytes(dataset, 6)
        assert not stale.exists()
    assert proxy.shard_gets() == [shard_file_name(6)]


def test_a_truncated_cached_file_is_downloaded_again(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    with _cache(proxy, tmp_path / "c", prefetch_shards=0) as cache:
        path = cache.shard_path(0, shard_file_name(0))
        path.write_bytes(path.read_bytes()[:100])
        assert cache.shard_path(0, shard_file_name(0)).read_bytes() == _tok_bytes(dataset, 0)
    assert proxy.shard_gets() == [shard_file_name(0)] * 2


def test_document_offsets_are_cached_and_verified_too(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    with _cache(proxy, tmp_path / "c", prefetch_shards=0) as cache:
        got = cache.shard_path(1, doc_file_name(1)).read_bytes()
    assert got == (dataset / doc_file_name(1)).read_bytes()


# ---------------------------------------------------------------------------------------------
# permanent errors


def test_a_missing_bucket_is_a_clear_error(proxy: Proxy, tmp_path: Path) -> None:
    cfg = CacheConfig(cache_dir=tmp_path / "c")
    cache = ShardCache(
        "s3://no-such-bucket/x", cfg, storage_options={"endpoint_url": proxy.endpoint}
    )
    with pytest.raises(DataError, match="bucket 'no-such-bucket' does not exist"):
        cache.metadata_path("manifest.json")


def test_a_missing_shard_object_is_a_clear_error(
    proxy: Proxy, bucket: Any, dataset: Path, tmp_path: Path
) -> None:
    cache = _cache(proxy, tmp_path / "c", prefetch_shards=0)
    missing = pytest.raises(DataError, match=r"shard-000008\.tok does not exist \(fix: upload")
    with _replaced(bucket, dataset, shard_file_name(8), None), cache, missing:
        cache.shard_path(8, shard_file_name(8))


def test_missing_credentials_are_a_clear_error(
    proxy: Proxy, bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in CREDS:
        if key != "AWS_DEFAULT_REGION":
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    with pytest.raises(DataError, match=r"no usable AWS credentials .* AWS_ACCESS_KEY_ID"):
        source_for_url(
            f"s3://{BUCKET}/{PREFIX}", CacheConfig(cache_dir=tmp_path / "c")
        ).metadata_path("manifest.json")
