"""Cluster shapes, gang shapes and free-GPU bookkeeping of the simulated cluster."""

from __future__ import annotations

import pytest

from tensoryard.errors import ConfigError
from tensoryard.sim.cluster import ClusterState, gang_shape, parse_cluster_shape


@pytest.mark.parametrize(
    ("text", "nodes", "gpus", "model"),
    [("64x8", 64, 8, "gpu"), ("4X4:H100", 4, 4, "H100"), (" 2 x 8 ", 2, 8, "gpu")],
    ids=["plain", "with a GPU model", "with spaces"],
)
def test_a_cluster_shape_is_nodes_by_gpus(text: str, nodes: int, gpus: int, model: str) -> None:
    shape = parse_cluster_shape(text)
    assert (shape.nodes, shape.gpus_per_node, shape.gpu_model) == (nodes, gpus, model)


@pytest.mark.parametrize(
    "text", ["64", "64x", "0x8", "8x0", "8x99", "x8"], ids=lambda t: f"shape {t!r} is rejected"
)
def test_a_bad_cluster_shape_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="cluster shape"):
        parse_cluster_shape(text)


def test_nodes_are_numbered_switch_by_switch() -> None:
    shape = parse_cluster_shape("10x8", nodes_per_switch=4)
    assert shape.switches == 3
    assert [shape.switch_of(n) for n in (0, 3, 4, 9)] == [0, 0, 1, 2]


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [(1, (1, 1)), (8, (1, 8)), (16, (2, 8)), (64, (8, 8)), (12, (2, 6))],
    ids=["one GPU", "a full node", "two nodes", "eight nodes", "an uneven request is spread"],
)
def test_jobs_larger_than_a_node_become_gangs_of_nodes(
    gpus: int, expected: tuple[int, int]
) -> None:
    assert gang_shape(gpus, 8) == expected


def test_a_small_job_goes_to_the_fullest_node_that_fits() -> None:
    state = ClusterState(parse_cluster_shape("3x8"))
    state.allocate({1: (0, 1, 2, 3, 4, 5)})  # node 1 has 2 free
    assert state.find(1, 2) == {1: (6, 7)}
    assert state.find(1, 3) == {0: (0, 1, 2)}


def test_a_gang_lands_under_one_switch_when_one_has_room() -> None:
    state = ClusterState(parse_cluster_shape("8x8", nodes_per_switch=4))
    state.allocate({0: (0,)})  # switch 0 has 3 whole nodes left, switch 1 has 4
    placement = state.find(3, 8)
    assert placement is not None
    assert {n // 4 for n in placement} == {0}  # best-fit switch: the one with exactly 3


def test_a_gang_that_does_not_fit_is_not_placed_at_all() -> None:
    state = ClusterState(parse_cluster_shape("2x8"))
    state.allocate({0: (0,)})
    assert state.find(2, 8) is None
    assert state.free_gpus == 15


def test_a_gpu_cannot_be_allocated_twice() -> None:
    state = ClusterState(parse_cluster_shape("1x8"))
    state.allocate({0: (0, 1)})
    with pytest.raises(ConfigError, match="allocated twice"):
        state.allocate({0: (1, 2)})
    state.release({0: (0, 1)})
    assert state.free_gpus == 8 and state.max_free_on_a_node() == 8
