"""Head-of-line reservation, backfill, and start-time estimates."""

from __future__ import annotations

from sched_builders import make_nodes, make_quotas, make_workload, schedule

from tensoryard.scheduler import SchedulerConfig

QUIET = SchedulerConfig(reclaim=False, preempt_lower_priority=False, preempt_by_service=False)
QUOTAS = make_quotas({"team-a": {"H100": 64}})


def half_busy(estimate: float | None) -> list:
    """n0 and n1 each run a 4-GPU job; n1's ends at t=2000 when `estimate` is 1000."""
    builders = [
        make_workload("r0").gpus(4).running_on({"n0": range(4)}, start=1000),
        make_workload("r1").gpus(4).running_on({"n1": range(4)}, start=1000),
    ]
    if estimate is not None:
        builders[0] = builders[0].estimate(estimate + 500)
        builders[1] = builders[1].estimate(estimate)
    return [b.obj() for b in builders]


def test_a_blocked_head_gets_nodes_reserved_and_an_estimated_start() -> None:
    head = make_workload("head").gpus(8).submitted(0).obj()
    decisions = schedule(make_nodes(2), QUOTAS, [head], half_busy(1000.0), config=QUIET)
    info = decisions.pending["head"]
    assert info.code == "reserved"
    assert info.eta_s == 2000.0
    assert decisions.reservations["head"] == ("n1",)
    assert "next in line" in info.reason


def test_small_jobs_without_an_estimate_may_not_use_reserved_nodes() -> None:
    head = make_workload("head").gpus(8).submitted(0).obj()
    small = make_workload("small").gpus(2).submitted(1).obj()
    decisions = schedule(make_nodes(2), QUOTAS, [head, small], half_busy(1000.0), config=QUIET)
    placement = decisions.admitted["small"]
    assert set(placement.gpus) == {"n0"}  # the unreserved node, not the held n1


def test_backfill_that_ends_before_the_reserved_start_may_use_held_nodes() -> None:
    nodes = make_nodes(2)
    running = [
        *half_busy(1000.0),
    ]
    filler = make_workload("filler").gpus(4).submitted(5).obj()
    block_n0 = make_workload("block").gpus(4).submitted(1).obj()
    head = make_workload("head").gpus(8).submitted(0).obj()
    short = make_workload("short").gpus(4).estimate(500).submitted(6).obj()
    long = make_workload("long").gpus(4).estimate(5000).submitted(7).obj()
    decisions = schedule(
        nodes, QUOTAS, [head, block_n0, filler, short, long], running, config=QUIET
    )
    admitted = decisions.admitted
    assert set(admitted["block"].gpus) == {"n0"}
    assert set(admitted["short"].gpus) == {"n1"}  # ends at 1500, before the head's 2000
    assert "long" not in admitted and "filler" not in admitted


def test_the_estimate_is_unknown_when_running_jobs_have_none() -> None:
    head = make_workload("head").gpus(8).submitted(0).obj()
    decisions = schedule(make_nodes(2), QUOTAS, [head], half_busy(None), config=QUIET)
    info = decisions.pending["head"]
    assert info.code == "reserved"
    assert info.eta_s is None
    assert "unknown" in info.reason


def test_only_the_configured_number_of_heads_get_reservations() -> None:
    heads = [make_workload(f"h{i}").gpus(8).submitted(i).obj() for i in range(3)]
    decisions = schedule(make_nodes(2), QUOTAS, heads, half_busy(1000.0), config=QUIET)
    assert list(decisions.reservations) == ["h0"]
    assert decisions.pending["h1"].code == "capacity"
    two = SchedulerConfig(
        reclaim=False, preempt_lower_priority=False, preempt_by_service=False, max_reservations=2
    )
    decisions = schedule(make_nodes(2), QUOTAS, heads, half_busy(1000.0), config=two)
    assert list(decisions.reservations) == ["h0", "h1"]


def test_waiting_jobs_get_a_fluid_estimate_from_known_ends() -> None:
    running = [
        make_workload(f"r{i}")
        .gpus(8)
        .estimate(100.0 * (i + 1))
        .running_on({f"n{i}": range(8)}, start=1000)
        .obj()
        for i in range(2)
    ]
    waiting = [make_workload(f"w{i}").gpus(8).submitted(i).obj() for i in range(3)]
    decisions = schedule(make_nodes(2), QUOTAS, waiting, running, config=QUIET)
    assert decisions.pending["w0"].eta_s == 1100.0  # reserved head: n0 frees first
    assert decisions.pending["w1"].eta_s == 1200.0
    assert decisions.pending["w2"].eta_s is None  # needs a third release nobody can promise


def test_a_quota_blocked_job_is_estimated_from_its_own_queue_ends() -> None:
    quotas = make_quotas({"team-a": {"H100": 8}}, cohort=None)
    running = [
        make_workload("r").gpus(8).estimate(600).running_on({"n0": range(8)}, start=1000).obj()
    ]
    waiting = make_workload("w").gpus(8).obj()
    decisions = schedule(make_nodes(2), quotas, [waiting], running, config=QUIET)
    info = decisions.pending["w"]
    assert info.code == "quota"
    assert info.eta_s == 1600.0
