"""Joining the job's process group from the torchrun environment.

`init()` reads RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/MASTER_PORT (set by torchrun),
picks the backend (NCCL on GPUs, gloo on the CPU), binds the process to its device and joins
the process group. Without torchrun's variables it returns a single-process context, so the
same script runs under `python train.py` too.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as tdist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from tensoryard import envvars
from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime._env import env_int, env_str
from tensoryard.runtime.stacks import enable as enable_stack_dumps

__all__ = ["DistContext", "init", "shutdown"]

DeviceChoice = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the job, and the collectives the runtime needs."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None: single process, no process group

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes checkpoints and reports."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """A process group was joined (launched by torchrun)."""
        return self.backend is not None

    def barrier(self) -> None:
        if self.is_distributed:
            tdist.barrier()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """`obj` from rank `src` on every rank (picklable objects)."""
        if not self.is_distributed:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=src, device=self._object_device())
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, indexed by rank."""
        if not self.is_distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        return out

    def probe_all_reduce(self, size_bytes: int) -> tuple[float, float] | None:
        """Time one all-reduce of `size_bytes` of float32 on this rank's device (a collective:
        every rank calls it). Returns (seconds, bus bandwidth in GB/s) with NCCL-tests'
        definition, busbw = bytes / seconds * 2 (n - 1) / n; None for a single process."""
        if not self.is_distributed or self.world_size < 2:
            return None
        buffer = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=self.device)
        tdist.all_reduce(buffer)  # warm-up: a first call may set up connections
        self._sync()
        tdist.barrier()
        started = time.perf_counter()
        tdist.all_reduce(buffer)
        self._sync()
        seconds = time.perf_counter() - started
        n = self.world_size
        busbw = buffer.numel() * 4 / seconds * 2 * (n - 1) / n / 1e9
        return seconds, busbw

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def gather_floats(self, value: float) -> list[float]:
        """Every rank's `value`, indexed by rank (one small all_gather)."""
        if not self.is_distributed:
            return [value]
        mine = torch.tensor([value], dtype=torch.float64, device=self.device)
        out = [torch.zeros_like(mine) for _ in range(self.world_size)]
        tdist.all_gather(out, mine)
        return [float(t.item()) for t in out]

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on at least one."""
        if not self.is_distributed:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        tdist.all_reduce(value, op=tdist.ReduceOp.MAX)
        return bool(value.item() > 0)

    def mean(self, value: float) -> float:
        """The mean of `value` over all ranks."""
        if not self.is_distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
        return float(tensor.item()) / self.world_size

    def _object_device(self) -> torch.device | None:
        return self.device if self.backend == "nccl" else None


def _pick_device(choice: DeviceChoice, local_rank: int) -> torch.device:
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if choice == "cpu" or (choice == "auto" and not cuda):
        return torch.device("cpu")
    if not cuda:
        raise RuntimeSetupError(
            "device='cuda' was requested but no CUDA device is visible "
            "(fix: request gpus_per_node > 0, or use device='auto' to run on the CPU)"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RuntimeSetupError(
            f"LOCAL_RANK={local_rank} but only {count} GPU(s) are visible "
            "(fix: start one process per GPU: processes_per_node = gpus_per_node)"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _require(env: Mapping[str, str], name: str) -> str:
    value = env_str(env, name)
    if value is None:
        raise RuntimeSetupError(
            f"{name} is not set but RANK/WORLD_SIZE are (fix: launch the script with torchrun, "
            f"which sets {name}, or set it yourself)"
        )
    return value


def init(
    *,
    device: DeviceChoice = "auto",
    timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> DistContext:
    """Join the job's process group (or run as one process without torchrun's variables).

    Args:
        device: "auto" uses the GPU of LOCAL_RANK when CUDA is available, else the CPU.
        timeout_s: how long collectives (and joining) may wait for the other ranks.
        env: the environment to read; defaults to os.environ.
    """
    env = os.environ if env is None else env
    if env_str(env, "RANK") is None and env_str(env, "WORLD_SIZE") is None:
        return DistContext(0, 1, 0, 1, _pick_device(device, 0), None)
    rank = env_int(env, "RANK", 0)
    world_size = env_int(env, "WORLD_SIZE", 1, minimum=1)
    local_rank = env_int(env, "LOCAL_RANK", 0)
    local_world_size = env_int(env, "LOCAL_WORLD_SIZE", world_size, minimum=1)
    if rank >= world_size:
        raise RuntimeSetupError(
            f"RANK={rank} is not below WORLD_SIZE={world_size} (fix: check the launcher)"
        )
    addr, port = _require(env, "MASTER_ADDR"), _require(env, "MASTER_PORT")
    dev = _pick_device(device, local_rank)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if tdist.is_initialized():
        return DistContext(rank, world_size, local_rank, local_world_size, dev, backend)
    timeout = timedelta(seconds=timeout_s)
    try:
        store = _restart_store(env, addr, port, world_size, timeout)
        if store is not None:
            tdist.init_process_group(
                backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
            )
        else:
            tdist.init_process_group(
                backend=backend,
                # env:// (not tcp://) so that under torchrun rank 0 joins the agent's store
                # instead of trying to open a second server on MASTER_PORT.
                init_method="env://",
                rank=rank,
                world_size=world_size,
                timeout=timeout,
            )
    except (RuntimeError, ValueError, OSError) as exc:
        raise RuntimeSetupError(
            f"rank {rank} could not join the {backend} process group at {addr}:{port} "
            f"within {timeout_s:g}s: {exc} (fix: check that every rank started and that "
            "MASTER_ADDR/MASTER_PORT are reachable)"
        ) from exc
    enable_stack_dumps(rank, env)  # where this rank waits, if the gang is ever called hung
    return DistContext(rank, world_size, local_rank, local_world_size, dev, backend)


def _restart_store(
    env: Mapping[str, str], addr: str, port: str, world_size: int, timeout: timedelta
) -> Store | None:
    """After torchrun restarted the workers in place (TORCHELASTIC_RESTART_COUNT > 0): the
    agent's store under a key space of this restart's own, or None to use env://.

    The agent's TCPStore lives on across restarts, still holding the previous group's
    rendezvous keys (the peers' old addresses); a restarted rank that read one of those before
    its peer re-published connected to a dead port (pytorch/pytorch#167288: "connect returned
    Connection refused" after a restart). Keys under a prefix per restart cannot be stale."""
    # a gang's rank wrapper numbers rounds alike on every node (TYARD_RESTART_ROUND); torchrun's
    # own count grows only on the node whose worker failed
    restarts = envvars.RESTART_ROUND.get(env, error=RuntimeSetupError)
    if restarts is None:
        restarts = env_int(env, "TORCHELASTIC_RESTART_COUNT", 0)
    if restarts <= 0 or env_str(env, "TORCHELASTIC_USE_AGENT_STORE") not in ("True", "true", "1"):
        return None
    client = TCPStore(
        addr, int(port), world_size, is_master=False, timeout=timeout, wait_for_workers=False
    )
    return PrefixStore(f"tensoryard/restart-{restarts}", client)


def shutdown() -> None:
    """Leave the process group (safe to call when none was joined)."""
    if tdist.is_available() and tdist.is_initialized():
        # A peer may have died already; then there is nothing left to tear down cleanly.
        with contextlib.suppress(RuntimeError, ValueError):
            tdist.destroy_process_group()
