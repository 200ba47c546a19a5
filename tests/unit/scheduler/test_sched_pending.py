"""The pending mapping: one entry per waiting workload, built on access, honest estimates."""

from __future__ import annotations

import pytest
from sched_builders import make_nodes, make_quotas, make_workload, schedule

from tensoryard.scheduler import SchedulerConfig

QUIET = SchedulerConfig(reclaim=False, preempt_lower_priority=False, preempt_by_service=False)


def test_every_waiting_workload_has_exactly_one_entry_and_admitted_ones_none() -> None:
    quotas = make_quotas({"a": {"H100": 8}, "b": {"H100": 8}})
    jobs = [make_workload(f"{q}{i}", q).gpus(4).submitted(i).obj() for q in "ab" for i in range(5)]
    jobs.append(make_workload("lost", "nobody").gpus(1).obj())
    decisions = schedule(make_nodes(2), quotas, jobs, config=QUIET)
    admitted = set(decisions.admitted)
    assert len(admitted) == 4
    assert len(decisions.pending) == len(jobs) - 4
    assert set(decisions.pending) == {w.id for w in jobs} - admitted
    assert "lost" in decisions.pending and "a0" not in decisions.pending
    with pytest.raises(KeyError):
        decisions.pending["a0"]


def test_positions_count_only_workloads_still_waiting_ahead_in_the_queue() -> None:
    quotas = make_quotas({"a": {"H100": 8}}, cohort=None)
    jobs = [make_workload(f"j{i}", "a").gpus(4).submitted(i).obj() for i in range(5)]
    decisions = schedule(make_nodes(2), quotas, jobs, config=QUIET)
    assert [decisions.pending[f"j{i}"].position for i in (2, 3, 4)] == [0, 1, 2]
    assert decisions.pending["j3"].reason.endswith("1 job ahead in queue a")


def test_workloads_left_unvisited_when_the_cluster_is_full_still_get_a_reason() -> None:
    quotas = make_quotas({"a": {"H100": 64}}, cohort=None)
    running = [
        make_workload(f"r{i}", "a").gpus(8).running_on({f"n{i}": range(8)}, start=0).obj()
        for i in range(2)
    ]
    jobs = [make_workload(f"j{i}", "a").gpus(1).submitted(i).obj() for i in range(200)]
    no_reserve = SchedulerConfig(
        reclaim=False, preempt_lower_priority=False, preempt_by_service=False, max_reservations=0
    )
    decisions = schedule(make_nodes(2), quotas, jobs, running, config=no_reserve)
    assert len(decisions.pending) == 200
    last = decisions.pending["j199"]
    assert last.code == "capacity"
    assert last.position == 199
    assert "0 H100 GPUs are free" in last.reason
    assert last.eta_s is None


def test_deep_places_in_line_are_stated_coarsely_so_one_admission_rewrites_few_reasons() -> None:
    from tensoryard.scheduler.pending import _ahead

    assert _ahead(0, "a") == "first in queue a"
    assert _ahead(1, "a") == "1 job ahead in queue a"
    assert _ahead(99, "a") == "99 jobs ahead in queue a"
    assert _ahead(345, "a") == "at least 340 jobs ahead in queue a"
    assert _ahead(12_345, "a") == "at least 12,000 jobs ahead in queue a"
    # one job admitted ahead of 20,000 waiting ones: the texts of ~300 of them change
    changed = sum(_ahead(p, "a") != _ahead(p - 1, "a") for p in range(1, 20_001))
    assert changed < 400
