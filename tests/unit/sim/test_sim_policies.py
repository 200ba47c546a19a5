"""Known behaviour of each policy on tiny traces (hand-computed outcomes)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tensoryard.errors import ConfigError
from tensoryard.scheduler import SchedulerConfig
from tensoryard.scheduler.estimates import JobFeatures
from tensoryard.sim.cluster import parse_cluster_shape
from tensoryard.sim.engine import SimConfig, SimContext, simulate
from tensoryard.sim.errors import OracleAccessError
from tensoryard.sim.jobs import SimJob
from tensoryard.sim.metrics import SimResult
from tensoryard.sim.policies import (
    POLICY_NAMES,
    FifoPolicy,
    KueueLikePolicy,
    LasConfig,
    SrtfOraclePolicy,
    TiresiasLasPolicy,
    make_policy,
)
from tensoryard.sim.policies.default import DefaultPolicy
from tensoryard.sim.quotas import equal_quotas
from tensoryard.sim.trace import TraceJob
from tensoryard.sim.view import JobView


def _run(jobs: list[TraceJob], cluster: str, policy: object, **config: float) -> SimResult:
    shape = parse_cluster_shape(cluster)
    quotas = equal_quotas({j.team for j in jobs}, shape.total_gpus, shape.gpu_model)
    return simulate(jobs, shape, policy, quotas, SimConfig(**config))  # type: ignore[arg-type]


def _starts(result: SimResult) -> dict[str, float | None]:
    return {j.trace.job_id: j.first_start for j in result.jobs}


# 4 GPUs: team b runs 2 GPUs 0-100; team a asks for 4 GPUs at 1, then 1 GPU at 2.
HEAD_TOO_BIG = [
    TraceJob("b1", 0, 100, 2, "b"),
    TraceJob("a-big", 1, 10, 4, "a"),
    TraceJob("a-small", 2, 10, 1, "a"),
]


def test_strict_fifo_lets_a_head_that_does_not_fit_block_everything_behind_it() -> None:
    starts = _starts(_run(HEAD_TOO_BIG, "1x4", FifoPolicy()))
    assert starts == {"b1": 0.0, "a-big": 100.0, "a-small": 110.0}


def test_kueue_like_best_effort_fifo_starts_the_small_job_behind_a_big_head() -> None:
    starts = _starts(_run(HEAD_TOO_BIG, "1x4", KueueLikePolicy()))
    assert starts == {"b1": 0.0, "a-big": 100.0, "a-small": 2.0}


def test_kueue_like_without_preemption_borrows_idle_quota_and_never_gives_it_back() -> None:
    """x borrows y's idle half; y's job then waits for x to finish (no reclaim)."""
    jobs = [TraceJob("x1", 0, 100, 4, "x"), TraceJob("y1", 5, 10, 1, "y")]
    result = _run(jobs, "1x4", KueueLikePolicy(preemption=False))
    assert _starts(result) == {"x1": 0.0, "y1": 100.0}
    assert result.metrics()["preemptions"] == 0


def test_kueue_like_reclaims_lent_quota_within_the_cohort() -> None:
    """reclaimWithinCohort: y's 1-GPU job fits y's nominal quota, which x borrows: x is
    preempted (30-s grace), y starts at 35 and x restarts when its 4 GPUs are free (45)."""
    jobs = [TraceJob("x1", 0, 100, 4, "x"), TraceJob("y1", 5, 10, 1, "y")]
    result = _run(jobs, "1x4", KueueLikePolicy(), grace_s=30)
    assert _starts(result) == {"x1": 0.0, "y1": 35.0}
    x1 = result.jobs[0]
    assert x1.preemptions == 1 and x1.attempt == 2 and x1.attempt_start == 45.0


def test_kueue_like_preempts_lower_priority_work_of_its_own_queue_only() -> None:
    """withinClusterQueue: LowerPriority: a priority-5 job preempts a priority-0 one of its
    queue; a job of equal priority would not (it waits)."""
    jobs = [
        TraceJob("low", 0, 1000, 4, "x", priority=0),
        TraceJob("high", 10, 10, 4, "x", priority=5),
        TraceJob("same", 20, 10, 4, "x", priority=0),
    ]
    result = _run(jobs, "1x4", KueueLikePolicy(), grace_s=30)
    low, high, same = result.jobs
    assert high.first_start == 40.0 and low.preemptions == 1 and same.preemptions == 0
    assert same.first_start is not None and same.first_start >= 50.0


def test_tiresias_las_preempts_only_for_a_job_the_freed_gpus_can_place() -> None:
    """2 nodes x 4 GPUs. L (2 GPUs, node 0) passes 1 GPU-hour at 1800 s; X and Y (2 GPUs,
    from 1500 s) fill node 0 and half of node 1. N (4 GPUs on one node) arrives at 2000 s
    and goes before L in LAS order, but freeing L leaves 2 + 2 GPUs on two nodes, so L is
    not preempted (the old baseline preempted it for nothing). From 2500 s the four jobs fit
    by GPU count, so L keeps running and N starts when Y ends (6501 s)."""
    jobs = [
        TraceJob("L", 0, 100_000, 2, "t"),
        TraceJob("X", 1500, 1000, 2, "t"),
        TraceJob("Y", 1501, 5000, 2, "t"),
        TraceJob("N", 2000, 100, 4, "t"),
    ]
    result = _run(jobs, "2x4", TiresiasLasPolicy(), grace_s=30, checkpoint_interval_s=600)
    big_l, _, _, n = result.jobs
    assert big_l.preemptions == 0
    assert n.first_start == 6501


def test_srtf_oracle_preempts_a_long_runner_for_a_shorter_newcomer() -> None:
    """1 GPU. A (1000 s) from 0; B (100 s) at 100 has less left: A is preempted (30-s
    grace), B runs 130-230, A resumes with all 1000 s left (no checkpoint yet)."""
    jobs = [TraceJob("A", 0, 1000, 1, "x"), TraceJob("B", 100, 100, 1, "x")]
    result = _run(jobs, "1x1", SrtfOraclePolicy(), grace_s=30, checkpoint_interval_s=600)
    a, b = result.jobs
    assert (b.first_start, b.finish_time) == (130, 230)
    assert a.preemptions == 1 and a.finish_time == 1230


def test_tiresias_las_preempts_a_long_runner_for_a_newcomer_with_less_service() -> None:
    """1 GPU. A (10000 s) crosses the 3600 GPU-s threshold at 3600. B (100 s) arrives at 4000,
    preempts A (grace 30 s: B starts at 4030, ends 4130). A ran 4030 s; 3600 s were
    checkpointed (every 600 s), 430 s are lost; A resumes at 4130 with 6400 s left."""
    jobs = [TraceJob("A", 0, 10_000, 1, "x"), TraceJob("B", 4000, 100, 1, "x")]
    result = _run(jobs, "1x1", TiresiasLasPolicy(), checkpoint_interval_s=600, grace_s=30)
    a, b = result.jobs
    assert b.first_start == 4030 and b.finish_time == 4130
    assert a.preemptions == 1 and a.lost_gpu_s == 430
    assert a.finish_time == 4130 + 6400


def test_tiresias_las_does_not_preempt_a_job_still_in_the_first_queue() -> None:
    jobs = [TraceJob("A", 0, 1000, 1, "x"), TraceJob("B", 10, 100, 1, "x")]
    result = _run(jobs, "1x1", TiresiasLasPolicy())
    assert _starts(result) == {"A": 0.0, "B": 1000.0}


@pytest.mark.parametrize(
    ("knob", "finishes_by", "finishes_after"),
    [(1.0, 600.0, 0.0), (0.0, 1e9, 1000.0)],
    ids=["with the starvation guard the long job gets turns", "without it the job starves"],
)
def test_tiresias_las_starvation_guard_promotes_a_waiting_job(
    knob: float, finishes_by: float, finishes_after: float
) -> None:
    """1 GPU, threshold 100 GPU-s. A (300 s) is in the second queue from 100 s on; 50-s jobs
    arrive every 50 s until 1000 s and keep the first queue busy. With knob 1, A is promoted
    after waiting as long as it last ran (100 s): it runs 200-300 and 400-500."""
    config = LasConfig(thresholds_gpu_s=(100.0,), promote_knob=knob)
    jobs = [TraceJob("A", 0, 300, 1, "x")]
    jobs += [TraceJob(f"s{i}", 100 + 50 * i, 50, 1, "x") for i in range(18)]
    result = _run(jobs, "1x1", TiresiasLasPolicy(config), grace_s=0, checkpoint_interval_s=50)
    a = result.jobs[0]
    assert a.finish_time is not None
    assert finishes_after <= a.finish_time <= finishes_by


@pytest.mark.parametrize(
    ("min_run", "y_start", "below"),
    [(0.0, 35, 30), (60.0, 90, 85)],
    ids=["reclaim at once", "reclaim once the borrower ran 60 s (the simulator wakes then)"],
)
def test_the_default_policy_reclaims_a_lenders_quota_through_the_core(
    min_run: float, y_start: float, below: float
) -> None:
    """x borrows y's half (4 GPUs, 0-100). y's 1-GPU job arrives at 5: the core preempts x
    (reclaim, 30 s grace) at once, or at 60 when x must run 60 s first; y starts 30 s later.
    x restarts then, having lost all its work (it never checkpointed)."""
    jobs = [TraceJob("x1", 0, 100, 4, "x"), TraceJob("y1", 5, 10, 1, "y")]
    policy = DefaultPolicy(SchedulerConfig(preemption_grace_s=30, reclaim_min_run_s=min_run))
    result = _run(jobs, "1x4", policy, grace_s=30, checkpoint_interval_s=600)
    x, y = result.jobs
    assert y.first_start == y_start
    assert x.preemptions == 1 and x.lost_gpu_s == 4 * y_start
    m = result.metrics()
    assert m["teams"]["y"]["max_below_entitlement_s"] == below
    assert m["preemptions"] == 1


class _PeekingFifo:
    """A policy that cheats: it orders by the true duration without being an oracle."""

    name = "peeking"

    def cycle(self, ctx: SimContext) -> float | None:
        for job in sorted(ctx.pending(), key=lambda j: j.trace.duration_s):
            placement = ctx.cluster.find(job.nodes, job.gpus_per_node)
            if placement is not None:
                ctx.admit(job, placement)
        return None


class _AskingFifo(_PeekingFifo):
    """Another cheat: it asks the context for true durations without declaring itself."""

    name = "asking"

    def cycle(self, ctx: SimContext) -> float | None:
        ctx.true_remaining_s(ctx.pending()[0])
        return None


@pytest.mark.parametrize(
    "policy", [_PeekingFifo(), _AskingFifo()], ids=["reading a view's duration", "asking ctx"]
)
def test_a_policy_that_reads_true_durations_fails_the_replay(policy: object) -> None:
    jobs = [TraceJob(f"j{i}", 10 * i, 50 + i, 1, "x") for i in range(4)]
    with pytest.raises(OracleAccessError, match="true duration"):
        _run(jobs, "1x1", policy)


def test_a_job_view_hides_the_duration_the_remaining_time_and_the_expected_end() -> None:
    job = SimJob(TraceJob("a", 0, 500, 2, "x"), 0, 1, 2, 500.0)
    view = JobView(job)
    reads: list[Callable[[], object]] = [
        lambda: view.trace.duration_s,
        lambda: view.remaining_s,
        lambda: view.expected_end(),
    ]
    for read in reads:
        with pytest.raises(OracleAccessError):
            read()
    assert (view.gpus, view.team, view.trace.job_id, view.submit_time_s) == (2, "x", "a", 0)


def test_the_default_policy_learns_run_times_only_from_completed_jobs() -> None:
    """Completions are observed at the next cycle after they finished (the last one ends
    the replay, so 3 of 4); the estimate for the team's 1-GPU jobs is the median of the
    observed run times (50, 51, 52 s), and nothing is known of another team."""
    jobs = [TraceJob(f"j{i}", 10 * i, 50 + i, 1, "x") for i in range(4)]
    policy = DefaultPolicy()
    _run(jobs, "1x1", policy)
    assert policy.estimator is not None
    assert policy.accuracy()["observed"] == 3
    assert policy.estimator.estimate(JobFeatures("x", 1)) == pytest.approx(51.0)
    assert policy.estimator.estimate(JobFeatures("y", 1)) is None


@pytest.mark.parametrize("name", POLICY_NAMES, ids=lambda n: f"policy {n} runs every job")
def test_every_policy_finishes_every_job_without_double_allocation(name: str) -> None:
    jobs = [
        TraceJob(f"j{i}", 7.0 * i, 50.0 + (i * 37) % 400, [1, 1, 2, 4, 8, 16][i % 6], f"t{i % 3}")
        for i in range(60)
    ]
    result = _run(jobs, "4x8", make_policy(name))
    m = result.metrics()
    assert all(j.finish_time is not None for j in result.jobs)
    assert m["jobs"] == 60 and 0 < m["allocation"] <= 1.0 + 1e-9
    assert m["makespan_s"] >= max(j.duration_s for j in jobs)


def test_an_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="fifo"):
        make_policy("round-robin")


def test_the_default_policy_does_not_thrash_when_a_victim_finishes_during_its_grace() -> None:
    """1 node of 8, teams a and b own 4 each. b runs 8 jobs (borrowing 4) and queues 4 more.
    a's 4-GPU job at 600 s reclaims 4 GPUs; one victim finishes at 610 during its grace. a's
    job should start once the grace ends (630 s), after one round of preemptions."""
    jobs = [TraceJob("b0", 0, 610, 1, "b")]
    jobs += [TraceJob(f"b{i}", 0, 10_000, 1, "b") for i in range(1, 8)]
    jobs += [TraceJob(f"bq{i}", 1, 10_000, 1, "b") for i in range(4)]
    jobs += [TraceJob("a", 600, 100, 4, "a")]
    policy = DefaultPolicy(SchedulerConfig(preemption_grace_s=30))
    result = _run(jobs, "1x8", policy, grace_s=30, checkpoint_interval_s=600)
    a = result.jobs[-1]
    assert a.first_start is not None and a.first_start <= 700
    assert result.metrics()["preemptions"] <= 8


def test_the_default_policy_is_woken_when_a_long_runner_becomes_preemptible() -> None:
    """1 GPU. A (20000 s) runs from 0; B (100 s) waits from 10. Nothing else happens, but at
    3600 s A crosses the first service level (1 GPU-hour), so the core may preempt it for
    B: the adapter must ask for a cycle then. B starts after the 30-s grace."""
    jobs = [TraceJob("A", 0, 20_000, 1, "x"), TraceJob("B", 10, 100, 1, "x")]
    policy = DefaultPolicy(SchedulerConfig(preemption_grace_s=30))
    result = _run(jobs, "1x1", policy, grace_s=30, checkpoint_interval_s=600)
    a, b = result.jobs
    assert b.first_start == pytest.approx(3630, abs=1e-3)
    assert a.preemptions == 1
