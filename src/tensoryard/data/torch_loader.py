"""torch adapter: an IterableDataset that splits batches over DataLoader workers, and a
loader wrapper that keeps the resumable state in the main process.

Worker ``w`` of ``K`` produces this rank's batches ``w, w + K, w + 2K, ...`` (counted from the
resume point); DataLoader returns worker results round-robin in worker order, so the stream is
the same for any ``K``, and the main process counts what it handed out.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from tensoryard.data.loader import TokenLoader

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
    ) -> None:
        self.loader = loader
        self.num_workers = num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.dtype = dtype
        self.prefetch_factor = prefetch_factor
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[torch.Tensor]:
        ds = TorchTokenDataset(self.loader, dtype=self.dtype, num_batches=self.num_batches)
        step = self.loader.config.global_batch
        if self.num_workers == 0:
            # In-process: no DataLoader machinery (it costs more per batch than the read).
            loader = self.loader
            if self.pin_memory:
                for batch in ds:
                    loader.consumed += step
                    yield batch.pin_memory()
                return
            for batch in ds:
                loader.consumed += step
                yield batch
            return
        extra: dict[str, Any] = {}
        if self.num_workers and self.prefetch_factor is not None:
            extra["prefetch_factor"] = self.prefetch_factor
        dl = DataLoader(
            ds,
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            **extra,
        )
        for batch in dl:
            self.loader.consumed += step
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """See `TokenLoader.state_dict`."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See `TokenLoader.load_state_dict`."""
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Unmap all shards."""
        self.loader.close()
