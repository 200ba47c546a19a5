"""Stateless permutations: bijections, determinism, locality of windowed shuffles."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tensoryard.data.permutation import FeistelPermutation, ShuffleOrder


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), key=st.integers(0, 2**63))
def test_feistel_permutation_is_a_bijection_of_any_size(n: int, key: int) -> None:
    out = FeistelPermutation(n, key)(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3000),
    key=st.integers(0, 2**32),
    block=st.integers(1, 50),
    window=st.none() | st.integers(1, 20),
)
def test_shuffle_order_is_a_bijection_with_any_block_and_window(
    n: int, key: int, block: int, window: int | None
) -> None:
    out = ShuffleOrder(n, key, block=block, window=window)(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(50, 3000), block=st.integers(2, 20), window=st.integers(1, 6))
def test_a_windowed_shuffle_reads_at_most_window_blocks_at_a_time(
    n: int, block: int, window: int
) -> None:
    out = ShuffleOrder(n, 5, block=block, window=window)(np.arange(n))
    span = block * window
    for lo in range(0, n, span):
        blocks = {s // block for s in out[lo : lo + span].tolist()}
        assert len(blocks) <= window + 1  # +1: the short tail block shares the last window


def test_the_same_key_gives_the_same_order_and_another_key_another() -> None:
    idx = np.arange(10_000)
    a, b, c = (ShuffleOrder(10_000, k)(idx) for k in (1, 1, 2))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_an_order_looks_random() -> None:
    out = ShuffleOrder(100_000, 3)(np.arange(100_000)).astype(float)
    assert abs(np.corrcoef(out[:-1], out[1:])[0, 1]) < 0.02
    assert abs(np.corrcoef(out, np.arange(100_000))[0, 1]) < 0.02
    assert np.count_nonzero(out == np.arange(100_000)) < 20  # few fixed points


def test_an_unshuffled_order_is_the_identity() -> None:
    idx = np.arange(500)
    assert np.array_equal(ShuffleOrder(500, 9, shuffle=False)(idx), idx)


def test_any_position_maps_in_constant_time_without_building_the_epoch() -> None:
    n = 10**15  # far more samples than memory could index
    perm = FeistelPermutation(n, 1)
    out = perm(np.array([0, n // 2, n - 1], dtype=np.uint64))
    assert ((out >= 0) & (out < n)).all()
    assert len(set(out.tolist())) == 3
