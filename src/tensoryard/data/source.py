"""Where shard files come from: the `ShardSource` interface and its local implementation.

The loader never opens a path itself. It asks a source for the *local* path of a dataset file
and tells it, ahead of time, which shards it will need and in which order. A local directory
answers at once (`LocalShardSource`); a node-local cache of remote shards
(`tensoryard.data.cache`) downloads ahead of the hints, shares downloads between the ranks of a
node and evicts the shard needed furthest in the future.

Protocol (all methods are called from the process that reads; they may block):

``metadata_path(name) -> Path``
    Local path of a dataset-level file: ``manifest.json``, ``index.bin``, ``shards.json``
    (all three in one local directory).
``shard_path(index, name) -> Path``
    Local path of shard ``index``'s file ``name`` (``shard-000007.tok`` or ``.doc``); blocks
    until the file is complete locally. The loader checks its size and quick fingerprint.
``hint(upcoming) -> None``
    Shard indices the loader will read next, in first-use order (duplicates removed). Called
    each time the loader plans a block of batches, for the current and the next block.
``release(index) -> None``
    The loader closed its mapping of shard ``index`` (its LRU of open files evicted it); the
    file may now be evicted if space is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["LocalShardSource", "ShardSource"]


@runtime_checkable
class ShardSource(Protocol):
    """Resolves dataset files to local paths; see the module docstring for the contract."""

    def metadata_path(self, name: str) -> Path:
        """Local path of a dataset-level file (manifest.json, index.bin, shards.json)."""
        ...

    def shard_path(self, index: int, name: str) -> Path:
        """Local path of one of shard `index`'s files, complete on return."""
        ...

    def hint(self, upcoming: Sequence[int]) -> None:
        """Shards needed next, in first-use order."""
        ...

    def release(self, index: int) -> None:
        """The loader no longer maps shard `index`."""
        ...


class LocalShardSource:
    """A prepared dataset in a local (or network-mounted) directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def metadata_path(self, name: str) -> Path:
        return self.root / name

    def shard_path(self, index: int, name: str) -> Path:
        return self.root / name

    def hint(self, upcoming: Sequence[int]) -> None:
        """Nothing to fetch: local files are already there."""

    def release(self, index: int) -> None:
        """Nothing to free."""

    def __repr__(self) -> str:
        return f"LocalShardSource({str(self.root)!r})"
