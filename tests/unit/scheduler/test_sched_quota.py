"""Quota, cohorts, borrowing, lending and reclaim."""

from __future__ import annotations

import pytest
from sched_builders import apply, make_nodes, make_quotas, make_workload, schedule

from tensoryard.scheduler import SchedulerConfig
from tensoryard.spec.queue import CohortSpec, QueueSpec, QuotaConfig

NO_PREEMPTION = SchedulerConfig(
    reclaim=False, preempt_lower_priority=False, preempt_by_service=False
)


def one_gpu_jobs(queue: str, count: int, start: int = 0) -> list:
    return [
        make_workload(f"{queue}-{i}", queue).gpus(1).submitted(float(start + i)).obj()
        for i in range(count)
    ]


@pytest.mark.parametrize(
    ("extra", "expected_nlp"),
    [
        ({}, 16),
        ({"nlp": {"borrowing_limit": 4}}, 12),
        ({"cv": {"lending_limit": 2}}, 10),
        ({"nlp": {"borrowing_limit": 0}}, 8),
    ],
    ids=[
        "a queue borrows all the idle quota of its cohort",
        "a borrowing limit caps what a queue takes above nominal",
        "a lending limit caps what the lender gives away",
        "a zero borrowing limit keeps a queue at its nominal quota",
    ],
)
def test_borrowing_inside_a_cohort_respects_limits(extra: dict, expected_nlp: int) -> None:
    quotas = make_quotas({"nlp": {"H100": 8}, "cv": {"H100": 8}}, **extra)
    decisions = schedule(make_nodes(2), quotas, one_gpu_jobs("nlp", 20), config=NO_PREEMPTION)
    assert len(decisions.admissions) == expected_nlp


def test_a_queue_without_a_cohort_never_borrows() -> None:
    quotas = QuotaConfig.build(
        [QueueSpec(name="nlp", nominal={"H100": 4}), QueueSpec(name="cv", nominal={"H100": 12})]
    )
    decisions = schedule(make_nodes(2), quotas, one_gpu_jobs("nlp", 10))
    assert len(decisions.admissions) == 4
    info = decisions.pending["nlp-4"]
    assert info.code == "quota"
    assert "no cohort" in info.reason


def test_nested_cohorts_lend_across_the_parent() -> None:
    queues = [
        QueueSpec(name="a", cohort="left", nominal={"H100": 4}),
        QueueSpec(name="b", cohort="right", nominal={"H100": 12}),
    ]
    cohorts = [
        CohortSpec(name="root"),
        CohortSpec(name="left", parent="root"),
        CohortSpec(name="right", parent="root"),
    ]
    quotas = QuotaConfig.build(queues, cohorts)
    decisions = schedule(make_nodes(2), quotas, one_gpu_jobs("a", 20))
    assert len(decisions.admissions) == 16


def test_a_cohort_lending_limit_keeps_quota_inside_the_subtree() -> None:
    queues = [
        QueueSpec(name="a", cohort="left", nominal={"H100": 4}),
        QueueSpec(name="b", cohort="right", nominal={"H100": 12}),
    ]
    cohorts = [
        CohortSpec(name="root"),
        CohortSpec(name="left", parent="root"),
        CohortSpec(name="right", parent="root", lending_limit=2),
    ]
    quotas = QuotaConfig.build(queues, cohorts)
    decisions = schedule(make_nodes(2), quotas, one_gpu_jobs("a", 20))
    assert len(decisions.admissions) == 6


def test_the_pending_reason_names_need_usage_and_what_the_cohort_lends() -> None:
    quotas = make_quotas({"nlp": {"H100": 16}, "cv": {"H100": 16}})
    cv_running = [
        make_workload(f"cv-{i}", "cv").gpus(8).running_on({f"n{i}": range(8)}, start=0).obj()
        for i in range(3)
    ]
    nlp_running = make_workload("nlp-0", "nlp").gpus(8).running_on({"n3": range(8)}, start=0)
    big = make_workload("big", "nlp").gpus(8).nodes(2).obj()
    decisions = schedule(
        make_nodes(4), quotas, [big], [*cv_running, nlp_running.obj()], config=NO_PREEMPTION
    )
    info = decisions.pending["big"]
    assert info.code == "quota"
    assert info.reason.startswith("needs 16 H100; queue nlp uses 8 of its 16; cohort pool lends 0")
    assert info.details["used"] == 8 and info.details["nominal"] == 16


def test_a_lender_reclaims_its_quota_from_a_borrower() -> None:
    quotas = make_quotas({"nlp": {"H100": 8}, "cv": {"H100": 8}})
    nodes = make_nodes(2)
    borrowers = [
        make_workload(f"cv-{i}", "cv")
        .gpus(4)
        .running_on({f"n{i // 2}": range(4 * (i % 2), 4 * (i % 2) + 4)}, start=0)
        .obj()
        for i in range(4)
    ]
    lender = make_workload("nlp-1", "nlp").gpus(8).submitted(50).obj()
    first = schedule(nodes, quotas, [lender], borrowers, now=100)
    assert first.admissions == ()
    assert {p.reason for p in first.preemptions} == {"reclaim"}
    assert first.pending["nlp-1"].code == "preempting"
    pending, running = apply(first, [lender], borrowers, now=100)
    second = schedule(nodes, quotas, pending, running, now=220)
    assert [a.workload_id for a in second.admissions] == ["nlp-1"]


def test_reclaim_takes_only_what_the_lender_needs() -> None:
    quotas = make_quotas({"nlp": {"H100": 8}, "cv": {"H100": 8}})
    borrowers = [
        make_workload(f"cv-{i}", "cv")
        .gpus(2)
        .running_on({f"n{i // 4}": range(2 * (i % 4), 2 * (i % 4) + 2)}, start=0)
        .obj()
        for i in range(8)
    ]
    lender = make_workload("nlp-1", "nlp").gpus(2).obj()
    decisions = schedule(make_nodes(2), quotas, [lender], borrowers)
    assert len(decisions.preemptions) == 1


def test_a_queue_above_nominal_cannot_reclaim() -> None:
    quotas = make_quotas({"nlp": {"H100": 8}, "cv": {"H100": 8}})
    running = [
        make_workload("nlp-0", "nlp").gpus(8).running_on({"n0": range(8)}, start=0).obj(),
        make_workload("cv-0", "cv").gpus(8).running_on({"n1": range(8)}, start=0).obj(),
    ]
    extra = make_workload("nlp-1", "nlp").gpus(8).obj()
    only_reclaim = SchedulerConfig(preempt_by_service=False)
    decisions = schedule(make_nodes(2), quotas, [extra], running, config=only_reclaim)
    assert decisions.preemptions == ()
    assert decisions.pending["nlp-1"].code == "quota"


def test_cpu_quota_limits_cpu_only_workloads() -> None:
    quotas = QuotaConfig.build([QueueSpec(name="etl", cpu=4)])
    pending = [make_workload(f"e{i}", "etl").cpu_only(2).submitted(i).obj() for i in range(4)]
    decisions = schedule(make_nodes(1, gpus=0, cpu=16), quotas, pending)
    assert [a.workload_id for a in decisions.admissions] == ["e0", "e1"]
    assert decisions.pending["e2"].code == "quota"
    assert "CPU cores" in decisions.pending["e2"].reason
