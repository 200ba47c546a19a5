"""torch adapter: an IterableDataset that splits batches over DataLoader workers, and a
loader wrapper that keeps the resumable state in the main process.

Worker ``w`` of ``K`` produces this rank's batches ``w, w + K, w + 2K, ...`` (counted from the
resume point); DataLoader returns worker results round-robin in worker order, so the stream is
the same for any ``K``, and the main process counts what it handed out.
"""

from __future__ import annotations

from collections.abc import Iterator
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
        batches = self.loader.iter_batches(first, every=workers)
        for produced, (_, batch) in enumerate(batches):
            if mine is not None and produced >= mine:
                return
            yield self._to_tensor(batch)

    def _to_tensor(self, arr: np.ndarray) -> torch.Tensor:
        if arr.dtype == np.uint32:  # torch has no general uint32 arithmetic
            arr = arr.astype(np.int64)
        t = torch.from_numpy(arr)
        return t if self.dtype is None else t.to(self.dtype)


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
            for batch in ds:
                self.loader.consumed += step
                yield batch.pin_memory() if self.pin_memory else batch
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
