"""DataLoader workers that hand batches to the trainer through shared memory, not pickles.

Before the workers start, the main process allocates one shared-memory tensor, the *ring*:
per worker, ``slots`` buffers of ``group`` consecutive batches each, in the stored token dtype.
A worker gathers its next group of batches straight into its next slot and sends the main
process only ``(worker, slot, batches)`` through the DataLoader's queue; the main process
copies (and converts) the group out of the slot before handing its batches on. So a batch
crosses the process boundary as one memory copy, and no file descriptor, segment or pickle of
token data is made per batch.

Reuse without acknowledgement. DataLoader keeps at most ``prefetch_factor`` requests
outstanding per worker and sends a worker its next request just before it returns that
worker's previous result, so a worker may fill group ``n + prefetch_factor`` while the main
process is still copying group ``n``: ``slots = prefetch_factor + 2`` never overwrites a group
that has not been copied.

Order. Worker ``w`` of ``K`` fills groups ``w, w + K, w + 2K, ...`` of consecutive batches
counted from the resume point (sizes in `worker_groups`); DataLoader returns worker results
round-robin in worker order, so the stream is the same for any ``K``.

Clean-up. The ring uses torch's sharing strategy; with the default on Linux
(``file_descriptor``) its segment is unlinked the moment it is created, so nothing is left
under /dev/shm whatever happens to the processes, and the memory is freed when the last
process that maps it exits or drops it. Works with the ``fork``, ``spawn`` and ``forkserver``
start methods (the ring travels to spawned workers as a file descriptor).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from tensoryard.data.loader import TokenLoader
from tensoryard.errors import DataError

__all__ = ["GROUP_BYTES", "RingLayout", "SharedRingDataset", "allocate_ring"]

GROUP_BYTES = 1 << 20
"""Bytes of token data per slot (one message per slot): large enough that the DataLoader's
per-message cost is spread over many small batches, small enough to start fast."""
MAX_GROUP = 64
"""Most batches in one slot."""


@dataclass(frozen=True, kw_only=True)
class RingLayout:
    """Shape of the shared ring: workers x slots x group x local_batch x sample_len."""

    workers: int
    """DataLoader workers (each owns its slots)."""
    slots: int
    """Buffers per worker; prefetch_factor + 2 (see the module docstring)."""
    group: int
    """Consecutive batches per slot (one DataLoader message)."""
    local_batch: int
    """Samples per batch on this rank."""
    sample_len: int
    """Tokens per sample (seq_len + 1)."""

    @classmethod
    def for_loader(cls, loader: TokenLoader, *, workers: int, prefetch: int) -> RingLayout:
        """The layout for `loader`'s batches with `workers` workers of `prefetch` requests."""
        batch_bytes = loader.local_batch * loader.sample_len * loader.dtype.itemsize
        group = max(1, min(MAX_GROUP, GROUP_BYTES // batch_bytes))
        return cls(
            workers=workers,
            slots=prefetch + 2,
            group=group,
            local_batch=loader.local_batch,
            sample_len=loader.sample_len,
        )

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.workers, self.slots, self.group, self.local_batch, self.sample_len)


def allocate_ring(layout: RingLayout, dtype: np.dtype[np.generic]) -> torch.Tensor:
    """One shared-memory tensor of `layout`'s shape holding tokens of numpy `dtype`."""
    torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    ring = torch.empty(layout.shape, dtype=torch_dtype)
    ring.share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    return ring


def worker_groups(
    wid: int, workers: int, group: int, total: int | None
) -> Iterator[tuple[int, int]]:
    """(first batch index, batches) of each group worker `wid` fills, in its order.

    Group ``g`` holds ``min(group, 2 ** (g // workers))`` batches: each worker's first group is
    one batch and sizes double up to `group`, so the first batch does not wait for a whole slot.
    """
    g, lo = 0, 0
    while total is None or lo < total:
        size = min(group, 1 << min(g // workers, 30))
        if total is not None:
            size = min(size, total - lo)
        if g % workers == wid:
            yield lo, size
        g, lo = g + 1, lo + size


class SharedRingDataset(IterableDataset[tuple[int, int, int]]):
    """Inside a DataLoader worker: fills this worker's slots of `ring` and yields
    ``(worker, slot, batches)`` for each filled group."""

    def __init__(
        self,
        loader: TokenLoader,
        ring: torch.Tensor,
        layout: RingLayout,
        *,
        start: int,
        num_batches: int | None = None,
    ) -> None:
        self.loader = loader
        self.ring = ring
        self.layout = layout
        self.start = start
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        info = get_worker_info()
        if info is None or info.num_workers != self.layout.workers:
            raise DataError(
                "SharedRingDataset runs only inside the DataLoader workers its ring was "
                "allocated for (fix: iterate TorchTokenLoader instead)"
            )
        wid = info.id
        slots = self.ring[wid].numpy()  # (slots, group, local_batch, sample_len), shared
        groups = worker_groups(wid, self.layout.workers, self.layout.group, self.num_batches)
        sizes, firsts = itertools.tee(groups)
        step = self.loader.config.global_batch
        starts = (self.start + (lo + i) * step for lo, n in firsts for i in range(n))
        slot, fill, want = 0, 0, next(sizes, (0, 0))[1]
        for _, data in self.loader.read_blocks(starts):
            i = 0
            while i < len(data):  # a block may end inside a group, or hold several groups
                take = min(want - fill, len(data) - i)
                slots[slot, fill : fill + take] = data[i : i + take]
                fill, i = fill + take, i + take
                if fill == want:
                    yield wid, slot, want
                    slot, fill = (slot + 1) % self.layout.slots, 0
                    want = next(sizes, (0, 0))[1]
