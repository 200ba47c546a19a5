"""One-call constructors: a prepared directory (or several, blended) to a ready loader."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensoryard.data.dataset import CheckLevel, ReadMode, TokenDataset
from tensoryard.data.loader import LoaderConfig, TokenLoader
from tensoryard.data.source import ShardSource
from tensoryard.data.tokenizer import Tokenizer

if TYPE_CHECKING:
    from tensoryard.data.torch_loader import TorchTokenLoader

__all__ = ["build_loader", "build_torch_loader"]

PathLike = str | Path


def build_loader(
    data: PathLike | TokenDataset | Sequence[PathLike | TokenDataset],
    *,
    seq_len: int,
    global_batch: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    weights: Sequence[float] | None = None,
    tokenizer: Tokenizer | str | None = None,
    sources: Sequence[ShardSource | None] | None = None,
    check: CheckLevel = "quick",
    max_open_shards: int = 64,
    io: ReadMode = "pread",
    **config: Any,
) -> TokenLoader:
    """A numpy `TokenLoader` over one prepared directory or a weighted blend of several.

    Extra keyword arguments go to `LoaderConfig` (shuffle, shuffle_block, shuffle_window, ...).
    """
    items = [data] if isinstance(data, (str, Path, TokenDataset)) else list(data)
    srcs = list(sources) if sources is not None else [None] * len(items)
    datasets = [
        it
        if isinstance(it, TokenDataset)
        else TokenDataset.open(
            it,
            source=src,
            check=check,
            max_open_shards=max_open_shards,
            tokenizer=tokenizer,
            io=io,
        )
        for it, src in zip(items, srcs, strict=True)
    ]
    cfg = LoaderConfig(
        seq_len=seq_len,
        global_batch=global_batch,
        seed=seed,
        weights=tuple(weights) if weights is not None else None,
        **config,
    )
    return TokenLoader(datasets, cfg, rank=rank, world_size=world_size)


def build_torch_loader(
    data: PathLike | TokenDataset | Sequence[PathLike | TokenDataset],
    *,
    seq_len: int,
    global_batch: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    weights: Sequence[float] | None = None,
    tokenizer: Tokenizer | str | None = None,
    **config: Any,
) -> TorchTokenLoader:
    """Like `build_loader`, handing out torch int64 tensors (pinned when CUDA is available).

    Typical use in a training script::

        loader = build_torch_loader("data/owt", seq_len=1024, global_batch=64,
                                    rank=rank, world_size=world, seed=0)
        loader.load_state_dict(ckpt["data"])          # if resuming
        for batch in loader:                           # (64 // world, 1025) int64
            x, y = batch[:, :-1], batch[:, 1:]
            ...
            ckpt["data"] = loader.state_dict()
    """
    from tensoryard.data.torch_loader import TorchTokenLoader

    inner = build_loader(
        data,
        seq_len=seq_len,
        global_batch=global_batch,
        rank=rank,
        world_size=world_size,
        seed=seed,
        weights=weights,
        tokenizer=tokenizer,
        **config,
    )
    return TorchTokenLoader(inner, num_workers=num_workers, pin_memory=pin_memory)
