"""Metrics on tiny traces whose answers were worked out by hand (see each docstring)."""

from __future__ import annotations

import pytest

from tensoryard.sim.cluster import parse_cluster_shape
from tensoryard.sim.engine import simulate
from tensoryard.sim.metrics import SimResult
from tensoryard.sim.policies import FifoPolicy, SjfOraclePolicy
from tensoryard.sim.quotas import equal_quotas
from tensoryard.sim.trace import TraceJob


def _run(jobs: list[TraceJob], cluster: str, policy: object) -> SimResult:
    shape = parse_cluster_shape(cluster)
    quotas = equal_quotas({j.team for j in jobs}, shape.total_gpus, shape.gpu_model)
    return simulate(jobs, shape, policy, quotas)  # type: ignore[arg-type]


# 4 GPUs. A: 2 GPUs x 100 s at 0. B: 4 GPUs x 10 s at 1. C: 1 GPU x 10 s at 2.
BLOCKED = [
    TraceJob("A", 0, 100, 2, "x"),
    TraceJob("B", 1, 10, 4, "x"),
    TraceJob("C", 2, 10, 1, "x"),
]


def test_fifo_metrics_on_a_blocked_head_match_the_hand_computation() -> None:
    """FIFO: A 0-100, B 100-110, C (blocked by B) 110-120.

    JCT 100, 109, 118; waits 0, 99, 108. Allocated GPU-s 200+40+10 = 250. Available
    (min(4, demand)): 0-1: 2, 1-2: 4, 2-100: 4x98, 100-110: 4x10, 110-120: 1x10 = 448.
    Pending job-seconds 99 + 108 = 207, of which C waited 98 s (2-100) with 2 GPUs free.
    """
    m = _run(BLOCKED, "1x4", FifoPolicy()).metrics()
    assert m["avg_jct_s"] == pytest.approx((100 + 109 + 118) / 3)
    assert m["median_jct_s"] == 109
    assert m["avg_wait_s"] == pytest.approx((0 + 99 + 108) / 3)
    assert m["makespan_s"] == 120
    assert m["allocation"] == pytest.approx(250 / 448)
    assert m["utilization"] == pytest.approx(250 / (4 * 120))
    assert m["fragmentation"] == pytest.approx(98 / 207)
    assert m["allocated_gpu_hours"] == pytest.approx(250 / 3600)


def test_sjf_skips_a_head_that_does_not_fit_and_runs_the_small_job() -> None:
    """SJF: C (10 s, index 2) ties B (10 s) but B does not fit, so C runs 2-12; B 100-110."""
    result = _run(BLOCKED, "1x4", SjfOraclePolicy())
    starts = {j.trace.job_id: j.first_start for j in result.jobs}
    assert starts == {"A": 0.0, "B": 100.0, "C": 2.0}
    assert result.metrics()["avg_jct_s"] == pytest.approx((100 + 109 + 10) / 3)


def test_p99_is_the_interpolated_99th_percentile_of_jcts() -> None:
    jobs = [TraceJob(f"j{i}", 0, float(i + 1), 1, "x") for i in range(101)]
    m = _run(jobs, "128x1", FifoPolicy()).metrics()
    assert m["p99_jct_s"] == pytest.approx(100.0)  # JCTs 1..101: the 99th percentile is 100


def test_a_team_held_below_its_entitlement_is_measured_from_its_submit() -> None:
    """Teams x and y own 2 of 4 GPUs each. x's 4-GPU job runs 0-100; y's 1-GPU job arrives at
    5 and FIFO makes it wait until 100: y is below its entitlement for 95 s, x never."""
    jobs = [TraceJob("x1", 0, 100, 4, "x"), TraceJob("y1", 5, 10, 1, "y")]
    m = _run(jobs, "1x4", FifoPolicy()).metrics()
    assert m["teams"]["y"]["max_below_entitlement_s"] == 95
    assert m["teams"]["x"]["max_below_entitlement_s"] == 0
    assert m["max_below_entitlement_s"] == 95
    assert m["teams"]["x"]["nominal_gpus"] == 2
    assert m["teams"]["x"]["avg_gpus_while_demand"] == 4.0  # x has demand only 0-100
    assert m["teams"]["y"]["avg_gpus_while_demand"] == pytest.approx(10 / 105)  # 5-110


def test_a_job_larger_than_its_teams_quota_never_counts_as_held_below_entitlement() -> None:
    jobs = [TraceJob("x1", 0, 100, 4, "x"), TraceJob("y1", 5, 10, 3, "y")]
    m = _run(jobs, "1x4", FifoPolicy()).metrics()
    assert m["max_below_entitlement_s"] == 0
