"""A short all-reduce with torch.distributed: NCCL on GPUs, gloo on CPUs.

Bus bandwidth follows nccl-tests' definition for all-reduce
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
``busbw = bytes / time * 2 * (n - 1) / n``, comparable across process counts.
Each process times ``iters`` all-reduces after ``warmup`` untimed ones; the slowest rank's time
counts. The result is also checked (every element must equal the sum of the ranks' values).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["AllReduceResult", "run_allreduce"]


@dataclass(frozen=True)
class AllReduceResult:
    """What one all-reduce run measured."""

    backend: str
    world_size: int
    size_bytes: int
    iters: int
    seconds_per_iter: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int, world: int, port: int, backend: str, numel: int, iters: int, warmup: int, out: str
) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        data = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(data)
        _sync(backend)
        data.fill_(float(rank + 1))
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data)
        _sync(backend)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        # after `iters` sums of world values starting from rank+1: total * world**(iters-1)
        expected = sum(range(1, world + 1)) * world ** (iters - 1)
        correct = bool(torch.allclose(data, torch.full_like(data, float(expected)), rtol=1e-4))
        flags = torch.tensor([1 if correct else 0], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        if rank == 0:
            Path(out).write_text(
                json.dumps({"elapsed": float(elapsed.item()), "correct": bool(flags.item())})
            )
    finally:
        dist.destroy_process_group()


def _sync(backend: str) -> None:
    if backend == "nccl":
        import torch

        torch.cuda.synchronize()


def run_allreduce(
    *,
    world_size: int = 2,
    size_bytes: int = 8 * 1024 * 1024,
    iters: int = 5,
    warmup: int = 2,
    backend: str | None = None,
) -> AllReduceResult:
    """Spawn `world_size` processes and time `iters` all-reduces of `size_bytes` float32."""
    import torch
    from torch.multiprocessing.spawn import start_processes

    # NCCL needs one GPU per process; with fewer GPUs the check runs on the CPU with gloo.
    chosen = backend or ("nccl" if torch.cuda.device_count() >= world_size else "gloo")
    numel = max(1, size_bytes // 4)
    with tempfile.TemporaryDirectory(prefix="tyard-allreduce-") as tmp:
        out = str(Path(tmp) / "result.json")
        start_processes(  # type: ignore[no-untyped-call]
            _worker,
            args=(world_size, _free_port(), chosen, numel, iters, warmup, out),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
        measured = json.loads(Path(out).read_text())
    per_iter = measured["elapsed"] / iters
    algbw = numel * 4 / per_iter / 1e9
    busbw = algbw * 2 * (world_size - 1) / world_size
    return AllReduceResult(
        backend=chosen,
        world_size=world_size,
        size_bytes=numel * 4,
        iters=iters,
        seconds_per_iter=per_iter,
        algbw_gbps=algbw,
        busbw_gbps=busbw,
        correct=bool(measured["correct"]),
    )
