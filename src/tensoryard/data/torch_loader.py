"""torch adapter: an IterableDataset that splits batches over DataLoader workers, and a
loader wrapper that keeps the resumable state in the main process.

Worker ``w`` of ``K`` produces this rank's batches ``w, w + K, w + 2K, ...`` (counted from the
resume point); DataLoader returns worker results round-robin in worker order, so the stream is
the same for any ``K``, and the main process counts what it handed out.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from tensoryard.data.loader import TokenLoader
from tensoryard.data.torch_workers import RingLayout, SharedRingDataset, allocate_ring

__all__ = ["TorchTokenDataset", "TorchTokenLoader"]


class TorchTokenDataset(IterableDataset[torch.Tensor]):
    """Yields this rank's batches as tensors of shape (local_batch, seq_len + 1)."""

    def __init__(
        self,
        loader: TokenLoader,
        *,
        start: int | None = None,
        dtype: torch.dtype | None = torch.long,
        num_batches: int | None = None,
    ) -> None:
        self.loader = loader
        self.start = loader.consumed if start is None else start
        self.dtype = dtype
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        workers, wid = (info.num_workers, info.id) if info is not None else (1, 0)
        first = self.start + wid * self.loader.config.global_batch
        mine = None if self.num_batches is None else len(range(wid, self.num_batches, workers))
        blocks = self.loader.iter_blocks(first, every=workers)
        batches = self._tensors(blocks, whole_blocks=info is None)
        yield from batches if mine is None else itertools.islice(batches, mine)

    def _tensors(
        self, blocks: Iterator[tuple[list[int], np.ndarray]], *, whole_blocks: bool
    ) -> Iterator[torch.Tensor]:
        """Tensors of each block's batches.

        In-process and without a conversion: one tensor per block, split into batch views
        (cheaper than a tensor per batch). Otherwise one tensor per batch: a converted copy is
        made batch by batch so that a block's worth of wider tokens is never held at once, and
        a DataLoader worker sends each batch's own memory rather than its whole block's.
        """
        to_tensor = self._converter()
        if whole_blocks and to_tensor is torch.from_numpy:
            for _, data in blocks:
                yield from to_tensor(data).unbind(0)
            return
        for _, data in blocks:
            for batch in data:
                yield to_tensor(batch)

    def _converter(self) -> Callable[[np.ndarray], torch.Tensor]:
        """numpy batch -> tensor, with the dtype decisions taken once rather than per batch."""
        from_numpy, dtype = torch.from_numpy, self.dtype
        if self.loader.dtype == np.uint32:  # torch has no general uint32 arithmetic

            def widen(arr: np.ndarray) -> torch.Tensor:
                t = from_numpy(arr.astype(np.int64))
                return t if dtype is None else t.to(dtype)

            return widen
        if dtype is None:
            return from_numpy
        return lambda arr: from_numpy(arr).to(dtype)

    def _to_tensor(self, arr: np.ndarray) -> torch.Tensor:
        return self._converter()(arr)


