"""The loader: exact epochs, exact resume, elastic resume, blending, bounded resources."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensoryard.data import (
    LoaderConfig,
    LocalShardSource,
    ReadMode,
    TokenDataset,
    TokenLoader,
    build_loader,
    open_dataset,
)
from tensoryard.errors import DataError

FIXTURES_OK = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def take(loader: TokenLoader, n: int) -> list[np.ndarray]:
    return [b.copy() for b in itertools.islice(loader, n)]


def global_stream(
    ds: TokenDataset, world: int, n_steps: int, state: dict[str, object] | None = None, **cfg: int
) -> list[np.ndarray]:
    """Global batches assembled from every rank's slices (ranks in order)."""
    loaders = [build_loader(ds, rank=r, world_size=world, **cfg) for r in range(world)]  # type: ignore[arg-type]
    if state is not None:
        for ld in loaders:
            ld.load_state_dict(state)
    per_rank = [take(ld, n_steps) for ld in loaders]
    return [np.concatenate([per_rank[r][t] for r in range(world)]) for t in range(n_steps)]


@FIXTURES_OK
@given(
    world=st.sampled_from([1, 2, 3, 4, 8]),
    per_rank=st.integers(1, 4),
    seq_len=st.sampled_from([16, 63, 128, 1000]),
    seed=st.integers(0, 2**31),
)
def test_every_sample_of_an_epoch_appears_exactly_once_across_ranks(
    open_counting: Callable[..., TokenDataset], world: int, per_rank: int, seq_len: int, seed: int
) -> None:
    ds = open_counting()
    gb = world * per_rank
    n = ds.num_samples(seq_len)
    steps = -(-n // gb)
    seen: list[int] = []
    for rank in range(world):
        ld = build_loader(
            ds, seq_len=seq_len, global_batch=gb, rank=rank, world_size=world, seed=seed
        )
        for t, batch in enumerate(itertools.islice(ld, steps)):
            for j, row in enumerate(batch):
                if t * gb + rank * per_rank + j < n:  # later positions already start epoch 1
                    # The counting dataset is short enough that a row's first token,
                    # i * seq_len, identifies the sample.
                    seen.append(int(row[0]) // seq_len)
    assert sorted(seen) == list(range(n))


@FIXTURES_OK
@given(
    world=st.sampled_from([1, 2, 4]), seed=st.integers(0, 1000), seq_len=st.sampled_from([32, 100])
)
def test_each_epoch_is_a_permutation_of_all_samples(
    open_counting: Callable[..., TokenDataset], world: int, seed: int, seq_len: int
) -> None:
    ds = open_counting()
    ld = build_loader(ds, seq_len=seq_len, global_batch=world, seed=seed)
    n = ds.num_samples(seq_len)
    d, s = ld.global_samples(0, 2 * n)
    assert (d == 0).all()
    assert sorted(s[:n].tolist()) == list(range(n))
    assert sorted(s[n:].tolist()) == list(range(n))
    assert not np.array_equal(s[:n], s[n:])  # epoch 1 is shuffled anew


@pytest.mark.parametrize("io", ["pread", "mmap"], ids=["with pread", "with memory maps"])
def test_samples_are_packed_windows_of_the_token_stream_across_shard_ends(
    open_counting: Callable[..., TokenDataset],
    window_of: Callable[[int, int], np.ndarray],
    io: ReadMode,
) -> None:
    ds = open_counting(io=io)
    seq_len = 333  # does not divide the 4000-token shards: many samples cross a shard end
    ld = build_loader(ds, seq_len=seq_len, global_batch=4, seed=7)
    _, order = ld.global_samples(0, 200)
    got = np.concatenate(take(ld, 50))
    for row, i in zip(got, order.tolist(), strict=True):
        assert np.array_equal(row, window_of(i, seq_len))


@FIXTURES_OK
@given(cut=st.integers(0, 40), world=st.sampled_from([1, 2, 4]), seed=st.integers(0, 99))
def test_the_stream_before_and_after_a_resume_concatenates_to_the_uninterrupted_stream(
    open_counting: Callable[..., TokenDataset], cut: int, world: int, seed: int
) -> None:
    ds = open_counting()
    cfg = {"seq_len": 64, "global_batch": 4 * world, "seed": seed}
    for rank in range(world):
        whole = take(build_loader(ds, rank=rank, world_size=world, **cfg), 40)
        first = build_loader(ds, rank=rank, world_size=world, **cfg)
        before = take(first, cut)
        state = first.state_dict()
        second = build_loader(open_counting(), rank=rank, world_size=world, **cfg)
        second.load_state_dict(state)
        after = take(second, 40 - cut)
        assert all(np.array_equal(a, b) for a, b in zip(before + after, whole, strict=True))


def test_elastic_resume_from_8_to_6_ranks_gives_the_same_global_sequence(
    open_counting: Callable[..., TokenDataset],
) -> None:
    ds = open_counting()
    cfg = {"seq_len": 50, "global_batch": 24, "seed": 3}
    uninterrupted = global_stream(ds, 8, 30, **cfg)
    eight = [build_loader(ds, rank=r, world_size=8, **cfg) for r in range(8)]  # type: ignore[arg-type]
    for ld in eight:
        take(ld, 12)
    state = eight[0].state_dict()
    assert all(ld.state_dict() == state for ld in eight)  # every rank checkpoints the same
    resumed = global_stream(ds, 6, 18, state=state, **cfg)
    assert all(np.array_equal(a, b) for a, b in zip(uninterrupted[12:], resumed, strict=True))


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(old=st.sampled_from([1, 2, 4, 8]), new=st.sampled_from([1, 2, 3, 6]), cut=st.integers(0, 10))
def test_any_change_of_world_size_keeps_the_global_sequence(
    open_counting: Callable[..., TokenDataset], old: int, new: int, cut: int
) -> None:
    ds = open_counting()
    cfg = {"seq_len": 40, "global_batch": 24, "seed": 11}
    reference = global_stream(ds, 1, cut + 5, **cfg)
    first = build_loader(ds, rank=0, world_size=old, **cfg)  # type: ignore[arg-type]
    take(first, cut)
    resumed = global_stream(ds, new, 5, state=first.state_dict(), **cfg)
    assert all(np.array_equal(a, b) for a, b in zip(reference[cut:], resumed, strict=True))


def test_a_blend_draws_each_dataset_by_its_weight_deterministically(
    counting_dir: Path, other_counting_dir: Path
) -> None:
    def make() -> TokenLoader:
        return build_loader(
            [counting_dir, other_counting_dir], seq_len=20, global_batch=8, weights=[3, 1], seed=5
        )

    ld = make()
    d, s = ld.global_samples(0, 4096)
    assert np.bincount(d).tolist() == [3072, 1024]  # exact: 3:1 in every 1024-position period
    assert np.bincount(d[:1024]).tolist() == [768, 256]
    d2, s2 = make().global_samples(0, 4096)
    assert np.array_equal(d, d2) and np.array_equal(s, s2)
    # Within an epoch of its own, a dataset never repeats a sample.
    for di, n in enumerate(ld.sequence.sizes):
        draws = s[d == di][:n].tolist()
        assert len(set(draws)) == len(draws)
    # Rows come from the right dataset: dataset 1's token t is (t + 17) % 60000.
    batch = next(iter(ld))
    for row, di, si in zip(batch, d[:8].tolist(), s[:8].tolist(), strict=True):
        offset = 17 if di == 1 else 0
        assert int(row[0]) == (si * 20 + offset) % 60_000


def test_resume_costs_the_same_at_any_position(open_counting: Callable[..., TokenDataset]) -> None:
    ds = open_counting()
    ld = build_loader(ds, seq_len=64, global_batch=8, seed=1)
    timings = []
    for consumed in (0, 8 * 10**6, 8 * 10**12):  # epoch 0 and epochs far in the future
        state = ld.state_dict() | {"consumed_samples": consumed}
        fresh = build_loader(ds, seq_len=64, global_batch=8, seed=1)
        t0 = time.perf_counter()
        fresh.load_state_dict(state)
        batch = next(iter(fresh))
        timings.append(time.perf_counter() - t0)
        assert batch.shape == (8, 65)
    assert max(timings) < 0.5  # generous on a loaded 2-core machine; typically ~2 ms


@pytest.mark.parametrize("io", ["pread", "mmap"], ids=["with pread", "with memory maps"])
def test_open_files_stay_bounded_and_reads_stay_exact(
    write_counting_dataset: Callable[..., Path],
    tmp_path: Path,
    io: ReadMode,
    window_of: Callable[[int, int], np.ndarray],
) -> None:
    directory = write_counting_dataset(tmp_path / "many", 50_001, 500)  # 101 shards
    ds = open_dataset(directory, max_open_shards=4, io=io)
    ld = build_loader(ds, seq_len=32, global_batch=16, seed=0, plan_batches=16)
    _, order = ld.global_samples(0, 300 * 16)
    fds_before = len(os.listdir("/proc/self/fd"))
    for step, batch in enumerate(itertools.islice(ld, 300)):
        assert len(ds._maps) + len(ds._fds) <= 4
        for row, i in zip(batch, order[step * 16 : step * 16 + 16].tolist(), strict=True):
            assert np.array_equal(row, window_of(i, 32))
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 4
    ds.close()
    assert len(os.listdir("/proc/self/fd")) <= fds_before


class RecordingSource(LocalShardSource):
    """A local source that records the loader's hints and releases."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hints: list[list[int]] = []
        self.released: list[int] = []

    def hint(self, upcoming: Sequence[int]) -> None:
        self.hints.append(list(upcoming))

    def release(self, index: int) -> None:
        self.released.append(index)


def test_the_source_hears_the_shards_in_read_order_before_they_are_read(counting_dir: Path) -> None:
    src = RecordingSource(counting_dir)
    ds = TokenDataset(src, max_open_shards=2)
    ld = TokenLoader(ds, LoaderConfig(seq_len=100, global_batch=4, seed=2, plan_batches=8))
    order = list(itertools.islice(ld.shard_order(), 30))
    take(ld, 20)
    assert src.hints, "the loader never hinted"
    hinted = list(dict.fromkeys(itertools.chain.from_iterable(src.hints)))
    assert hinted[:5] == list(dict.fromkeys(order))[:5]
    assert src.released  # the 2-map LRU evicted shards and said so


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"seq_len": 65}, "seq_len"),
        ({"seed": 2}, "seed"),
        ({"shuffle_block": 4}, "shuffle"),
    ],
    ids=[
        "a state from another sequence length is refused naming seq_len",
        "a state from another seed is refused naming the seed",
        "a state from other shuffle settings is refused",
    ],
)
def test_a_resume_state_from_another_config_is_refused(
    open_counting: Callable[..., TokenDataset], change: dict[str, int], expected: str
) -> None:
    base = {"seq_len": 64, "global_batch": 8, "seed": 1}
    state = build_loader(open_counting(), **base).state_dict()  # type: ignore[arg-type]
    other = build_loader(open_counting(), **(base | change))  # type: ignore[arg-type]
    with pytest.raises(DataError, match=expected):
        other.load_state_dict(state)


def test_a_resume_state_from_another_dataset_names_both_datasets(
    counting_dir: Path, other_counting_dir: Path
) -> None:
    state = build_loader(counting_dir, seq_len=64, global_batch=8).state_dict()
    other = build_loader(other_counting_dir, seq_len=64, global_batch=8)
    with pytest.raises(DataError, match="datasets: state has") as err:
        other.load_state_dict(state)
    assert open_dataset(counting_dir).dataset_id in str(err.value)


@pytest.mark.parametrize(
    "state",
    [{}, {"format": "tensoryard-loader-state", "version": 99}, {"format": "x"}],
    ids=["an empty dict", "a future state version", "something else"],
)
def test_a_malformed_resume_state_is_refused(
    open_counting: Callable[..., TokenDataset], state: dict[str, object]
) -> None:
    with pytest.raises(DataError, match="loader state"):
        build_loader(open_counting(), seq_len=64, global_batch=8).load_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"global_batch": 10, "world_size": 4}, "not divisible"),
        ({"global_batch": 8, "world_size": 4, "rank": 4}, "rank 4"),
        ({"global_batch": 8, "seq_len": 0}, "seq_len"),
        ({"global_batch": 8, "seq_len": 10**6}, "no sample fits"),
    ],
    ids=[
        "a global batch that does not split over the ranks",
        "a rank outside the world",
        "a zero sequence length",
        "a sequence longer than the dataset",
    ],
)
def test_an_impossible_loader_config_is_refused(
    open_counting: Callable[..., TokenDataset], kwargs: dict[str, int], expected: str
) -> None:
    args = {"seq_len": 64} | kwargs
    with pytest.raises(DataError, match=expected):
        build_loader(open_counting(), **args)  # type: ignore[arg-type]


def test_blend_weights_that_round_to_nothing_are_refused(
    counting_dir: Path, other_counting_dir: Path
) -> None:
    with pytest.raises(DataError, match="blend_period"):
        build_loader(
            [counting_dir, other_counting_dir], seq_len=8, global_batch=2, weights=[1, 1e-6]
        )
