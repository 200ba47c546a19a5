"""Checkpoint-aware preemption: who is chosen, why, and what happens next."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import apply, make_nodes, make_quotas, make_workload, schedule

from tensoryard.errors import ConfigError
from tensoryard.scheduler import SchedulerConfig

PRIORITY_ONLY = SchedulerConfig(reclaim=False, preempt_by_service=False)
ONE_QUEUE = make_quotas({"team-a": {"H100": 16}})


def two_low_priority_runners(checkpoints: tuple[float | None, float | None]) -> list:
    return [
        make_workload(f"low{i}")
        .gpus(8)
        .priority(0)
        .running_on({f"n{i}": range(8)}, start=0, checkpoint=checkpoints[i])
        .obj()
        for i in range(2)
    ]


@pytest.mark.parametrize(
    ("checkpoints", "victim"),
    [((900.0, 100.0), "low0"), ((100.0, 900.0), "low1"), ((None, 950.0), "low1")],
    ids=[
        "the victim is the one that checkpointed most recently (low0)",
        "the victim is the one that checkpointed most recently (low1)",
        "a job that never checkpointed loses everything, so the other goes",
    ],
)
def test_preemption_minimises_work_lost_since_the_last_checkpoint(
    checkpoints: tuple[float | None, float | None], victim: str
) -> None:
    urgent = make_workload("urgent").gpus(8).priority(5).obj()
    running = two_low_priority_runners(checkpoints)
    decisions = schedule(make_nodes(2), ONE_QUEUE, [urgent], running, config=PRIORITY_ONLY)
    assert [p.workload_id for p in decisions.preemptions] == [victim]
    assert decisions.preemptions[0].reason == "priority"
    assert decisions.preemptions[0].preemptor_id == "urgent"


def test_at_equal_work_lost_the_lower_priority_then_the_youngest_goes() -> None:
    running = [
        make_workload("old")
        .gpus(8)
        .priority(1)
        .running_on({"n0": range(8)}, start=0, checkpoint=990)
        .obj(),
        make_workload("young")
        .gpus(8)
        .priority(1)
        .running_on({"n1": range(8)}, start=500, checkpoint=990)
        .obj(),
        make_workload("lowest")
        .gpus(8)
        .priority(0)
        .running_on({"n2": range(8)}, start=0, checkpoint=990)
        .obj(),
    ]
    urgent = make_workload("urgent").gpus(8).priority(5).obj()
    quotas = make_quotas({"team-a": {"H100": 24}})
    decisions = schedule(make_nodes(3), quotas, [urgent], running, config=PRIORITY_ONLY)
    assert [p.workload_id for p in decisions.preemptions] == ["lowest"]
    running = running[:2]
    decisions = schedule(make_nodes(2), ONE_QUEUE, [urgent], running, config=PRIORITY_ONLY)
    assert [p.workload_id for p in decisions.preemptions] == ["young"]


def test_victims_get_a_grace_period_and_a_message() -> None:
    config = SchedulerConfig(reclaim=False, preempt_by_service=False, preemption_grace_s=300)
    urgent = make_workload("urgent").gpus(8).priority(5).obj()
    decisions = schedule(
        make_nodes(2), ONE_QUEUE, [urgent], two_low_priority_runners((900.0, 100.0)), config=config
    )
    pre = decisions.preemptions[0]
    assert pre.grace_s == 300
    assert pre.work_lost_gpu_s == 8 * (1000.0 - 900.0)
    assert "checkpoint within 300 s" in pre.message
    assert decisions.pending["urgent"].eta_s == 1300.0


def test_equal_or_higher_priority_work_is_never_preempted_for_priority() -> None:
    same = make_workload("same").gpus(8).priority(0).obj()
    decisions = schedule(
        make_nodes(2), ONE_QUEUE, [same], two_low_priority_runners((0.0, 0.0)), config=PRIORITY_ONLY
    )
    assert decisions.preemptions == ()


def test_a_non_preemptible_job_is_never_a_victim() -> None:
    running = [
        make_workload(f"safe{i}")
        .gpus(8)
        .not_preemptible()
        .running_on({f"n{i}": range(8)}, start=0)
        .obj()
        for i in range(2)
    ]
    urgent = make_workload("urgent").gpus(8).priority(100).obj()
    decisions = schedule(make_nodes(2), ONE_QUEUE, [urgent], running)
    assert decisions.preemptions == ()


def test_victims_still_stopping_are_not_preempted_twice() -> None:
    urgent = make_workload("urgent").gpus(8).priority(5).obj()
    running = two_low_priority_runners((900.0, 100.0))
    first = schedule(make_nodes(2), ONE_QUEUE, [urgent], running, config=PRIORITY_ONLY)
    pending, running = apply(first, [urgent], running, now=1000, stop_victims=False)
    second = schedule(make_nodes(2), ONE_QUEUE, pending, running, now=1030, config=PRIORITY_ONLY)
    assert second.preemptions == ()
    assert second.pending["urgent"].code == "preempting"
    pending, running = apply(first, pending, [w for w in running if not w.terminating], now=1100)
    third = schedule(make_nodes(2), ONE_QUEUE, pending, running, now=1100, config=PRIORITY_ONLY)
    assert [a.workload_id for a in third.admissions] == ["urgent"]


def test_a_long_runner_yields_to_a_newcomer_of_its_queue_at_its_checkpoint() -> None:
    long_runner = (
        make_workload("long").gpus(8).running_on({"n0": range(8)}, start=0, checkpoint=3500).obj()
    )
    newcomer = make_workload("new").gpus(8).submitted(3590).obj()
    quotas = make_quotas({"team-a": {"H100": 8}})
    decisions = schedule(make_nodes(1), quotas, [newcomer], [long_runner], now=3600)
    assert [(p.workload_id, p.reason) for p in decisions.preemptions] == [
        ("long", "attained-service")
    ]
    fresh = make_workload("long").gpus(8).running_on({"n0": range(8)}, start=3300).obj()
    decisions = schedule(make_nodes(1), quotas, [newcomer], [fresh], now=3600)
    assert decisions.preemptions == ()  # ran less than service_preemption_min_run_s


def test_preemption_stops_after_the_per_cycle_budget() -> None:
    running = [
        make_workload(f"low{i}").gpus(1).running_on({f"n{i // 8}": [i % 8]}, start=0).obj()
        for i in range(16)
    ]
    urgent = [make_workload(f"u{i}").gpus(1).priority(5).submitted(i).obj() for i in range(10)]
    config = SchedulerConfig(reclaim=False, preempt_by_service=False, max_preemptors_per_cycle=3)
    decisions = schedule(make_nodes(2), ONE_QUEUE, urgent, running, config=config)
    assert len(decisions.preemptions) == 3


def test_gpus_freed_early_during_a_grace_period_are_kept_for_the_preemptor() -> None:
    quotas = make_quotas({"a": {"H100": 4}, "b": {"H100": 4}})
    running = [
        make_workload(f"b{i}", "b").gpus(1).running_on({"n0": [i]}, start=0, checkpoint=990).obj()
        for i in range(8)
    ]
    mine = make_workload("mine", "a").gpus(4).submitted(600).obj()
    config = SchedulerConfig(preempt_by_service=False)
    first = schedule(make_nodes(1), quotas, [mine], running, now=1000, config=config)
    victims = {p.workload_id for p in first.preemptions}
    assert len(victims) == 4 and all(p.reason == "reclaim" for p in first.preemptions)
    pending, running = apply(first, [mine], running, now=1000, stop_victims=False)
    early = sorted(victims)[0]
    running = [w for w in running if w.id != early]  # finished on its own during the grace
    queued = make_workload("b-next", "b").gpus(1).submitted(1).obj()
    second = schedule(make_nodes(1), quotas, [*pending, queued], running, now=1010, config=config)
    assert second.admissions == ()  # the GPU freed early waits for "mine"
    assert second.preemptions == ()
    assert second.pending["mine"].code == "preempting"
    assert second.reservations["mine"] == ("n0",)


@pytest.mark.parametrize(
    ("preempted_for", "preemptor_of_v2"),
    [("p1", "p2"), (None, "p1")],
    ids=[
        "a victim in its grace period counts only for the job it was preempted for",
        "a victim preempted for an unknown job counts for whoever comes first",
    ],
)
def test_a_preemptor_keeps_the_victims_it_already_waits_for(
    preempted_for: str | None, preemptor_of_v2: str
) -> None:
    """One node of 4 GPUs. v1 (2 GPUs) is stopping after a preemption for p1; v2 (2 GPUs)
    runs. p2 and p1 (priority 5, 2 GPUs each) wait, p2 first. Without the link p2 counts on
    v1's GPUs and p1 must preempt v2 again (the thrash seen on Philly 30000-30300: 20k
    reclaims for 300 jobs); with it, p2 preempts v2 and p1 issues nothing new."""
    v1 = (
        make_workload("v1")
        .gpus(2)
        .running_on({"n0": (0, 1)}, start=0, checkpoint=900.0)
        .terminating()
        .obj()
    )
    v1 = replace(v1, preempted_for=preempted_for)
    v2 = make_workload("v2").gpus(2).running_on({"n0": (2, 3)}, start=0, checkpoint=900.0).obj()
    p2 = make_workload("p2").gpus(2).priority(5).submitted(1.0).obj()
    p1 = make_workload("p1").gpus(2).priority(5).submitted(2.0).obj()
    quotas = make_quotas({"team-a": {"H100": 4}})
    decisions = schedule(make_nodes(1, gpus=4), quotas, [p1, p2], [v1, v2], config=PRIORITY_ONLY)
    assert [(p.workload_id, p.preemptor_id) for p in decisions.preemptions] == [
        ("v2", preemptor_of_v2)
    ]


def test_reclaim_counts_only_the_borrowing_of_work_that_stays() -> None:
    """Queues a and b own 4 GPUs each of one 8-GPU node. b runs 6 (2 borrowed), but 2 of
    them are already stopping for another job: once they are gone b is at its nominal quota,
    so a's new 2-GPU job must not reclaim b's remaining work (it would push b below its
    quota, b's jobs would come back within nominal and the reclaim would repeat)."""
    b_jobs = [
        make_workload(f"b{i}", "b").gpus(1).running_on({"n0": (i,)}, start=0).obj()
        for i in range(6)
    ]
    b_jobs[4:] = [replace(w, terminating=True, preempted_for="elsewhere") for w in b_jobs[4:]]
    a_jobs = [
        make_workload(f"a{i}", "a").gpus(1).running_on({"n0": (6 + i,)}, start=0).obj()
        for i in range(2)
    ]
    newcomer = make_workload("a-new", "a").gpus(2).obj()
    quotas = make_quotas({"a": {"H100": 4}, "b": {"H100": 4}})
    decisions = schedule(make_nodes(1), quotas, [newcomer], b_jobs + a_jobs)
    assert decisions.preemptions == ()


@pytest.mark.parametrize("reclaiming", [False, True], ids=["no memory", "preemptor remembered"])
def test_the_room_made_by_a_reclaim_goes_to_the_workload_it_was_made_for(
    reclaiming: bool,
) -> None:
    """Queues a and b own one 8-GPU node each. a's 16-GPU job ran on both (borrowing b's node)
    and b's 8-GPU job reclaimed it; now it is gone and both nodes are free. Waiting: a's job
    again (borrowing), b's 16-GPU job (borrowing, submitted first) and the reclaimer b-small.
    Without remembering whom the room was made for, a borrower takes both nodes and b-small
    must reclaim again next cycle (the livelock seen on the test cluster: 8-node borrowers of
    ten teams preempted each other's attempts within seconds, 413 jobs waiting, the GPUs
    mostly idle); with it, b-small starts first."""
    quotas = make_quotas({"a": {"H100": 8}, "b": {"H100": 8}})
    a_big = make_workload("a-big", "a").gpus(8).nodes(2).submitted(0.0).obj()
    b_big = make_workload("b-big", "b").gpus(8).nodes(2).submitted(0.0).obj()
    b_small = make_workload("b-small", "b").gpus(8).submitted(1.0).obj()
    b_small = replace(b_small, reclaiming=reclaiming)
    decisions = schedule(make_nodes(2), quotas, [a_big, b_big, b_small])
    admitted = set(decisions.admitted)
    if reclaiming:
        assert "b-small" in admitted and not {"a-big", "b-big"} & admitted
    else:
        assert "b-small" not in admitted and len(admitted) == 1


def _borrowers(start: float, checkpoint: float | None, first_gpu: int = 0) -> list:
    """Four 1-GPU jobs of queue b on n0, from GPU `first_gpu` on."""
    return [
        make_workload(f"b{first_gpu + i}", "b")
        .gpus(1)
        .running_on({"n0": (first_gpu + i,)}, start=start, checkpoint=checkpoint)
        .obj()
        for i in range(4)
    ]


def test_reclaim_waits_until_the_borrowers_ran_their_least_run_time() -> None:
    """Queues a and b own 4 GPUs each of one 8-GPU node; b borrows all 8, every job started
    20 s ago. a's 4-GPU job may reclaim, but not before the borrowers ran 60 s: no preemption
    now, a reason that says when, a wake-up then; at that time the reclaim happens."""
    quotas = make_quotas({"a": {"H100": 4}, "b": {"H100": 4}})
    running = _borrowers(980, None) + _borrowers(980, None, first_gpu=4)
    mine = make_workload("mine", "a").gpus(4).submitted(990).obj()
    config = SchedulerConfig(preempt_by_service=False, reclaim_min_run_s=60)
    early = schedule(make_nodes(1), quotas, [mine], running, now=1000, config=config)
    assert early.preemptions == ()
    assert early.wake_at == 1040
    info = early.pending["mine"]
    assert info.details["reclaim_at"] == 1040
    assert "borrow become reclaimable in 40 s" in info.reason
    assert "runs at least 60 s" in info.reason
    later = schedule(make_nodes(1), quotas, [mine], running, now=1040, config=config)
    assert len(later.preemptions) == 4
    assert all(p.reason == "reclaim" for p in later.preemptions)
    assert later.wake_at is None


@pytest.mark.parametrize(
    ("min_run", "victims"),
    [(0.0, {"b4", "b5", "b6", "b7"}), (60.0, {"b0", "b1", "b2", "b3"})],
    ids=[
        "without a least run time the fresh borrowers go (least work lost)",
        "with one the borrowers that ran long enough go, though they lose more",
    ],
)
def test_reclaim_takes_borrowers_past_their_least_run_time(
    min_run: float, victims: set[str]
) -> None:
    """b borrows 4 GPUs twice over: b0-b3 started at 0 (checkpoint at 900: 100 s lost each),
    b4-b7 10 s ago (10 s lost each). The cheapest victims are the fresh ones, but with a
    least run time of 60 s the reclaim takes the older ones and a does not wait."""
    quotas = make_quotas({"a": {"H100": 4}, "b": {"H100": 4}})
    running = _borrowers(0, 900) + _borrowers(990, None, first_gpu=4)
    mine = make_workload("mine", "a").gpus(4).submitted(995).obj()
    config = SchedulerConfig(preempt_by_service=False, reclaim_min_run_s=min_run)
    decisions = schedule(make_nodes(1), quotas, [mine], running, now=1000, config=config)
    assert {p.workload_id for p in decisions.preemptions} == victims
    assert all(p.reason == "reclaim" for p in decisions.preemptions)
    assert decisions.pending["mine"].code == "preempting"
    assert "reclaimable" not in decisions.pending["mine"].reason


def test_the_least_run_time_before_reclaim_is_checked() -> None:
    with pytest.raises(ConfigError, match="reclaim_min_run_s must be >= 0"):
        SchedulerConfig(reclaim_min_run_s=-1)
