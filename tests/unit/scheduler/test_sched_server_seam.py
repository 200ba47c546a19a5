"""The control plane's seam (`CorePolicy`) uses the shared estimator for production ETAs."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

from tensoryard.server.scheduling import (
    ESTIMATES_REFRESH_S,
    ClusterView,
    CorePolicy,
    NodeCapacity,
)
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import JobRecord, TeamRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _job(
    job_id: int, state: JobState, *, placement: dict[str, list[int]] | None = None
) -> JobRecord:
    spec = JobSpec(
        name=f"sft-llama-{job_id}",
        team="nlp",
        user="ada",
        command=["train.py"],
        resources={"gpus_per_node": 8},  # type: ignore[arg-type]
    )
    return JobRecord(
        id=job_id,
        name=spec.name,
        team="nlp",
        user="ada",
        priority=0,
        state=state,
        spec=spec.model_dump(mode="json"),
        created_at=T0,
        updated_at=T0,
        admitted_at=T0 if placement else None,
        started_at=T0 if placement else None,
        finished_at=None,
        attempts=1 if placement else 0,
        restarts=0,
        reason="",
        pending_reason="",
        pending_eta=None,
        cancel_requested=False,
        run_dir="",
        placement=placement or {},
        last_heartbeat=None,
    )


def _view(now: float) -> ClusterView:
    return ClusterView(
        nodes=(NodeCapacity("n0", 32.0, 0, tuple(range(8)), "H100"),),
        teams=(TeamRecord("nlp", T0, None, None, ""),),
        pending=(_job(2, JobState.PENDING),),
        running=(_job(1, JobState.RUNNING, placement={"n0": list(range(8))}),),
        now=now,
    )


def test_a_pending_jobs_eta_comes_from_history_once_similar_jobs_finished() -> None:
    """Job 1 holds the only node since T0. Without history nobody knows when it ends; once a
    job of the same user and name group ran 3600 s, job 2's ETA is T0 + 3600 s, and it
    survives a restart of the control plane through export_state / import_state."""
    now = T0.timestamp() + 60
    policy = CorePolicy()
    assert policy.decide(_view(now)).pending[2].eta_s is None
    policy.observe_completion(
        team="nlp", user="ada", job_name="sft-llama-0", gpus=8, run_s=3600.0, max_runtime_s=None
    )
    assert policy.decide(_view(now)).pending[2].eta_s == T0.timestamp() + 3600
    restarted = CorePolicy()
    restarted.import_state(json.loads(json.dumps(policy.export_state())))
    assert restarted.decide(_view(now)).pending[2].eta_s == T0.timestamp() + 3600
    assert restarted.export_state()["usage_history"]["nlp"]["gpu_seconds"]["H100"] > 0


def test_a_victim_in_its_grace_period_is_tied_to_the_job_it_was_preempted_for() -> None:
    """Job 2 (priority 5) preempts job 1 (priority 0) on the only node. While job 1 is
    terminating, the seam tells the core whom it stops for, so that another pending job
    does not count on its GPUs and preempt again."""
    now = T0.timestamp() + 60
    running = replace(_job(1, JobState.RUNNING, placement={"n0": list(range(8))}), priority=0)
    urgent = _job(2, JobState.PENDING)
    urgent = replace(urgent, spec={**urgent.spec, "priority": 5})
    view = replace(_view(now), pending=(urgent,), running=(running,))
    policy = CorePolicy()
    decisions = policy.decide(view)
    assert [(p.job_id, p.for_job_id) for p in decisions.preemptions] == [(1, 2)]
    stopping = replace(view, terminating=frozenset({1}), now=now + 10)
    assert policy._running(running, stopping).preempted_for == "2"
    assert policy.decide(stopping).preemptions == []


def test_a_job_preemptions_were_made_for_goes_first_until_it_is_admitted() -> None:
    """Job 2 (priority 5) preempts job 1. Once job 1 is gone, the seam marks job 2 as the one
    the room was made for (`reclaiming`), so the core serves it before any other waiting job
    of its priority; once admitted the mark is dropped, and it never outlives the memory."""
    now = T0.timestamp() + 60
    running = replace(_job(1, JobState.RUNNING, placement={"n0": list(range(8))}), priority=0)
    urgent = _job(2, JobState.PENDING)
    urgent = replace(urgent, spec={**urgent.spec, "priority": 5})
    view = replace(_view(now), pending=(urgent,), running=(running,))
    policy = CorePolicy()
    assert [p.job_id for p in policy.decide(view).preemptions] == [1]
    gone = replace(view, running=(), now=now + 20)
    assert policy._pending(urgent, gone).reclaiming
    assert [a.job_id for a in policy.decide(gone).admissions] == [2]
    assert not policy._pending(urgent, gone).reclaiming
    # a preemptor that never fits forgets its claim after RECLAIM_MEMORY_S
    policy.decide(view)
    later = replace(view, running=(), now=now + 901, nodes=())
    policy.decide(later)
    assert not policy._pending(urgent, later).reclaiming


def test_reclaim_waits_for_a_borrowers_least_run_time_and_says_when() -> None:
    """nlp and cv own 4 GPUs each of the 8-GPU node; nlp's job 1 borrows cv's half since T0.
    cv's 4-GPU job 2 may reclaim it only once job 1 ran 60 s: at T0 + 20 the seam reports no
    preemption, a reason that says when, and a wake-up time for the control loop; at T0 + 60
    job 1 is preempted for job 2."""
    teams = (TeamRecord("nlp", T0, 4, None, ""), TeamRecord("cv", T0, 4, None, ""))
    borrower = _job(1, JobState.RUNNING, placement={"n0": list(range(8))})
    lender = _job(2, JobState.PENDING)
    lender = replace(
        lender, team="cv", spec={**lender.spec, "team": "cv", "resources": {"gpus_per_node": 4}}
    )
    view = replace(_view(T0.timestamp() + 20), teams=teams, pending=(lender,), running=(borrower,))
    policy = CorePolicy()
    early = policy.decide(view)
    assert early.preemptions == []
    assert early.wake_at == T0.timestamp() + 60
    assert "become reclaimable in 40 s" in early.pending[2].reason
    later = policy.decide(replace(view, now=T0.timestamp() + 60))
    assert [(p.job_id, p.for_job_id) for p in later.preemptions] == [(1, 2)]


def test_pending_workloads_are_converted_once_until_something_they_depend_on_changes() -> None:
    """A deep backlog is not re-converted on every pass: the same Workload comes back until
    the row, the attained service or the estimator changes."""
    policy = CorePolicy()
    view = _view(1000.0)
    first = policy._pending_workloads(view)
    assert policy._pending_workloads(view)[0] is first[0]
    # the row changed (a requeue moves updated_at): rebuilt
    moved = replace(view.pending[0], updated_at=datetime(2026, 1, 2, tzinfo=UTC))
    second = policy._pending_workloads(replace(view, pending=(moved,)))
    assert second[0] is not first[0] and second[0] == first[0]
    # the estimator learned a run time for jobs like it: rebuilt with the new estimate
    for _ in range(5):
        policy.observe_completion(
            team="nlp", user="ada", job_name="sft-llama-9", gpus=8, run_s=3600.0
        )
    # ... not at once (a pass that fills a freed slot must not rebuild a deep backlog for
    # it), but within ESTIMATES_REFRESH_S
    same = policy._pending_workloads(replace(view, pending=(moved,)))
    assert same[0] is second[0]
    later = replace(view, pending=(moved,), now=view.now + ESTIMATES_REFRESH_S)
    third = policy._pending_workloads(later)
    assert third[0] is not second[0]
    assert third[0].runtime_estimate_s == 3600.0
    # attained service from an earlier attempt: rebuilt with it
    fourth = policy._pending_workloads(replace(later, attained_s={2: 60.0}))
    assert fourth[0].attained_service_s == 60.0
    # jobs that left the backlog are forgotten
    policy._pending_workloads(replace(view, pending=()))
    assert policy._workloads == {}
