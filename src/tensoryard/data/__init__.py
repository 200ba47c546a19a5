"""Training data: prepare token shards, load them fast, resume exactly, read remote shards.

Preparation (`prepare`, CLI ``tyard data prepare``) tokenizes jsonl / text / parquet inputs into
shards of raw token ids plus a manifest (see `tensoryard.data.format`). The loader reads fixed
length samples in a stateless order keyed by (seed, epoch), so start-up and resume cost the same
for any dataset size, and the global sample sequence survives changes of world size and
DataLoader worker count.

Public API::

    prepare(inputs, tokenizer, out_dir, workers=1, shard_tokens=..., text_field="text")
    open_dataset(path, source=None, tokenizer=None) -> TokenDataset
    build_loader(path_or_paths, seq_len=, global_batch=, rank=, world_size=, seed=)
        -> TokenLoader  (numpy batches, state_dict()/load_state_dict())
    build_torch_loader(..., num_workers=0) -> TorchTokenLoader (torch tensors)
    verify_dataset(path)   # full hash check (and each 1 MiB unit's, with units.bin)
    write_token_dataset(out_dir, token_arrays, vocab_size=)  # already tokenized / synthetic
    import_megatron(prefixes, out_dir)  # existing Megatron .bin/.idx, linked, not copied

Remote shards: the loader reads every file through a `ShardSource` (`tensoryard.data.source`):
``metadata_path(name)``, ``shard_path(index, name)`` (blocks until local), ``hint(upcoming)``
(shard indices needed next, in first-use order, sent one planned block ahead) and
``release(index)`` (the loader's LRU unmapped it). `LocalShardSource` is a plain directory; the
node-local cache in `tensoryard.data.cache` implements the same protocol for s3:// and other
fsspec URLs (and may export ``source_for_url(url) -> ShardSource``, which `open_dataset` uses for
non-local paths when no source is given). `TokenLoader.shard_order(dataset)` is the same order as
a lazy, endless iterator, for a cache that wants to look further ahead.

Reads: ``io="pread"`` (default) copies each sample with one pread straight into the batch, so
RSS stays flat for any dataset size; ``io="mmap"`` gathers from memory maps instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensoryard.data.build import build_loader, build_torch_loader
    from tensoryard.data.dataset import (
        CheckLevel,
        ReadMode,
        TokenDataset,
        open_dataset,
        verify_dataset,
    )
    from tensoryard.data.format import Manifest, ShardEntry, read_manifest
    from tensoryard.data.loader import LoaderConfig, SampleSequence, TokenLoader
    from tensoryard.data.megatron import import_megatron
    from tensoryard.data.permutation import FeistelPermutation, ShuffleOrder
    from tensoryard.data.preparation import PrepareResult, prepare, write_token_dataset
    from tensoryard.data.source import LocalShardSource, ShardSource
    from tensoryard.data.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer
    from tensoryard.data.torch_loader import TorchTokenDataset, TorchTokenLoader

__all__ = [
    "ByteTokenizer",
    "CheckLevel",
    "FeistelPermutation",
    "HFTokenizer",
    "LoaderConfig",
    "LocalShardSource",
    "Manifest",
    "PrepareResult",
    "ReadMode",
    "SampleSequence",
    "ShardEntry",
    "ShardSource",
    "ShuffleOrder",
    "TokenDataset",
    "TokenLoader",
    "Tokenizer",
    "TorchTokenDataset",
    "TorchTokenLoader",
    "build_loader",
    "build_torch_loader",
    "import_megatron",
    "load_tokenizer",
    "open_dataset",
    "prepare",
    "read_manifest",
    "verify_dataset",
    "write_token_dataset",
]

# Every name loads its module on first use: a process that imports one submodule (the node's
# fetch service imports `tensoryard.data.cache` only) does not pay for numpy, the loader, torch
# or the preparation stack.
_LAZY = {
    "build_loader": "tensoryard.data.build",
    "build_torch_loader": "tensoryard.data.build",
    "CheckLevel": "tensoryard.data.dataset",
    "ReadMode": "tensoryard.data.dataset",
    "TokenDataset": "tensoryard.data.dataset",
    "open_dataset": "tensoryard.data.dataset",
    "verify_dataset": "tensoryard.data.dataset",
    "Manifest": "tensoryard.data.format",
    "ShardEntry": "tensoryard.data.format",
    "read_manifest": "tensoryard.data.format",
    "LoaderConfig": "tensoryard.data.loader",
    "SampleSequence": "tensoryard.data.loader",
    "TokenLoader": "tensoryard.data.loader",
    "FeistelPermutation": "tensoryard.data.permutation",
    "ShuffleOrder": "tensoryard.data.permutation",
    "LocalShardSource": "tensoryard.data.source",
    "ShardSource": "tensoryard.data.source",
    "ByteTokenizer": "tensoryard.data.tokenizer",
    "HFTokenizer": "tensoryard.data.tokenizer",
    "Tokenizer": "tensoryard.data.tokenizer",
    "load_tokenizer": "tensoryard.data.tokenizer",
    "prepare": "tensoryard.data.preparation",
    "PrepareResult": "tensoryard.data.preparation",
    "write_token_dataset": "tensoryard.data.preparation",
    "import_megatron": "tensoryard.data.megatron",
    "TorchTokenDataset": "tensoryard.data.torch_loader",
    "TorchTokenLoader": "tensoryard.data.torch_loader",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensoryard.data' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
