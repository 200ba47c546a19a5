"""Service preemption across queues: a newcomer may stop another queue's long runner that runs
on borrowed quota (at equal priority), as long as that queue keeps its nominal quota."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import make_nodes, make_quotas, make_workload, schedule

from tensoryard.scheduler import SchedulerConfig, Workload

QUOTAS = make_quotas({"a": {"H100": 8}, "b": {"H100": 8}, "c": {"H100": 16}})
NOW = 10_000.0


def runner(name: str, queue: str, node: str, *, start: float = 0.0, prio: int = 0) -> Workload:
    w: Workload = (
        make_workload(name, queue)
        .gpus(8)
        .priority(prio)
        .running_on({node: range(8)}, start=start, checkpoint=NOW - 60)
        .obj()
    )
    return w


def full_cluster(**b: Any) -> list[Workload]:
    """b borrows 8 with two long runners; a and c run within their nominal quotas."""
    return [
        runner("b-long0", "b", "n0", **b),
        runner("b-long1", "b", "n1", **b),
        runner("c-own", "c", "n2"),
        runner("a-own", "a", "n3", start=NOW - 100),  # too young for any service preemption
    ]


def newcomer(attained: float = 0.0, prio: int = 0) -> Workload:
    w: Workload = make_workload("new", "a").gpus(8).priority(prio).attained(attained).obj()
    return w


def test_a_newcomer_preempts_a_long_runner_of_a_borrowing_queue() -> None:
    decisions = schedule(make_nodes(4), QUOTAS, [newcomer()], full_cluster(), now=NOW)
    assert [p.reason for p in decisions.preemptions] == ["borrowed-service"]
    assert decisions.preemptions[0].workload_id.startswith("b-long")
    assert decisions.preemptions[0].preemptor_id == "new"


@pytest.mark.parametrize(
    ("running", "pending", "config"),
    [
        (
            [
                runner("b-own", "b", "n0"),
                runner("c0", "c", "n1"),
                runner("c1", "c", "n2"),
                runner("a-own", "a", "n3"),
            ],
            newcomer(),
            SchedulerConfig(),
        ),
        (full_cluster(start=NOW - 100), newcomer(), SchedulerConfig()),
        (full_cluster(prio=1), newcomer(), SchedulerConfig()),
        (full_cluster(), newcomer(attained=20_000.0), SchedulerConfig()),
        (full_cluster(), newcomer(), SchedulerConfig(service_preemption_of_borrowers=False)),
    ],
    ids=[
        "a queue within its nominal quota is never preempted for service",
        "a runner younger than service_preemption_min_run_s is not preempted",
        "a higher-priority long runner is not preempted",
        "a newcomer with as much service as the runner does not preempt it",
        "service_preemption_of_borrowers=False turns it off",
    ],
)
def test_borrowed_service_preemption_respects_its_rules(
    running: list[Workload], pending: Workload, config: SchedulerConfig
) -> None:
    decisions = schedule(make_nodes(4), QUOTAS, [pending], running, now=NOW, config=config)
    assert [p for p in decisions.preemptions if p.reason == "borrowed-service"] == []


def test_a_borrowing_queue_keeps_its_nominal_quota_after_service_preemption() -> None:
    two = [newcomer(), make_workload("new2", "a").gpus(8).obj()]
    decisions = schedule(make_nodes(4), QUOTAS, two, full_cluster(), now=NOW)
    # b borrows 8: only one of its two runners may go, whatever asks for more
    assert len([p for p in decisions.preemptions if p.workload_id.startswith("b-")]) == 1
