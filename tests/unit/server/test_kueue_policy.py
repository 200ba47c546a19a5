"""Admission handed to Kueue (`tyard server --admission kueue`): the policy admits every
pending job unplaced, a Kueue eviction requeues the job without spending a restart, and the
starting timeout does not count the time an attempt waits in Kueue's queue.

The controller cases use the real SQLite store, the test clock and the scripted executor of
test_controller.py, with `external_admission` set as the Kubernetes executor sets it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from test_controller import Clock, ScriptedExecutor, World, store_home

from tensoryard.executors.base import AttemptPhase, AttemptStatus
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import Controller
from tensoryard.server.scheduling import ClusterView, KueuePolicy, NodeCapacity
from tensoryard.server.summary import summarize
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import JobRecord, Store, TeamRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def job_record(job_id: int, team: str, state: JobState, *, priority: int = 0) -> JobRecord:
    spec = JobSpec(
        name=f"job-{job_id}",
        team=team,
        command=["train.py"],
        priority=priority,
        resources={"nodes": 4, "gpus_per_node": 8},  # type: ignore[arg-type]
    )
    running = state is not JobState.PENDING
    return JobRecord(
        id=job_id,
        name=spec.name,
        team=team,
        user="ada",
        priority=priority,
        state=state,
        spec=spec.model_dump(mode="json"),
        created_at=T0,
        updated_at=T0,
        admitted_at=T0 if running else None,
        started_at=T0 if running else None,
        finished_at=None,
        attempts=1 if running else 0,
        restarts=0,
        reason="",
        pending_reason="",
        pending_eta=None,
        cancel_requested=False,
        run_dir="",
        placement={"n0": list(range(8))} if running else {},
        last_heartbeat=None,
    )


def test_every_pending_job_is_handed_to_its_teams_localqueue_unplaced() -> None:
    """No capacity at all, a 32-GPU job each, a running job of lower priority: tensoryard
    neither waits for room nor places nor preempts; Kueue decides all of that."""
    view = ClusterView(
        nodes=(NodeCapacity("n0", 32.0, 0, tuple(range(8)), "H100", unavailable_gpus=(0, 1)),),
        teams=(TeamRecord("nlp", T0, 8, None, ""), TeamRecord("vision", T0, 0, None, "")),
        pending=(
            job_record(2, "nlp", JobState.PENDING, priority=10),
            job_record(3, "vision", JobState.PENDING),
            job_record(4, "nlp", JobState.PENDING),
        ),
        running=(job_record(1, "vision", JobState.RUNNING),),
        now=T0.timestamp() + 60,
        terminating=frozenset({1, 4}),
    )
    decisions = KueuePolicy().decide(view)
    assert [(a.job_id, a.placement, a.reason) for a in decisions.admissions] == [
        (2, {}, "handed to Kueue (LocalQueue nlp)"),
        (3, {}, "handed to Kueue (LocalQueue vision)"),
    ]  # job 4 is being stopped: not handed over again
    assert decisions.preemptions == []
    assert decisions.pending == {}


def test_the_policy_uses_the_specs_the_controller_parsed() -> None:
    job = job_record(7, "nlp", JobState.PENDING)
    parsed = JobSpec.model_validate({**job.spec, "team": "speech"})
    view = ClusterView(nodes=(), teams=(), pending=(job,), running=(), now=0.0, specs={7: parsed})
    (only,) = KueuePolicy().decide(view).admissions
    assert only.reason == "handed to Kueue (LocalQueue speech)"


# ---- the controller with an executor whose attempts Kueue admits -----------------------------


@dataclass
class KueueExecutor(ScriptedExecutor):  # type: ignore[misc]  # (mypy: Any)
    """The scripted executor, admitting through an external queue as with --admission kueue."""

    external_admission: bool = True


QUEUED = AttemptStatus(
    AttemptPhase.STARTING,
    reason="waiting for Kueue admission in LocalQueue default: insufficient unused quota",
    queued=True,
)
ADMITTED = AttemptStatus(
    AttemptPhase.STARTING, reason="admitted by Kueue: ClusterQueue default; starting its pods"
)
EVICTED = AttemptStatus(
    AttemptPhase.CANCELLED,
    reason="preempted by Kueue (InCohortReclamation): Preempted to accommodate a workload "
    "(UID: 1c7e) due to reclamation within the cohort",
)


def kueue_controller(
    store: Store, executor: ScriptedExecutor, clock: Clock, *, starting_timeout_s: float = 60
) -> Controller:
    config = ServerConfig(
        home=store_home(store),
        launch_workers=0,
        cancel_grace_s=5,
        starting_timeout_s=starting_timeout_s,
        poll_failure_grace_s=30,
        heartbeat_timeout_s=120,
    )
    return Controller(
        store=store,
        executor=executor,  # type: ignore[arg-type]
        policy=KueuePolicy(),
        capacity=lambda: (NodeCapacity("n1", cpu_slots=4, memory_bytes=64 * 2**30),),
        config=config,
        clock=clock,
        job_key="k",
        holder="replica-a",
    )


def kueue_world(url: str, tmp_path: Path, *, external: bool = True, timeout: float = 60) -> World:
    clock = Clock()
    store = Store.open(url, clock=clock.dt)
    store.ensure_team("default")
    executor = KueueExecutor(store, external_admission=external, default=QUEUED)
    controller = kueue_controller(store, executor, clock, starting_timeout_s=timeout)
    assert controller.lead()
    return World(store, executor, clock, controller, tmp_path)


@pytest.fixture
def world(migrated_sqlite_url: str, tmp_path: Path) -> World:
    return kueue_world(migrated_sqlite_url, tmp_path)


def test_jobs_beyond_the_nodes_capacity_are_all_launched_for_kueue_to_queue(world: World) -> None:
    jobs = [world.submit(f"job-{i}", resources={"cpu": 4}) for i in range(3)]  # 1 fits on n1
    world.cycle(2)
    assert [world.state(j) for j in jobs] == [JobState.STARTING] * 3
    assert len(world.executor.requests) == 3
    assert all(r.placement == {} for r in world.executor.requests)
    events = [e.message for e in world.store.list_events(jobs[0])]
    assert any("handed to Kueue (LocalQueue default)" in m for m in events)
    queue_events = [e for e in world.store.list_events(jobs[0]) if e.kind == "queue"]
    assert [e.message for e in queue_events] == [f"attempt 1 not running yet: {QUEUED.reason}"]


def test_a_kueue_eviction_requeues_the_job_without_spending_a_restart(world: World) -> None:
    job_id = world.submit(restart={"max_restarts": 0})
    world.cycle(2)
    for number in (1, 2):  # twice: with no restart left, a counted one would fail the job
        key = world.key(job_id)
        world.executor.statuses[key] = [AttemptStatus(AttemptPhase.RUNNING)]
        world.cycle(advance=1)
        assert world.state(job_id) is JobState.RUNNING
        world.executor.statuses[key] = [EVICTED]
        world.cycle(advance=1)  # requeued, and (capacity freed) handed to Kueue again at once
        attempt = world.store.get_attempt(job_id, number)
        assert (attempt.state, attempt.reason) == ("cancelled", EVICTED.reason)
        job = world.store.get_job(job_id)
        assert (job.state, job.attempts, job.restarts) == (JobState.STARTING, number + 1, 0)
        states = [e.message for e in world.store.list_events(job_id) if e.kind == "state"]
        assert (
            f"RUNNING -> PENDING: {EVICTED.reason}; requeued, resumes from its last checkpoint"
        ) in states
        assert states[-2:] == [
            "PENDING -> ADMITTED: handed to Kueue (LocalQueue default)",
            f"ADMITTED -> STARTING: attempt {number + 1} launching",
        ]
        assert world.executor.cancels == []  # Kueue stopped it, not tensoryard
    assert world.store.get_job(job_id).restarts == 0


def test_a_cancel_requested_job_that_kueue_evicts_is_cancelled_not_requeued(world: World) -> None:
    job_id = world.submit()
    world.cycle(2)
    world.clock.t += 1
    world.store.request_cancel(job_id)
    world.executor.statuses[world.key(job_id)] = [EVICTED]
    world.cycle(advance=1)
    job = world.store.get_job(job_id)
    assert (job.state, job.attempts) == (JobState.CANCELLED, 1)


def test_time_in_kueues_queue_does_not_count_towards_the_starting_timeout(
    migrated_sqlite_url: str, tmp_path: Path
) -> None:
    world = kueue_world(migrated_sqlite_url, tmp_path, timeout=1)
    job_id = world.submit()
    world.cycle(200, advance=0.5)  # 100 s queued, 100x the timeout
    assert world.executor.cancels == []
    assert world.store.get_attempt(job_id, 1).reason == ""
    assert world.state(job_id) is JobState.STARTING
    world.clock.t += 3600  # the control plane was down an hour; Kueue still holds the job
    world.controller = kueue_controller(
        world.store, world.executor, world.clock, starting_timeout_s=1
    )
    assert world.controller.lead()
    world.cycle(advance=0.5)  # first poll after the restart: no verdict yet
    world.cycle(advance=0.5)
    assert world.executor.cancels == []
    # Admitted: from the last poll that still saw it queued, the timeout applies again.
    world.executor.statuses[world.key(job_id)] = [ADMITTED]
    world.cycle(3, advance=0.5)
    assert len(world.executor.cancels) == 1
    assert world.store.get_attempt(job_id, 1).reason == "did not start within 1s"


def test_without_external_admission_the_same_wait_is_a_timeout(
    migrated_sqlite_url: str, tmp_path: Path
) -> None:
    world = kueue_world(migrated_sqlite_url, tmp_path, external=False, timeout=1)
    job_id = world.submit()
    world.cycle(5, advance=0.5)
    assert world.store.get_attempt(job_id, 1).reason == "did not start within 1s"
    assert len(world.executor.cancels) == 1


def test_a_queue_reason_that_only_changes_its_numbers_is_one_event(world: World) -> None:
    """Kueue's reason counts ("8 more needed", "16 more needed") as others come and go; seen on
    the benchmark as one event per poll. One event per kind of reason; a new kind is noted."""
    job_id = world.submit()
    world.cycle(2)
    key = world.key(job_id)

    def waiting(text: str) -> AttemptStatus:
        return AttemptStatus(AttemptPhase.STARTING, reason=text, queued=True)

    quota = "waiting for Kueue admission in LocalQueue default: insufficient quota, {} more needed"
    world.executor.statuses[key] = [waiting(quota.format(n)) for n in (8, 16, 24)]
    world.cycle(3, advance=1)
    world.executor.statuses[key] = [waiting("waiting for Kueue to create its Workload")]
    world.cycle(advance=1)
    queue_events = [e.message for e in world.store.list_events(job_id) if e.kind == "queue"]
    assert queue_events == [
        f"attempt 1 not running yet: {QUEUED.reason}",
        f"attempt 1 not running yet: {quota.format(8)}",
        "attempt 1 not running yet: waiting for Kueue to create its Workload",
    ]


def test_the_time_kueue_admitted_an_attempt_is_recorded_once_and_its_wait_is_queueing(
    world: World,
) -> None:
    job_id = world.submit()
    world.cycle(2)
    world.cycle(20, advance=1.0)  # 20 s in Kueue's queue
    assert world.store.get_attempt(job_id, 1).admitted_at is None
    admitted = world.clock.t - 2.0  # Kueue's QuotaReserved time (a little before this poll)
    key = world.key(job_id)
    world.executor.statuses[key] = [replace(ADMITTED, admitted_at=admitted)]
    world.cycle(advance=1.0)
    recorded = world.store.get_attempt(job_id, 1).admitted_at
    assert recorded is not None and recorded.timestamp() == pytest.approx(admitted)
    later = replace(ADMITTED, admitted_at=admitted + 50)  # e.g. a re-admission: not rewritten
    world.executor.statuses[key] = [replace(later, phase=AttemptPhase.RUNNING, reason="")]
    world.cycle(advance=1.0)
    attempt = world.store.get_attempt(job_id, 1)
    assert attempt.admitted_at == recorded and attempt.state == "running"
    b = summarize(world.store, job_id, now=world.clock.dt()).breakdown
    assert b is not None and b.queueing_s >= 18.0  # Kueue's wait: queueing, not startup
    assert b.startup_s < 5.0 and b.allocated_s < 5.0
