"""The event loop: batching of same-time events, grace periods and checkpoint-bounded loss."""

from __future__ import annotations

from tensoryard.sim.cluster import parse_cluster_shape
from tensoryard.sim.engine import SimConfig, SimContext, simulate
from tensoryard.sim.jobs import JobState
from tensoryard.sim.metrics import SimResult
from tensoryard.sim.policies import FifoPolicy
from tensoryard.sim.quotas import equal_quotas
from tensoryard.sim.trace import TraceJob


def _jobs(*rows: tuple[float, float, int]) -> list[TraceJob]:
    return [TraceJob(f"j{i}", t, d, g, "team") for i, (t, d, g) in enumerate(rows)]


def _run(jobs: list[TraceJob], cluster: str, policy: object, **config: float) -> SimResult:
    shape = parse_cluster_shape(cluster)
    quotas = equal_quotas({j.team for j in jobs}, shape.total_gpus, shape.gpu_model)
    return simulate(jobs, shape, policy, quotas, SimConfig(**config))  # type: ignore[arg-type]


class _Recorder(FifoPolicy):
    """FIFO that remembers when it ran and what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, int, int]] = []

    def cycle(self, ctx: SimContext) -> float | None:
        self.seen.append((ctx.now, len(ctx.pending()), ctx.cluster.free_gpus))
        return super().cycle(ctx)


def test_events_at_the_same_time_are_applied_together_before_one_cycle() -> None:
    policy = _Recorder()
    _run(_jobs((0, 10, 1), (0, 10, 1), (0, 10, 1)), "1x4", policy)
    assert policy.seen[0] == (0.0, 3, 4)
    assert [t for t, *_ in policy.seen] == [0.0]  # finishes at 10 leave nothing pending


def test_a_finish_frees_gpus_for_a_job_submitted_at_the_same_moment() -> None:
    policy = _Recorder()
    result = _run(_jobs((0, 10, 1), (10, 5, 1)), "1x1", policy)
    assert policy.seen[-1] == (10.0, 1, 1)
    assert result.jobs[1].first_start == 10.0 and result.jobs[1].wait_s == 0.0


class _PreemptOnce(FifoPolicy):
    """Starts jobs FIFO and preempts job 0 at the first cycle after ``at``."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.done = False

    def cycle(self, ctx: SimContext) -> float | None:
        if not self.done and ctx.now >= self.at:
            for job in ctx.running():
                if job.index == 0:
                    ctx.preempt(job)
                    self.done = True
        super().cycle(ctx)
        return None if self.done else self.at


def test_a_preempted_job_keeps_its_gpus_for_the_grace_then_loses_work_since_its_checkpoint() -> (
    None
):
    # job 0 (2 GPUs, 1000 s) is preempted at 250 s; grace 30 s; checkpoints every 100 s.
    result = _run(
        _jobs((0, 1000, 2)), "1x2", _PreemptOnce(250), checkpoint_interval_s=100, grace_s=30
    )
    job = result.jobs[0]
    # stopped at 280 s after 280 s of work, 200 s of it checkpointed: 80 s x 2 GPUs lost
    assert job.lost_gpu_s == 160.0
    assert job.preemptions == 1 and job.attempt == 2
    # requeued at 280, restarted at once with 800 s left
    assert job.finish_time == 280 + 800
    assert job.state is JobState.DONE
    metrics = result.metrics()
    assert metrics["preemptions"] == 1
    assert metrics["lost_gpu_hours"] == 160 / 3600


def test_a_job_that_finishes_during_its_grace_is_simply_done() -> None:
    result = _run(_jobs((0, 260, 1)), "1x1", _PreemptOnce(250), grace_s=30)
    job = result.jobs[0]
    assert job.finish_time == 260 and job.lost_gpu_s == 0.0 and job.attempt == 1
