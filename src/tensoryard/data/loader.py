"""The loader: fixed-length samples in a stateless, resumable, elastic order.

Samples. Dataset ``d``'s token stream (documents separated by EOS) is cut into samples of
``seq_len + 1`` tokens at stride ``seq_len``: sample ``i`` is tokens
``[i * seq_len, i * seq_len + seq_len + 1)``, packed across document boundaries.

Global order. Global position ``g = 0, 1, 2, ...`` is mapped, without any stored index, to
``(dataset d, k-th sample drawn from d)`` by a fixed weighted schedule that repeats every
``blend_period`` positions, then to a sample by dataset ``d``'s permutation for epoch
``k // N_d`` keyed by ``(seed, d, epoch)`` (`ShuffleOrder`). The sequence therefore never depends
on world size, batch size or worker count.

Batches. Global batch ``t`` is positions ``[consumed, consumed + global_batch)``; rank ``r`` of
``world_size`` takes the ``r``-th contiguous slice of ``global_batch // world_size`` positions.

State. ``state_dict()`` is ``{seed, config_hash, consumed_samples}`` (plus a few descriptive
fields for error messages). Resuming sets one integer, so it costs the same at any position,
and a state saved with 8 ranks resumes on 6 to the same global sequence.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensoryard.data._util import distinct, short_hash
from tensoryard.data.dataset import TokenDataset
from tensoryard.data.permutation import ShuffleOrder, derive_key
from tensoryard.data.source import LocalShardSource
from tensoryard.errors import DataError

__all__ = ["STATE_FORMAT", "LoaderConfig", "SampleSequence", "TokenLoader"]

STATE_FORMAT = "tensoryard-loader-state"
STATE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """What determines the global sample sequence (world size and workers do not)."""

    seq_len: int
    """Tokens a model sees per sample; each sample holds seq_len + 1 tokens (inputs + shifted
    targets)."""
    global_batch: int
    """Samples per optimizer step over all ranks; must be divisible by the world size."""
    seed: int = 0
    """Seed of every permutation; the same seed gives the same sequence."""
    weights: tuple[float, ...] | None = None
    """Blend weights, one per dataset (None: equal weights)."""
    shuffle: bool = True
    """False reads each dataset in order (sample 0, 1, 2, ...)."""
    shuffle_block: int = 1
    """Consecutive samples that move together (1: sample-level shuffle)."""
    shuffle_window: int | None = None
    """Blocks mixed together at a time (None: the whole epoch). A window keeps any stretch of
    reads within shuffle_block * shuffle_window samples, which suits a remote-shard cache."""
    blend_period: int = 1024
    """Positions after which the blend schedule repeats; weights are rounded to 1/period."""
    plan_batches: int = 256
    """Most batches read at once (vectorised permutation, shard lookup and gather, prefetch
    hints). Blocks start at 4 batches and double up to this, so the first batch is fast."""

    def validate(self) -> None:
        """Raise DataError naming the field that is out of range."""
        checks = [
            (self.seq_len >= 1, "seq_len must be >= 1"),
            (self.global_batch >= 1, "global_batch must be >= 1"),
            (self.shuffle_block >= 1, "shuffle_block must be >= 1"),
            (self.shuffle_window is None or self.shuffle_window >= 1, "shuffle_window >= 1"),
            (self.blend_period >= 1, "blend_period must be >= 1"),
            (self.plan_batches >= 1, "plan_batches must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise DataError(f"loader config: {message}")


class SampleSequence:
    """Global position -> (dataset, sample index), a pure function of the config."""

    def __init__(self, sizes: Sequence[int], config: LoaderConfig) -> None:
        self.sizes = [int(n) for n in sizes]
        self.config = config
        for d, n in enumerate(self.sizes):
            if n < 1:
                raise DataError(
                    f"dataset {d} holds fewer than seq_len + 1 = "
                    f"{config.seq_len + 1} tokens: no sample fits"
                )
        self.quotas = _quotas(self._weights(), config.blend_period if len(sizes) > 1 else 1)
        self.period = sum(self.quotas)
        self._slot_ds, self._slot_rank = _schedule(self.quotas)
        self._quota_arr = np.array(self.quotas, dtype=np.int64)
        self._orders: dict[tuple[int, int], ShuffleOrder] = {}

    def _weights(self) -> list[float]:
        w = self.config.weights
        if w is None:
            return [1.0] * len(self.sizes)
        if len(w) != len(self.sizes):
            raise DataError(f"loader config: {len(w)} weights for {len(self.sizes)} datasets")
        if any(not (x > 0) for x in w):
            raise DataError("loader config: every blend weight must be > 0")
        return list(w)

    def draws(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, how many samples that dataset drew before) of each position."""
        g = np.asarray(positions, dtype=np.int64)
        slot = g % self.period
        d = self._slot_ds[slot]
        k = (g // self.period) * self._quota_arr[d] + self._slot_rank[slot]
        return d, k

    def order(self, d: int, epoch: int) -> ShuffleOrder:
        """Dataset d's permutation for one epoch."""
        got = self._orders.get((d, epoch))
        if got is None:
            if len(self._orders) > 64:  # bounded: only recent epochs are ever asked for
                self._orders.clear()
            cfg = self.config
            got = ShuffleOrder(
                self.sizes[d],
                derive_key(cfg.seed, "dataset", d, "epoch", epoch),
                block=cfg.shuffle_block,
                window=cfg.shuffle_window,
                shuffle=cfg.shuffle,
            )
            self._orders[(d, epoch)] = got
        return got

    def samples(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, sample index within it) of each global position."""
        d, k = self.draws(positions)
        if len(self.sizes) == 1:  # one dataset: no split by dataset
            return d, self._permute(0, k)
        out = np.empty_like(k)
        for di in distinct(d):
            sel = d == di
            out[sel] = self._permute(di, k[sel])
        return d, out

    def _permute(self, d: int, k: np.ndarray) -> np.ndarray:
        """Sample index of dataset d's k-th draws (each through its epoch's permutation)."""
        if len(k) == 0:
            return k.copy()
        n = self.sizes[d]
        epoch, pos = k // n, k % n
        lo, hi = int(epoch.min()), int(epoch.max())
        if lo == hi:  # the usual case: a block of batches inside one epoch
            return self.order(d, lo)(pos)
        res = np.empty_like(k)
        for e in range(lo, hi + 1):
            es = epoch == e
            if es.any():
                res[es] = self.order(d, e)(pos[es])
        return res


def _quotas(weights: list[float], period: int) -> list[int]:
    """Integer slots per dataset in one period, by largest remainder (ties: lower index)."""
    total = sum(weights)
    exact = [w / total * period for w in weights]
    base = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[: period - sum(base)]:
        base[i] += 1
    if any(q == 0 for q in base):
        raise DataError(
            f"loader config: a blend weight rounds to 0 of {period} slots "
            "(fix: raise blend_period or that weight)"
        )
    return base


def _schedule(quotas: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Spread each dataset's slots evenly over the period (smooth interleave)."""
    slots = [((j + 0.5) / q, d, j) for d, q in enumerate(quotas) for j in range(q)]
    slots.sort()
    return (
        np.array([d for _, d, _ in slots], dtype=np.int64),
        np.array([j for _, _, j in slots], dtype=np.int64),
    )


