"""How DataLoader workers split the batches into groups (tensoryard.data.torch_workers)."""

from __future__ import annotations

import itertools

import pytest

from tensoryard.data.torch_workers import worker_groups


@pytest.mark.parametrize(
    ("workers", "group", "total"),
    [
        pytest.param(1, 64, 1000, id="one worker"),
        pytest.param(2, 5, 23, id="two workers, a total inside a group"),
        pytest.param(3, 4, 7, id="three workers, fewer batches than a full round"),
        pytest.param(8, 64, 2000, id="eight workers, full groups"),
        pytest.param(2, 1, 9, id="one batch per slot"),
    ],
)
def test_the_workers_groups_tile_the_batches_exactly_once(
    workers: int, group: int, total: int
) -> None:
    groups = sorted(g for w in range(workers) for g in worker_groups(w, workers, group, total))
    starts = [lo for lo, _ in groups]
    assert starts == list(itertools.accumulate([0] + [n for _, n in groups[:-1]]))
    assert sum(n for _, n in groups) == total
    assert all(1 <= n <= group for _, n in groups)


def test_each_worker_starts_with_one_batch_and_doubles_up_to_a_slot() -> None:
    first = list(itertools.islice(worker_groups(1, 2, 64, None), 9))
    assert [n for _, n in first] == [1, 2, 4, 8, 16, 32, 64, 64, 64]
