"""The node's fetch service (tensoryard.data.fetchd) over file://: real reader processes, a real
service process, the real fsspec store inside it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tensoryard import envvars
from tensoryard.data import prepare
from tensoryard.data.cache import CacheConfig, ShardCache
from tensoryard.data.fetchd import SERVICE_DIR, FetchClient, service_key
from tensoryard.data.format import MANIFEST_NAME, shard_file_name
from tensoryard.errors import DataError

UNIT = 1024
READER = r"""
import hashlib, json, logging, sys, time
from pathlib import Path
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
from tensoryard.data.cache import CacheConfig, ShardCache
from tensoryard.data.format import shard_file_name

url, cache_dir, config, barrier = sys.argv[1:5]
cache = ShardCache(url, CacheConfig(cache_dir=Path(cache_dir), **json.loads(config)))
cache.metadata_path("manifest.json")
shards = len(cache._load_metadata())
cache.hint(list(range(shards)))
digests = []
for i in range(shards):
    if i == 1 and barrier:
        Path(barrier, f"ready-{time.time_ns()}").touch()
        while not Path(barrier, "go").exists():
            time.sleep(0.01)
    name = shard_file_name(i)
    size = cache._file(i, name).nbytes
    cache.partial_path(i, name)
    for start in range(0, size, 3000):
        cache.ensure_ranges(i, [(start, min(size, start + 3000))])
    cache.release(i)
    digests.append(hashlib.sha256(cache.shard_path(i, name).read_bytes()).hexdigest())
    cache.release(i)
service = cache.files.service
stats = service.stats() if service is not None and service.available else None
cache.close()
print(json.dumps({"digests": digests, "service": stats, "boto3": "boto3" in sys.modules}))
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fetchd-prepared")
    rnd = random.Random(5)
    src = root / "docs.jsonl"
    with src.open("w") as f:
        for _ in range(300):
            text = "".join(rnd.choice("abcd ") for _ in range(rnd.randint(200, 800)))
            f.write(json.dumps({"text": text}) + "\n")
    prepare([src], "byte", root / "ds", shard_tokens=16384)
    return root / "ds"


def _config(**overrides: Any) -> dict[str, Any]:
    base = {"range_bytes": UNIT, "prefetch_get_bytes": 4 * UNIT, "prefetch_shards": 2}
    base["fetch_service"] = True  # file:// goes without the service by default
    return base | {"fetch_service_idle_s": 3.0, "backoff_s": 0.01} | overrides


