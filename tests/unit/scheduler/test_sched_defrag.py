"""Defragmentation: small jobs move so that a gang that fails on placement alone can start."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sched_builders import apply, make_nodes, make_quotas, make_workload, schedule

from tensoryard.scheduler import SchedulerConfig, Workload

QUOTAS = make_quotas({"team-a": {"H100": 24}, "team-b": {"H100": 24}})
NOW = 1000.0


def small(name: str, node: str, gpus: int = 1, **kw: Any) -> Workload:
    """A running single-node job on GPUs 0.. of `node` (started at 0 unless told)."""
    b = make_workload(name, kw.pop("queue", "team-b")).gpus(gpus).priority(kw.pop("priority", 0))
    b = b.running_on(
        {node: range(gpus)}, start=kw.pop("start", 0.0), checkpoint=kw.pop("ckpt", 990)
    )
    w: Workload = b.obj()
    return replace(w, **kw) if kw else w


def fragmented(**every: Any) -> list[Workload]:
    """16 GPUs free in total, but no node has 8: n0 and n1 run one small job each, n2 a
    6-GPU job. `every` overrides fields of all three."""
    return [
        small("s0", "n0", ckpt=995, **every),
        small("s1", "n1", ckpt=900, **every),
        small("busy", "n2", gpus=6, ckpt=990, **every),
    ]


def gang(priority: int = 0) -> Workload:
    w: Workload = make_workload("gang", "team-a").gpus(8).priority(priority).submitted(999).obj()
    return w


def test_a_fragmented_cluster_preempts_a_small_checkpointed_job_to_place_an_8_gpu_gang() -> None:
    running = fragmented()
    decisions = schedule(make_nodes(3), QUOTAS, [gang()], running, now=NOW)
    assert [(p.workload_id, p.reason) for p in decisions.preemptions] == [("s0", "defragment")]
    assert decisions.preemptions[0].preemptor_id == "gang"
    assert decisions.preemptions[0].work_lost_gpu_s == pytest.approx(5.0)
    assert decisions.pending["gang"].code == "preempting"


def test_after_the_move_the_gang_gets_the_whole_node_and_the_victim_restarts_elsewhere() -> None:
    running = fragmented()
    pending = [gang()]
    decisions = schedule(make_nodes(3), QUOTAS, pending, running, now=NOW)
    pending, running = apply(decisions, pending, running, now=NOW)
    victim = next(w for w in fragmented() if w.id == "s0")
    resumed = replace(victim, placement=None, start_time=None, last_checkpoint_time=None)
    pending = [*pending, resumed]
    second = schedule(make_nodes(3), QUOTAS, pending, running, now=NOW + 30)
    admitted = second.admitted
    assert set(admitted) == {"gang", "s0"}
    assert list(admitted["gang"].gpus) == ["n0"]
    assert list(admitted["s0"].gpus) != ["n0"]
    assert second.preemptions == ()


@pytest.mark.parametrize(
    ("running", "config"),
    [
        (
            [small("s0", "n0"), small("full", "n1", gpus=8), small("s2", "n2", gpus=7)],
            SchedulerConfig(),
        ),
        (fragmented(start=NOW - 100), SchedulerConfig()),
        (fragmented(priority=5), SchedulerConfig()),
        (fragmented(preemptible=False), SchedulerConfig()),
        (fragmented(), SchedulerConfig(defragment=False)),
    ],
    ids=[
        "no move when the moved job could not restart at once on GPUs left free",
        "a job that ran less than defrag_min_run_s is not moved",
        "a higher-priority job is not moved for a lower-priority gang",
        "a non-preemptible job is not moved",
        "defragment=False turns the feature off",
    ],
)
def test_defragmentation_moves_nothing_when_a_rule_forbids_it(
    running: list[Workload], config: SchedulerConfig
) -> None:
    decisions = schedule(make_nodes(3), QUOTAS, [gang()], running, now=NOW, config=config)
    assert [p for p in decisions.preemptions if p.reason == "defragment"] == []
    assert decisions.admissions == ()


def test_a_gang_that_fits_on_free_nodes_preempts_nothing() -> None:
    running = [small("s0", "n0"), small("s1", "n1")]
    decisions = schedule(make_nodes(3), QUOTAS, [gang()], running, now=NOW)
    assert decisions.preemptions == ()
    assert list(decisions.admitted["gang"].gpus) == ["n2"]


def test_defragmentation_clears_one_node_per_gang_worker_for_a_two_node_gang() -> None:
    running = [small(f"s{i}", f"n{i}", ckpt=990 + i) for i in range(4)]
    wide = make_workload("gang", "team-a").gpus(8).nodes(2).submitted(999).obj()
    decisions = schedule(make_nodes(4), QUOTAS, [wide], running, now=NOW)
    moved = sorted(p.workload_id for p in decisions.preemptions)
    assert moved == ["s2", "s3"]  # the two that checkpointed last lose the least work
    assert {p.reason for p in decisions.preemptions} == {"defragment"}


def test_a_job_wider_than_the_gang_worker_is_not_moved() -> None:
    running = [small(f"s{i}", f"n{i}", gpus=5) for i in range(3)]  # 3 free on each node
    four = make_workload("gang", "team-a").gpus(4).submitted(999).obj()
    decisions = schedule(make_nodes(3), QUOTAS, [four], running, now=NOW)
    assert decisions.preemptions == ()
    assert decisions.admissions == ()


def test_reclaim_clears_one_whole_node_when_the_cheapest_victims_are_scattered() -> None:
    # team-b borrows: 1-GPU jobs fill both nodes; the freshest checkpoints alternate between
    # the nodes, so the cheapest 8 victims never free one node. Node n1 is cheaper in total.
    quotas = make_quotas({"team-a": {"H100": 8}, "team-b": {"H100": 8}})
    running = [
        small(f"b{node}{g}", f"n{node}", ckpt=(999 - g if node == 0 else 998 - g), start=0.0)
        for node in range(2)
        for g in range(8)
    ]
    running = [
        replace(
            w, placement=replace(w.placement, gpus={next(iter(w.placement.gpus)): (int(w.id[2]),)})
        )
        if w.placement is not None
        else w
        for w in running
    ]
    running = [replace(w, last_checkpoint_time=900.0) if w.id == "b07" else w for w in running]
    config = SchedulerConfig(max_victim_candidates=8)
    decisions = schedule(make_nodes(2), quotas, [gang()], running, now=NOW, config=config)
    victims = {p.workload_id for p in decisions.preemptions}
    assert {p.reason for p in decisions.preemptions} == {"reclaim"}
    assert victims == {f"b1{g}" for g in range(8)}
