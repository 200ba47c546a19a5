"""Which GPUs a local job's processes may see (CUDA_VISIBLE_DEVICES from its placement)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tensoryard.errors import ExecutorError
from tensoryard.executors.local.gpus import cuda_visible_devices


@pytest.mark.parametrize(
    ("placement", "gpus", "expected"),
    [
        ({}, 0, ""),
        ({"node": [1, 0]}, 2, "0,1"),
        ({}, 4, None),
        ({"node": [7]}, 1, "7"),
    ],
    ids=[
        "a cpu job sees no gpu",
        "a gpu job sees its placed gpus in order",
        "a gpu job without a placement leaves the variable alone",
        "a single gpu job sees its one gpu",
    ],
)
def test_cuda_visible_devices_follow_the_placement(
    placement: dict[str, Sequence[int]], gpus: int, expected: str | None
) -> None:
    assert cuda_visible_devices(placement, gpus) == expected


def test_a_placement_with_too_few_gpus_is_an_error() -> None:
    with pytest.raises(ExecutorError, match="the job asks for 2 per node"):
        cuda_visible_devices({"node": [0]}, 2)
