"""One rank of the cold-start benchmark (run by _data_cold.py, one process per rank).

Reads this rank's share of one epoch from a remote URL through the node-local shard cache,
with DataLoader workers, and prints one JSON line: time to first batch, tokens, seconds, peak
RSS, and the node fetch service's counters as this rank last saw them (the rank that finishes
last sees every fetch of the epoch). A process that fetches for itself (service off or failed)
appends the files it fetched from the backend to ``STATS_DIR/<pid>.log`` through a counting
wrapper around the real store.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (imported before the clock starts: imports are not loader time)

from tensoryard.data import build_torch_loader
from tensoryard.data.cache import CacheConfig, RemoteStore, ShardCache, open_store


class CountingStore:
    """A `RemoteStore` that logs every fetch (key, bytes) of this process to a file."""

    def __init__(self, inner: RemoteStore, stats_dir: str) -> None:
        self.inner, self.stats_dir = inner, stats_dir

    def url(self, key: str) -> str:
        return self.inner.url(key)

    def wants_fetch_service(self) -> bool:
        wants = getattr(self.inner, "wants_fetch_service", None)
        return bool(wants()) if callable(wants) else True

    def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
        got = 0

        def counting(chunk: bytes) -> None:
            nonlocal got
            got += len(chunk)
            sink(chunk)

        self.inner.download(key, counting, chunk_bytes)
        with open(Path(self.stats_dir) / f"{os.getpid()}.log", "a") as log:
            log.write(f"{key} {got}\n")

    def download_range(
        self, key: str, start: int, stop: int, sink: Callable[[bytes], None], chunk_bytes: int
    ) -> None:
        got = 0

        def counting(chunk: bytes) -> None:
            nonlocal got
            got += len(chunk)
            sink(chunk)

        self.inner.download_range(key, start, stop, counting, chunk_bytes)  # type: ignore[attr-defined]
        with open(Path(self.stats_dir) / f"{os.getpid()}.log", "a") as log:
            log.write(f"{key} {got}\n")


def main() -> None:
    url, options, cache_dir, stats_dir = sys.argv[1:5]
    rank, world, workers = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    seq_len, global_batch = int(sys.argv[8]), int(sys.argv[9])
    started = time.perf_counter()
    local = "://" not in url
    source = None
    if not local:
        # Fetches go through the node's fetch service where the defaults (or
        # TYARD_DATA_FETCH_SERVICE) use it, and it counts them; the counting store counts what
        # a process fetches itself (the service off or not wanted by the store, or failed).
        store = CountingStore(open_store(url, json.loads(options)), stats_dir)
        cfg = CacheConfig(
            cache_dir=Path(cache_dir), fetch_service=CacheConfig.from_env().fetch_service
        )
        source = ShardCache(
            url, cfg, store=store, storage_options=json.loads(options), fetch_service=True
        )
    loader = build_torch_loader(
        url,
        sources=[source],
        seq_len=seq_len,
        global_batch=global_batch,
        rank=rank,
        world_size=world,
        num_workers=workers,
    )
    per_epoch = loader.loader.samples_per_epoch // global_batch
    loader.num_batches = per_epoch
    first: float | None = None
    tokens = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - started
        tokens += batch.numel()
    seconds = time.perf_counter() - started
    loader.close()
    service = None
    if source is not None:
        client = source.files.service
        service = client.stats() if client is not None and client.available else None
        source.close()
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out: dict[str, Any] = {
        "rank": rank,
        "first_batch_s": first,
        "tokens": tokens,
        "seconds": seconds,
        "batches": per_epoch,
        "peak_rss_mb": usage / 1024,
        "peak_rss_worker_mb": children / 1024,
        "service": service,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
