"""One rank of a peer loader's cold start from S3 (run by _data_cold.py in the peer's venv).

``python _data_cold_peer.py LOADER REMOTE CACHE_DIR RANK WORLD WORKERS PORT``

LOADER is ``litdata`` (`StreamingDataset` on an ``s3://`` input dir, cache under CACHE_DIR) or
``streaming`` (mosaicml-streaming's `StreamingDataset` with ``remote=s3://...`` and
``local=CACHE_DIR``). Both are pointed at the S3-compatible endpoint through the environment
(``AWS_ENDPOINT_URL`` for litdata's boto3 client, ``S3_ENDPOINT_URL`` for streaming). The ranks
form a gloo process group first (as a trainer would, before the clock starts) so that each
library shards the epoch over WORLD ranks; each rank reads its share of one epoch with WORKERS
DataLoader workers and prints one JSON line like ``_data_cold_rank.py``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

SEQ_LEN = 2048
SAMPLE = SEQ_LEN + 1
BATCH = 8
SEED = 0


def _litdata(remote: str, cache: str, workers: int) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
    from litdata.streaming.resolver import Dir

    ds = StreamingDataset(
        Dir(path=cache, url=remote),
        item_loader=TokensLoader(block_size=SAMPLE),
        shuffle=True,
        drop_last=True,
        seed=SEED,
        storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]},
    )
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)


def _streaming(remote: str, cache: str, workers: int) -> Any:
    from streaming import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(
        remote=remote, local=cache, shuffle=True, shuffle_seed=SEED, batch_size=BATCH
    )
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)


def main() -> None:
    loader_name, remote, cache = sys.argv[1:4]
    rank, world, workers, port = (int(a) for a in sys.argv[4:8])
    os.environ |= {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
    }
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if loader_name == "litdata":
        import litdata  # noqa: F401  (imports are not loader time, as in _data_cold_rank.py)
    else:
        import streaming  # noqa: F401
    dist.barrier()
    started = time.perf_counter()
    make = _litdata if loader_name == "litdata" else _streaming
    loader = make(remote, cache, workers)
    first: float | None = None
    tokens = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - started
        tensor = batch if isinstance(batch, torch.Tensor) else batch["tokens"]
        tokens += int(tensor.numel())
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out: dict[str, Any] = {
        "rank": rank,
        "first_batch_s": first,
        "tokens": tokens,
        "seconds": seconds,
        "peak_rss_mb": usage / 1024,
        "peak_rss_worker_mb": children / 1024,
    }
    dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