def _readers(
    dataset: Path, cache_dir: Path, n: int, barrier: Path | None = None, **config: Any
) -> list[subprocess.Popen[str]]:
    argv = [dataset.as_uri(), str(cache_dir), json.dumps(_config(**config)), str(barrier or "")]
    return [
        subprocess.Popen(
            [sys.executable, "-c", READER, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[dict[str, Any], str]]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        out.append((json.loads(stdout.strip().splitlines()[-1]), stderr))
    return out


def _want(dataset: Path) -> list[str]:
    shards = sorted(dataset.glob("shard-*.tok"))
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in shards]


def _client(dataset: Path, cache_dir: Path, **config: Any) -> FetchClient:
    cfg = CacheConfig(cache_dir=cache_dir, **_config(**config))
    return FetchClient(
        dataset.as_uri(),
        {},
        cache_dir,
        idle_s=cfg.fetch_service_idle_s,
        timeout_s=cfg.fetch_service_timeout_s,
    )


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        assert time.monotonic() < deadline, f"fetch service {pid} still runs"
        time.sleep(0.05)


def _service_processes(key: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if key.encode() in cmdline and _alive(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def test_four_readers_share_one_service_that_fetches_each_byte_once(
    dataset: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "node"
    results = _finish(_readers(dataset, cache_dir, 4, fetch_service_idle_s=10))
    want = _want(dataset)
    assert len(want) > 3
    for got, stderr in results:
        assert got["digests"] == want
        assert got["service"] is not None, stderr
        assert "fetch service" not in stderr  # no fallback
    assert len({got["service"]["pid"] for got, _ in results}) == 1
    client = _client(dataset, cache_dir, fetch_service_idle_s=10)
    stats = client.stats()
    client.close()
    assert stats is not None and stats["pid"] == results[0][0]["service"]["pid"]
    for shard in dataset.glob("shard-*.tok"):
        assert stats["bytes_by_key"][shard.name] == shard.stat().st_size, shard.name
    assert stats["bytes_by_key"][MANIFEST_NAME] == (dataset / MANIFEST_NAME).stat().st_size
    tokens = sum(p.stat().st_size for p in dataset.glob("shard-*.tok"))
    assert stats["range_requests"] >= tokens // (4 * UNIT)  # every range went through it
    _wait_gone(stats["pid"], timeout_s=60)  # idle_s = 10 after the last reader left


@pytest.mark.parametrize(
    "how",
    ["killed while requests wait on it", "stops answering (request timeout)"],
)
def test_readers_finish_in_process_when_the_service_fails_mid_epoch(
    dataset: Path, tmp_path: Path, how: str
) -> None:
    cache_dir, barrier = tmp_path / "node", tmp_path / "barrier"
    barrier.mkdir()
    timeout = 2.0 if "timeout" in how else 120.0
    procs = _readers(dataset, cache_dir, 4, barrier, fetch_service_timeout_s=timeout)
    deadline = time.monotonic() + 60
    while len(list(barrier.glob("ready-*"))) < 4:  # each has read shard 0 through the service
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.02)
    client = _client(dataset, cache_dir)
    stats = client.stats()
    client.close()
    assert stats is not None and stats["range_requests"] > 0
    pid = stats["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        (barrier / "go").touch()
        if "killed" in how:
            time.sleep(1.0)  # the readers' next requests are sent and wait for an answer
            os.kill(pid, signal.SIGKILL)
        results = _finish(procs)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, timeout_s=10)
    for got, stderr in results:
        assert got["digests"] == _want(dataset)
        assert got["service"] is None
        assert stderr.count("fetch service") == 1, stderr  # one warning per process
    assert not list(cache_dir.glob("*.part"))  # every shard completed and moved into place


def test_two_readers_starting_together_start_one_service(dataset: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "node"
    results = _finish(_readers(dataset, cache_dir, 2, fetch_service_idle_s=10))
    pids = {got["service"]["pid"] for got, _ in results}
    assert len(pids) == 1
    key = service_key(cache_dir, dataset.as_uri(), {})
    log = (cache_dir / SERVICE_DIR / f"{key}.log").read_text()
    assert log.count("INFO serving") == 1, log
    assert _service_processes(key) == list(pids)
    _wait_gone(pids.pop(), timeout_s=60)
    assert _service_processes(key) == []


def test_the_service_exits_when_idle_and_a_later_reader_starts_another(
    dataset: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "node"
    ((first, _),) = _finish(_readers(dataset, cache_dir, 1, fetch_service_idle_s=0.5))
    _wait_gone(first["service"]["pid"], timeout_s=10)
    # The cache is warm now: a new reader fetches nothing, through a new service.
    ((second, _),) = _finish(_readers(dataset, cache_dir, 1, fetch_service_idle_s=0.5))
    assert second["digests"] == _want(dataset)
    assert second["service"]["pid"] != first["service"]["pid"]
    assert second["service"].get("range_requests", 0) == 0
    _wait_gone(second["service"]["pid"], timeout_s=10)


def test_a_reader_fetches_itself_when_the_service_cannot_start(
    dataset: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "node"
    cache_dir.mkdir()
    (cache_dir / SERVICE_DIR).write_text("not a directory")  # nowhere for its lock and log
    ((got, stderr),) = _finish(_readers(dataset, cache_dir, 1))
    assert got["digests"] == _want(dataset)
    assert got["service"] is None
    assert stderr.count("fetch service") == 1, stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_store_reaches_the_reader_naming_the_url_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (
        ("ACCESS_KEY_ID", "k"),
        ("SECRET_ACCESS_KEY", "s"),
        ("REGION", "us-east-1"),
    ):
        monkeypatch.setenv(f"AWS_{name}", value)  # the service inherits them when it starts
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    cfg = CacheConfig(cache_dir=tmp_path / "c", retries=1, backoff_s=0.01, fetch_service=True)
    cache = ShardCache("s3://tyard-missing/corpus", cfg, storage_options={"endpoint_url": endpoint})
    try:
        with pytest.raises(DataError) as err:
            cache.metadata_path(MANIFEST_NAME)
        message = str(err.value)
        assert "s3://tyard-missing/corpus/manifest.json" in message
        assert "fix: check the endpoint URL" in message
        service = cache.files.service
        assert service is not None and service.available  # it came through the service
        stats = service.stats()
        assert stats is not None and stats["transient_errors"] == 2  # retries=1: 2 attempts
    finally:
        cache.close()


def test_readers_import_no_storage_client_on_the_service_path(
    dataset: Path, tmp_path: Path
) -> None:
    # The store inside the service is fsspec here; a reader's own S3 client is lazy: building
    # an S3 store (open_store) imports no boto3 until it fetches for itself.
    code = (
        "import sys; from tensoryard.data.cache import open_store; "
        "open_store('s3://b/p', {'endpoint_url': 'http://127.0.0.1:1'}); "
        "print('boto3' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    ((got, _),) = _finish(_readers(dataset, tmp_path / "node", 1))
    assert got["boto3"] is False


def test_the_setting_turns_the_service_off(dataset: Path, tmp_path: Path) -> None:
    name = envvars.DATA_FETCH_SERVICE.name
    env = {envvars.DATA_CACHE_DIR.name: str(tmp_path / "c"), name: "0"}
    cfg = CacheConfig.from_env(env)
    assert cfg.fetch_service is False
    assert CacheConfig.from_env({envvars.DATA_CACHE_DIR.name: str(tmp_path)}).fetch_service
    with ShardCache(dataset.as_uri(), cfg) as cache:
        assert cache.files.service is None
        cache.metadata_path(MANIFEST_NAME)
    assert not (tmp_path / "c" / SERVICE_DIR).exists()
    with pytest.raises(DataError, match=f"{name}='maybe' is not auto, 1 or 0"):
        CacheConfig.from_env({name: "maybe"})


def test_a_shard_fetched_through_the_service_is_verified_by_the_reader(
    dataset: Path, tmp_path: Path
) -> None:
    cfg = CacheConfig(cache_dir=tmp_path / "c", **_config(prefetch_shards=0))
    with ShardCache(dataset.as_uri(), cfg) as cache:
        name = shard_file_name(0)
        size = cache._file(0, name).nbytes
        cache.partial_path(0, name)
        cache.ensure_ranges(0, [(0, size)])
        assert cache.shard_path(0, name).read_bytes() == (dataset / name).read_bytes()
        assert cache.stats.range_gets == -(-size // (4 * UNIT))
        service = cache.files.service
        assert service is not None and service.available
        stats = service.stats()
        assert stats is not None and stats["bytes_by_key"][name] == size


def test_the_service_holds_prefetches_while_a_demand_read_is_pending(tmp_path: Path) -> None:
    """The service's gate, on its own: a prefetch waits while a demand read runs, and no more
    than `prefetch_limit` prefetches run at once."""
    import threading

    from tensoryard.data.fetchd_service import _Service

    spec = {"root": tmp_path.as_uri(), "options": {}, "idle_s": 1, "threads": 8, "key": "k"}
    service = _Service(spec)
    assert service.prefetch_limit == 2
    entered: list[str] = []

    def prefetch(name: str, hold: threading.Event) -> None:
        with service._turn(prefetch=True):
            entered.append(name)
            hold.wait(10)

    release = threading.Event()
    with service._turn(prefetch=False):  # a demand read in flight
        first = threading.Thread(target=prefetch, args=("p1", release))
        first.start()
        time.sleep(0.2)
        assert entered == []  # held behind the demand read
    first.join(0.01)
    deadline = time.monotonic() + 5
    while entered != ["p1"]:
        assert time.monotonic() < deadline, "the prefetch never ran"
        time.sleep(0.01)
    more = [threading.Thread(target=prefetch, args=(f"p{i}", release)) for i in (2, 3)]
    for t in more:
        t.start()
    time.sleep(0.2)
    assert len(entered) == 2  # p1 and one more: the limit is 2
    release.set()
    for t in [first, *more]:
        t.join(5)
    assert sorted(entered) == ["p1", "p2", "p3"]
    service.pool.shutdown()