class TorchTokenLoader:
    """Iterate torch batches (optionally from DataLoader workers) and checkpoint the position.

    ``state_dict()`` counts only batches already handed to the caller, so prefetched batches are
    never skipped on resume; call ``load_state_dict`` before starting to iterate.

    With workers, batches reach this process through a shared-memory ring
    (`tensoryard.data.torch_workers`), not through pickles; ``shared_memory=False`` sends each
    batch through DataLoader's own queue instead (slower; for comparison). Either way every
    batch handed out owns its memory.
    """

    def __init__(
        self,
        loader: TokenLoader,
        *,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        dtype: torch.dtype | None = torch.long,
        prefetch_factor: int | None = None,
        num_batches: int | None = None,
        multiprocessing_context: str | None = None,
        shared_memory: bool = True,
    ) -> None:
        self.loader = loader
        self.num_workers = num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.dtype = dtype
        self.prefetch_factor = prefetch_factor
        self.num_batches = num_batches
        self.multiprocessing_context = multiprocessing_context
        """Start method of the workers ("fork", "spawn", "forkserver"; None: torch's default)."""
        self.shared_memory = shared_memory
        self._running: weakref.WeakSet[Generator[torch.Tensor, None, None]] = weakref.WeakSet()

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.num_workers == 0:
            return self._in_process()
        batches = self._from_ring() if self.shared_memory else self._from_queue()
        self._running.add(batches)
        return batches

    def _in_process(self) -> Iterator[torch.Tensor]:
        # No DataLoader machinery: it costs more per batch than the read.
        ds = TorchTokenDataset(self.loader, dtype=self.dtype, num_batches=self.num_batches)
        loader, step = self.loader, self.loader.config.global_batch
        if self.pin_memory:
            for batch in ds:
                loader.consumed += step
                yield batch.pin_memory()
            return
        for batch in ds:
            loader.consumed += step
            yield batch

    def _data_loader(self, dataset: IterableDataset[Any], *, pin: bool = False) -> DataLoader[Any]:
        extra: dict[str, Any] = {}
        if self.prefetch_factor is not None:
            extra["prefetch_factor"] = self.prefetch_factor
        return DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=pin,
            multiprocessing_context=self.multiprocessing_context,
            **extra,
        )

    def _from_ring(self) -> Generator[torch.Tensor, None, None]:
        prefetch = 2 if self.prefetch_factor is None else self.prefetch_factor
        layout = RingLayout.for_loader(self.loader, workers=self.num_workers, prefetch=prefetch)
        ring = allocate_ring(layout, self.loader.dtype)
        ds = SharedRingDataset(
            self.loader, ring, layout, start=self.loader.consumed, num_batches=self.num_batches
        )
        copy_out, step = self._group_copier(), self.loader.config.global_batch
        slots = ring.numpy()
        it = iter(self._data_loader(ds))
        try:
            for wid, slot, count in it:
                for batch in copy_out(slots[wid, slot, :count]).unbind(0):
                    self.loader.consumed += step
                    yield batch
        finally:
            _shut_down(it)
            # An exception's traceback keeps this frame: drop the ring here, not with the frame.
            del it, ds, ring, slots

    def _group_copier(self) -> Callable[[np.ndarray], torch.Tensor]:
        """A slot's group -> a tensor of its own (converted, pinned as asked), in one copy.

        numpy copies and converts: torch's kernels for uint16/uint32 are several times slower.
        """
        dtype = self.dtype
        if dtype is None and self.loader.dtype == np.uint32:
            dtype = torch.long  # torch has no general uint32 arithmetic
        out_dtype = _torch_dtype(self.loader.dtype) if dtype is None else dtype
        target = _numpy_dtype(out_dtype)  # None: numpy lacks it (bfloat16), torch converts
        if self.pin_memory:

            def pinned(group: np.ndarray) -> torch.Tensor:
                out = torch.empty(group.shape, dtype=out_dtype, pin_memory=True)
                if target is None:
                    return out.copy_(torch.from_numpy(group))
                np.copyto(out.numpy(), group, casting="unsafe")
                return out

            return pinned
        if target is None:
            return lambda group: torch.from_numpy(group).to(out_dtype, copy=True)
        return lambda group: torch.from_numpy(group.astype(target))

    def _from_queue(self) -> Generator[torch.Tensor, None, None]:
        ds = TorchTokenDataset(self.loader, dtype=self.dtype, num_batches=self.num_batches)
        step = self.loader.config.global_batch
        it = iter(self._data_loader(ds, pin=self.pin_memory))
        try:
            for batch in it:
                self.loader.consumed += step
                yield batch
        finally:
            _shut_down(it)

    def state_dict(self) -> dict[str, Any]:
        """See `TokenLoader.state_dict`."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See `TokenLoader.load_state_dict`."""
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Stop the workers of any iteration still running (freeing its shared memory) and
        unmap all shards."""
        for batches in list(self._running):
            batches.close()
        self.loader.close()


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    """numpy's equivalent of a torch dtype (None where numpy has none)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return None


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _shut_down(it: Iterator[Any]) -> None:
    """Stop a DataLoader iterator's workers now rather than when it is garbage collected."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
