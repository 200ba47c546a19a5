"""Ordering: priority, weighted dominant fair share with decaying history, submit time."""

from __future__ import annotations

import math

import pytest
from sched_builders import make_nodes, make_quotas, make_workload, schedule

from tensoryard.scheduler import DecayedUsage, Scheduler, SchedulerConfig, Snapshot, decay_usage
from tensoryard.spec.queue import QueueSpec, QuotaConfig

QUIET = SchedulerConfig(
    reclaim=False, preempt_lower_priority=False, preempt_by_service=False, max_reservations=0
)


def admitted_ids(decisions) -> list[str]:
    return [a.workload_id for a in decisions.admissions]


def test_higher_priority_goes_first_even_if_submitted_later() -> None:
    jobs = [
        make_workload("early").gpus(8).submitted(0).obj(),
        make_workload("urgent").gpus(8).priority(10).submitted(5).obj(),
    ]
    decisions = schedule(make_nodes(1), make_quotas({"team-a": {"H100": 8}}), jobs, config=QUIET)
    assert admitted_ids(decisions) == ["urgent"]


def test_at_equal_priority_earlier_submissions_go_first() -> None:
    jobs = [make_workload(f"j{i}").gpus(8).submitted(10 - i).obj() for i in range(3)]
    decisions = schedule(make_nodes(1), make_quotas({"team-a": {"H100": 8}}), jobs, config=QUIET)
    assert admitted_ids(decisions) == ["j2"]


@pytest.mark.parametrize(
    ("weights", "expected"),
    [({"a": 1.0, "b": 1.0}, (4, 4)), ({"a": 3.0, "b": 1.0}, (6, 2))],
    ids=["equal weights split the idle pool evenly", "weights split it in proportion"],
)
def test_weighted_fair_share_divides_contended_capacity(
    weights: dict[str, float], expected: tuple[int, int]
) -> None:
    quotas = make_quotas(
        {"a": {"H100": 0}, "b": {"H100": 0}, "owner": {"H100": 8}},
        a={"weight": weights["a"]},
        b={"weight": weights["b"]},
    )
    jobs = [
        make_workload(f"{q}{i}", q).gpus(1).submitted(i).obj() for q in ("a", "b") for i in range(8)
    ]
    decisions = schedule(make_nodes(1), quotas, jobs, config=QUIET)
    per_queue = [sum(1 for a in decisions.admissions if a.workload_id.startswith(q)) for q in "ab"]
    assert tuple(per_queue) == expected


def test_a_queue_that_used_a_lot_recently_waits_behind_one_that_did_not() -> None:
    quotas = make_quotas({"a": {"H100": 4}, "b": {"H100": 4}})
    history = {"a": DecayedUsage(gpu_seconds={"H100": 8 * 3600.0}, as_of=0.0)}
    jobs = [make_workload("a1", "a").gpus(8).submitted(0).obj()]
    jobs.append(make_workload("b1", "b").gpus(8).submitted(5).obj())
    snap = Snapshot(nodes=make_nodes(1), quotas=quotas, pending=tuple(jobs), usage_history=history)
    decisions = Scheduler(QUIET).schedule(snap, now=60.0)
    assert admitted_ids(decisions) == ["b1"]


def test_usage_history_decays_with_the_half_life() -> None:
    history = {"a": DecayedUsage(gpu_seconds={"H100": 1000.0}, as_of=0.0)}
    out = decay_usage(history, [], now=3600.0, half_life_s=3600.0)
    assert out["a"].gpu_seconds["H100"] == pytest.approx(500.0)
    assert out["a"].as_of == 3600.0


def test_usage_history_adds_the_exact_decayed_integral_of_running_work() -> None:
    running = make_workload("r", "a").gpus(8).running_on({"n0": range(8)}, start=0).obj()
    out = decay_usage({}, [running], now=3600.0, half_life_s=3600.0)
    expected = 8 * 3600.0 / math.log(2) * 0.5
    assert out["a"].gpu_seconds["H100"] == pytest.approx(expected)


def test_the_scheduler_returns_history_to_feed_into_the_next_cycle() -> None:
    quotas = make_quotas({"a": {"H100": 8}})
    running = make_workload("r", "a").gpus(8).running_on({"n0": range(8)}, start=0).obj()
    decisions = schedule(make_nodes(1), quotas, [], [running], now=100.0)
    assert decisions.usage_history["a"].as_of == 100.0
    assert decisions.usage_history["a"].gpu_seconds["H100"] > 0


def test_a_resumed_long_runner_waits_behind_newcomers_of_its_queue() -> None:
    jobs = [
        make_workload("resumed").gpus(8).submitted(0).attained(4 * 3600).obj(),
        make_workload("new").gpus(8).submitted(100).obj(),
    ]
    quotas = make_quotas({"team-a": {"H100": 8}})
    decisions = schedule(make_nodes(1), quotas, jobs, config=QUIET)
    assert admitted_ids(decisions) == ["new"]
    no_levels = SchedulerConfig(
        service_levels_gpu_s=(), reclaim=False, preempt_by_service=False, max_reservations=0
    )
    assert admitted_ids(schedule(make_nodes(1), quotas, jobs, config=no_levels)) == ["resumed"]


def test_the_same_snapshot_gives_the_same_decisions_in_any_input_order() -> None:
    quotas = QuotaConfig.build(
        [QueueSpec(name=q, cohort="pool", nominal={"H100": 8}) for q in ("a", "b", "c")], None
    )
    jobs = [
        make_workload(f"{q}{i}", q).gpus(1 + i % 4).submitted(i % 3).obj()
        for q in "abc"
        for i in range(12)
    ]
    first = schedule(make_nodes(3), quotas, jobs)
    second = schedule(make_nodes(3), quotas, list(reversed(jobs)))
    assert first.admissions == second.admissions
    assert dict(first.pending) == dict(second.pending)


def test_work_within_nominal_quota_goes_before_work_that_would_borrow() -> None:
    quotas = make_quotas({"lender": {"H100": 12}, "borrower": {"H100": 4}})
    running = [
        make_workload("l-run", "lender").gpus(6).running_on({"n0": range(6)}, start=0).obj(),
        make_workload("b-run", "borrower").gpus(4).running_on({"n1": range(4)}, start=0).obj(),
    ]
    jobs = [
        make_workload("b-more", "borrower").gpus(4).submitted(0).obj(),  # would borrow
        make_workload("l-own", "lender").gpus(4).submitted(50).obj(),  # within its nominal
    ]
    no_history = dict(
        reclaim=False,
        preempt_lower_priority=False,
        preempt_by_service=False,
        max_reservations=0,
        fair_share_half_life_s=0.0,
    )
    first = schedule(make_nodes(2), quotas, jobs, running, config=SchedulerConfig(**no_history))
    assert admitted_ids(first) == ["l-own"]
    # Without it the lower dominant share (the borrower's 4/16 against 6/16) goes first.
    plain = SchedulerConfig(nominal_first=False, **no_history)
    assert admitted_ids(schedule(make_nodes(2), quotas, jobs, running, config=plain)) == ["b-more"]