@dataclass
class _Part:
    """The samples of a block that one dataset holds, located in its shards."""

    dataset: int
    rows: np.ndarray  # rows of the block (batch-major sample number) this dataset fills
    shard: np.ndarray  # shard of each window
    local: np.ndarray  # token offset of each window within its shard


@dataclass
class _Block:
    """The samples of a run of batches, located but not yet read."""

    firsts: list[int]  # position of each batch's global first sample
    ds: np.ndarray  # dataset index per sample (batch-major)
    samples: np.ndarray  # sample index within its dataset
    parts: list[_Part]  # per dataset: rows and (shard, offset) of its windows


class TokenLoader:
    """Batches of token samples for one rank, as numpy arrays of shape (local_batch, seq_len+1).

    Iterating yields batches forever (epochs roll over); `state_dict()` after receiving a batch
    resumes right after it. Use `tensoryard.data.torch_loader` for torch tensors and DataLoader
    workers.
    """

    def __init__(
        self,
        datasets: TokenDataset | Sequence[TokenDataset],
        config: LoaderConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        config.validate()
        self.datasets = [datasets] if isinstance(datasets, TokenDataset) else list(datasets)
        if not self.datasets:
            raise DataError("loader: no dataset given")
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"loader: rank {rank} outside world_size {world_size}")
        if config.global_batch % world_size:
            raise DataError(
                f"loader: global_batch {config.global_batch} is not divisible by world_size "
                f"{world_size} (fix: choose a global batch that is a multiple of the world size)"
            )
        _check_same_tokenizer(self.datasets)
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.local_batch = config.global_batch // world_size
        self.sample_len = config.seq_len + 1
        self.dtype: np.dtype[Any] = np.result_type(*[d.dtype for d in self.datasets])
        sizes = [d.num_samples(config.seq_len) for d in self.datasets]
        self.sequence = SampleSequence(sizes, config)
        self.consumed = 0

    # ------------------------------------------------------------------ identity and state
    @property
    def config_hash(self) -> str:
        """Fingerprint of everything that shapes the sequence except the seed."""
        c = self.config
        shuffle = [c.shuffle, c.shuffle_block, c.shuffle_window]
        return short_hash(self._describe() | {"shuffle": shuffle})

    def _describe(self) -> dict[str, Any]:
        return {
            "datasets": [d.dataset_id for d in self.datasets],
            "seq_len": self.config.seq_len,
            "quotas": self.sequence.quotas,
        }

    @property
    def samples_per_epoch(self) -> int:
        """Samples in one pass over all datasets (sum of each dataset's samples)."""
        return sum(self.sequence.sizes)

    def state_dict(self) -> dict[str, Any]:
        """The whole loader state: a few integers and fingerprints (JSON-able)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "seed": self.config.seed,
            "config_hash": self.config_hash,
            "consumed_samples": self.consumed,
        } | self._describe()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume after the last batch counted in `state`; O(1). Raises DataError on mismatch."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise DataError("loader state: not a tensoryard loader state (format field)")
        if state.get("version") != STATE_VERSION:
            raise DataError(
                f"loader state: version {state.get('version')!r}, expected {STATE_VERSION}"
            )
        diffs = self._differences(state)
        if diffs:
            raise DataError(
                "loader state is from another dataset or config: "
                + "; ".join(diffs)
                + " (fix: resume with the same datasets, seq_len, weights, shuffle and seed)"
            )
        consumed = state.get("consumed_samples")
        if not isinstance(consumed, int) or consumed < 0:
            raise DataError(f"loader state: consumed_samples {consumed!r} is not an integer >= 0")
        self.consumed = consumed

    def _differences(self, state: dict[str, Any]) -> list[str]:
        mine = self._describe() | {"seed": self.config.seed}
        diffs = [
            f"{key}: state has {state.get(key)!r}, loader has {value!r}"
            for key, value in mine.items()
            if state.get(key) != value
        ]
        if not diffs and state.get("config_hash") != self.config_hash:
            diffs.append(
                f"config_hash: state has {state.get('config_hash')!r}, loader has "
                f"{self.config_hash!r} (shuffle settings differ)"
            )
        return diffs

    # ------------------------------------------------------------------ the sequence
    def global_samples(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, sample index) of global positions [start, start + count)."""
        return self.sequence.samples(np.arange(start, start + count, dtype=np.int64))

    def rank_positions(self, batch_first: int) -> np.ndarray:
        """Global positions this rank reads from the global batch starting at `batch_first`."""
        lo = batch_first + self.rank * self.local_batch
        return np.arange(lo, lo + self.local_batch, dtype=np.int64)

    def locate(self, batch_firsts: Sequence[int]) -> _Block:
        """Which samples this rank reads for the given global batches (vectorised)."""
        firsts = np.asarray(batch_firsts, dtype=np.int64)
        offs = self.rank * self.local_batch + np.arange(self.local_batch, dtype=np.int64)
        d, s = self.sequence.samples((firsts[:, None] + offs[None, :]).reshape(-1))
        present = [0] if len(self.datasets) == 1 else distinct(d)
        parts = []
        for di in present:
            rows = np.arange(len(s)) if len(self.datasets) == 1 else np.flatnonzero(d == di)
            shard, local = self.datasets[di].locate(s[rows] * self.config.seq_len)
            parts.append(_Part(di, rows, shard, local))
        return _Block(firsts.tolist(), d, s, parts)

    def hint(self, *blocks: _Block) -> None:
        """Tell each dataset's source which shards the blocks read, in first-use order."""
        for di, ds in enumerate(self.datasets):
            if type(ds.source).hint is LocalShardSource.hint:
                continue  # a local directory ignores hints: skip building them
            shards = [p.shard for b in blocks for p in b.parts if p.dataset == di]
            if not shards:
                ds.source.hint([])
                continue
            ds.source.hint(list(dict.fromkeys(np.concatenate(shards).tolist())))

    def read(self, block: _Block) -> np.ndarray:
        """All samples of `block`, shape (batches, local_batch, seq_len + 1)."""
        out = np.empty((len(block.samples), self.sample_len), dtype=self.dtype)
        for p in block.parts:
            self.datasets[p.dataset].gather_located(p.shard, p.local, out, p.rows)
        return out.reshape(len(block.firsts), self.local_batch, self.sample_len)

    def read_batch(self, batch_first: int) -> np.ndarray:
        """This rank's slice of the global batch that starts at position `batch_first`."""
        batch: np.ndarray = self.read(self.locate([batch_first]))[0]
        return batch

    def batch_starts(self, first: int, every: int = 1) -> Iterator[int]:
        """Positions of the global batches from `first`, taking one every `every` batches."""
        step = self.config.global_batch * every
        g = first
        while True:
            yield g
            g += step

    def iter_batches(self, first: int, every: int = 1) -> Iterator[tuple[int, np.ndarray]]:
        """(batch position, batch) from `first` on, read `plan_batches` batches at a time.

        Batches are views into one buffer per block, never reused, so they stay valid.
        """
        for firsts, data in self.iter_blocks(first, every):
            yield from zip(firsts, data, strict=True)

    def iter_blocks(self, first: int, every: int = 1) -> Iterator[tuple[list[int], np.ndarray]]:
        """(batch positions, batches) of each block read, shape (batches, local_batch, len).

        What `iter_batches` yields batch by batch; adapters that convert a whole block at once
        (one tensor per block rather than per batch) use this.
        """
        return self.read_blocks(self.batch_starts(first, every))

    def read_blocks(self, starts: Iterator[int]) -> Iterator[tuple[list[int], np.ndarray]]:
        """Blocks of the global batches that start at each position of `starts`, in its order.

        `starts` may be endless or end; DataLoader workers that take runs of consecutive
        batches pass their own positions here.
        """
        sizes = self._block_sizes()
        upcoming = self._locate_next(starts, next(sizes))
        while upcoming is not None:
            # Locate one block ahead so a remote-shard cache gets a block of lead time.
            block = upcoming
            upcoming = self._locate_next(starts, next(sizes))
            self.hint(block, *([] if upcoming is None else [upcoming]))
            yield block.firsts, self.read(block)

    def _locate_next(self, starts: Iterator[int], count: int) -> _Block | None:
        firsts = list(itertools.islice(starts, count))
        return self.locate(firsts) if firsts else None

    def _block_sizes(self) -> Iterator[int]:
        # The first block is one batch: from a cold remote cache the first batch waits only
        # for its own samples' ranges, not for those of the batches after it.
        size = 1
        while True:
            yield size
            size = min(size * 2, self.config.plan_batches)

    def shard_order(self, dataset: int = 0, first: int | None = None) -> Iterator[int]:
        """Shards of `dataset` in the order this rank will first need them (lazy, endless).

        For a prefetching cache: consecutive repeats are removed, later repeats are kept.
        """
        starts = self.batch_starts(self.consumed if first is None else first)
        last = -1
        while True:
            block = self.locate([next(starts) for _ in range(self.config.plan_batches)])
            shards = [p.shard for p in block.parts if p.dataset == dataset]
            flat = np.concatenate(shards) if shards else np.empty(0, dtype=np.int64)
            for sh in flat.tolist():
                if sh != last:
                    yield sh
                    last = sh

    def __iter__(self) -> Iterator[np.ndarray]:
        """Batches from the current state on; each one advances `consumed` by global_batch."""
        for pos, batch in self.iter_batches(self.consumed):
            self.consumed = pos + self.config.global_batch
            yield batch

    def close(self) -> None:
        """Unmap all shards of all datasets."""
        for d in self.datasets:
            d.close()


def _check_same_tokenizer(datasets: list[TokenDataset]) -> None:
    first = datasets[0]
    for ds in datasets[1:]:
        a, b = first.manifest.tokenizer.get("hash"), ds.manifest.tokenizer.get("hash")
        if a != b:
            raise DataError(
                f"cannot blend {first.where} and {ds.where}: prepared with different tokenizers "
                f"({first.manifest.tokenizer.get('name')!r} {a} vs "
                f"{ds.manifest.tokenizer.get('name')!r} {b})"
            )
