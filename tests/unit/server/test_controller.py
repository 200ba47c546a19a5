"""The controller's own tests: one cycle at a time, a test clock, a real SQLite store and a
scripted executor (a test double that records every call and plays back statuses).

The real executor and real crashes are covered by tests/e2e/test_e2e_crash_safety.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from tensoryard.errors import ExecutorError
from tensoryard.executors.base import CONFIG_EXIT_CODE, AttemptPhase, AttemptStatus, LaunchRequest
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import Controller
from tensoryard.server.scheduling import CorePolicy, NodeCapacity
from tensoryard.server.summary import summarize
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import Store
from tensoryard.store.models import Job


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t

    def dt(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


@dataclass
class ScriptedExecutor:
    """Records launches by attempt key (idempotent like a real one) and plays statuses."""

    store: Store | None = None
    name: str = "scripted"
    launches: dict[str, int] = field(default_factory=dict)  # key -> times a workload started
    statuses: dict[str, list[AttemptStatus | Exception]] = field(default_factory=dict)
    default: AttemptStatus = field(default_factory=lambda: AttemptStatus(AttemptPhase.RUNNING))
    cancels: list[tuple[str, float]] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    fail_launch: bool = False
    seen_intent: list[str] = field(default_factory=list)
    requests: list[LaunchRequest] = field(default_factory=list)
    worker_restarts: list[str] = field(default_factory=list)
    stack_dumps: list[str] = field(default_factory=list)
    stacks: dict[int, str | None] = field(default_factory=dict)  # what dump_stacks answers

    def prepare(self, request: LaunchRequest) -> dict[str, Any]:
        return {"key": request.attempt_key}

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        if self.store is not None:  # the intent must be on record before anything starts
            attempt = self.store.get_attempt(int(request.job_id), request.attempt)
            assert attempt.attempt_key == request.attempt_key
            self.seen_intent.append(attempt.state)
        if self.fail_launch:
            raise ExecutorError("no such command")
        self.launches.setdefault(request.attempt_key, 1)
        self.requests.append(request)
        return {"key": request.attempt_key}

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        queue = self.statuses.get(handle["key"], [])
        item = queue.pop(0) if len(queue) > 1 else (queue[0] if queue else self.default)
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self, handle: dict[str, Any], *, grace_s: float) -> None:
        self.cancels.append((handle["key"], grace_s))

    def reattach(self, handle: dict[str, Any]) -> AttemptStatus:
        return self.poll(handle)

    def terminate(self, handle: dict[str, Any]) -> int:
        self.terminated.append(handle["key"])
        return 1

    def restart_workers(self, handle: dict[str, Any]) -> int:
        self.worker_restarts.append(handle["key"])
        return 2

    def log_paths(self, handle: dict[str, Any]) -> dict[int, Path]:
        return {}

    def dump_stacks(self, handle: dict[str, Any]) -> dict[int, str | None]:
        self.stack_dumps.append(handle["key"])
        return self.stacks

    def finish(self, key: str, phase: AttemptPhase, reason: str = "") -> None:
        self.statuses[key] = [AttemptStatus(phase, 0 if phase == "succeeded" else 1, reason)]


@dataclass
class World:
    store: Store
    executor: ScriptedExecutor
    clock: Clock
    controller: Controller
    tmp: Path

    def submit(self, name: str = "job", **extra: Any) -> int:
        spec = JobSpec.model_validate(
            {"name": name, "launcher": "python", "command": ["x.py"], "workdir": str(self.tmp)}
            | extra
        )
        return self.store.create_job(spec, run_dir_root=self.tmp / "runs").id

    def cycle(self, n: int = 1, advance: float = 0.0) -> None:
        for _ in range(n):
            self.clock.t += advance
            self.controller.cycle()

    def state(self, job_id: int) -> JobState:
        return self.store.get_job(job_id).state

    def key(self, job_id: int, number: int | None = None) -> str:
        job = self.store.get_job(job_id)
        return self.store.get_attempt(job_id, number or job.attempts).attempt_key

    def new_controller(self) -> Controller:
        """As after a control-plane restart: fresh memory, same store and executor."""
        self.controller = make_controller(self.store, self.executor, self.clock)
        return self.controller


def store_home(store: Store) -> Path:
    """The test's own directory (next to its SQLite file): secrets go there, not to ~/.tyard."""
    return Path(store.url.removeprefix("sqlite:///")).parent / "home"


def make_controller(store: Store, executor: ScriptedExecutor, clock: Clock) -> Controller:
    config = ServerConfig(
        home=store_home(store),
        launch_workers=0,
        cancel_grace_s=5,
        starting_timeout_s=60,
        poll_failure_grace_s=30,
        heartbeat_timeout_s=120,
    )
    return Controller(
        store=store,
        executor=executor,  # type: ignore[arg-type]
        policy=CorePolicy(),
        capacity=lambda: (NodeCapacity("n1", cpu_slots=4, memory_bytes=64 * 2**30),),
        config=config,
        clock=clock,
        job_key="k",
        holder="replica-a",  # a restarted replica comes back under its own name
    )


@pytest.fixture
def world(migrated_sqlite_url: str, tmp_path: Path) -> World:
    clock = Clock()
    store = Store.open(migrated_sqlite_url, clock=clock.dt)
    store.ensure_team("default")
    executor = ScriptedExecutor(store)
    controller = make_controller(store, executor, clock)
    assert controller.lead()
    return World(store, executor, clock, controller, tmp_path)


def test_an_attempt_is_on_record_before_the_executor_launches_it(world: World) -> None:
    job_id = world.submit()
    world.cycle(2)
    assert world.executor.seen_intent == ["launching"]
    attempt = world.store.get_attempt(job_id, 1)
    assert attempt.handle == {"key": attempt.attempt_key}
    assert attempt.state == "running" and attempt.running_at is not None
    assert world.state(job_id) is JobState.RUNNING


def test_a_launch_interrupted_after_its_intent_is_launched_again_with_the_same_key(
    world: World,
) -> None:
    job_id = world.submit()
    world.store.transition(job_id, JobState.ADMITTED, reason="test", placement={"n1": []})
    world.store.begin_attempt(
        job_id,
        expected=JobState.ADMITTED,
        number=1,
        attempt_key="the-key",
        handle={"key": "the-key"},
        reason="test",
    )
    world.new_controller().lead()  # the crash: nothing was launched
    world.cycle(2)
    assert world.executor.launches == {"the-key": 1}
    assert world.state(job_id) is JobState.RUNNING
    assert world.store.get_job(job_id).attempts == 1


def test_a_transient_poll_error_does_not_restart_the_job(world: World) -> None:
    job_id = world.submit()
    world.cycle(2)
    key = world.key(job_id)
    err = ExecutorError("cannot read exit.json")
    world.executor.statuses[key] = [err, err, AttemptStatus(AttemptPhase.RUNNING)]
    world.cycle(3, advance=5)
    job = world.store.get_job(job_id)
    assert job.state is JobState.RUNNING and job.attempts == 1
    assert world.executor.terminated == []
    kinds = [e.kind for e in world.store.list_events(job_id)]
    assert "warning" in kinds


def test_a_persistent_poll_error_kills_the_attempt_by_key_before_it_is_declared_lost(
    world: World,
) -> None:
    job_id = world.submit()
    world.cycle(2)
    key = world.key(job_id)
    world.executor.statuses[key] = [ExecutorError("disk gone")]
    world.cycle(8, advance=5)
    assert world.executor.terminated == [key]
    attempt = world.store.get_attempt(job_id, 1)
    assert attempt.state == "lost" and "killed 1 process" in attempt.reason
    assert world.store.get_job(job_id).attempts >= 2  # restarted after the kill


def test_max_runtime_counts_run_time_over_attempts_not_time_in_the_queue(world: World) -> None:
    job_id = world.submit(max_runtime="100s")
    world.cycle(2)
    assert world.state(job_id) is JobState.RUNNING
    world.clock.t += 60
    world.executor.finish(world.key(job_id), AttemptPhase.FAILED, "rank 0 exited with code 1")
    world.cycle()
    job = world.store.get_job(job_id)
    assert job.state is JobState.RESTARTING and job.run_time_s == pytest.approx(60)
    world.clock.t += 500  # waiting is not running
    world.cycle(2)
    assert world.state(job_id) is JobState.RUNNING
    world.cycle(advance=30)
    assert world.executor.cancels == []
    world.cycle(advance=15)  # 60 + 45 > 100
    assert len(world.executor.cancels) == 1
    assert "exceeded max_runtime" in world.store.get_attempt(job_id, 2).reason
    world.executor.finish(world.key(job_id), AttemptPhase.CANCELLED)
    world.cycle()
    job = world.store.get_job(job_id)
    assert job.state is JobState.FAILED and "exceeded max_runtime" in job.reason


def test_an_attempt_stuck_starting_is_stopped_and_restarted_with_the_reason(
    world: World,
) -> None:
    job_id = world.submit()
    world.executor.default = AttemptStatus(AttemptPhase.STARTING)
    world.cycle()
    world.cycle(advance=61)
    assert "did not start within 60s" in world.store.get_attempt(job_id, 1).reason
    world.executor.finish(world.key(job_id), AttemptPhase.CANCELLED)
    world.cycle()
    job = world.store.get_job(job_id)
    assert job.state is JobState.RESTARTING and "did not start" in job.reason


def test_a_job_that_stops_stepping_is_stopped_and_restarted_as_hung(world: World) -> None:
    job_id = world.submit(health={"min_stall": "60s", "stall_factor": 10})
    world.cycle(2)
    rows = [{"step": s, "ts": world.clock.t + s, "values": {"loss": 1.0}} for s in range(1, 6)]
    world.store.add_metrics(job_id, 1, rows)
    world.store.heartbeat(job_id, 1, world.clock.dt())
    world.cycle(advance=30)
    assert world.executor.cancels == []
    world.store.heartbeat(job_id, 1, datetime.fromtimestamp(world.clock.t + 40, UTC))
    world.cycle(advance=40)  # 65 s after the last step: over max(10 x 1 s, 60 s)
    reason = world.store.get_attempt(job_id, 1).reason
    assert reason.startswith("hung: no step for") and "after step 5" in reason
    # the hang grace (default 2 s), not the cancel grace: a stuck gang cannot checkpoint
    assert world.executor.cancels == [(world.key(job_id), 2.0)]
    world.executor.finish(world.key(job_id), AttemptPhase.CANCELLED)
    world.cycle()
    assert world.state(job_id) is JobState.RESTARTING


def test_a_silent_job_is_hung_after_its_heartbeat_timeout(world: World) -> None:
    job_id = world.submit(health={"heartbeat_timeout": "50s", "hang_grace": 0.5})
    world.cycle(2)
    world.cycle(advance=120)  # no heartbeat yet: a job without the runtime sends none
    assert world.store.get_attempt(job_id, 1).reason == ""
    world.store.heartbeat(job_id, 1, world.clock.dt())
    world.cycle(advance=51)
    assert world.store.get_attempt(job_id, 1).reason.startswith("hung: no heartbeat for")
    assert world.executor.cancels == [(world.key(job_id), 0.5)]  # the spec's hang_grace


def test_a_job_with_a_bad_stored_spec_fails_and_the_others_go_on(world: World) -> None:
    bad = world.submit("bad")
    good = world.submit("good")
    with world.store.engine.begin() as conn:
        conn.execute(update(Job).where(Job.id == bad).values(spec={"name": "bad", "command": []}))
    world.cycle(2)
    assert world.state(bad) is JobState.FAILED
    assert "stored spec is invalid" in world.store.get_job(bad).reason
    assert world.state(good) is JobState.RUNNING


def test_an_admitted_job_whose_cancel_was_requested_never_launches(world: World) -> None:
    job_id = world.submit()
    world.store.transition(job_id, JobState.ADMITTED, reason="test", placement={"n1": []})
    world.store.request_cancel(job_id)
    world.cycle()
    assert world.state(job_id) is JobState.CANCELLED
    assert world.executor.launches == {}


def test_a_failed_launch_ends_the_attempt_and_moves_the_job_together(world: World) -> None:
    world.executor.fail_launch = True
    job_id = world.submit(restart={"max_restarts": 0})
    world.cycle()
    job = world.store.get_job(job_id)
    attempt = world.store.get_attempt(job_id, 1)
    assert job.state is JobState.FAILED and "no such command" in job.reason
    assert attempt.state == "failed" and attempt.finished_at is not None


def test_recovery_repairs_a_job_whose_attempt_ended_without_it(world: World) -> None:
    job_id = world.submit()
    world.cycle(2)
    # As the old two-transaction code could leave it: the attempt ended, the job RUNNING.
    world.store.finish_attempt(job_id, 1, state="succeeded", reason="exit 0", exit_code=0)
    world.new_controller().lead()
    job = world.store.get_job(job_id)
    assert job.state is JobState.SUCCEEDED
    assert any(e.kind == "recovery" for e in world.store.list_events(job_id))


def test_recovery_kills_and_closes_an_attempt_the_job_no_longer_owns(world: World) -> None:
    job_id = world.submit()
    world.cycle(2)
    key = world.key(job_id)
    with world.store.engine.begin() as conn:  # as if the job had been requeued meanwhile
        conn.execute(update(Job).where(Job.id == job_id).values(state="PENDING"))
    world.new_controller().lead()
    assert world.executor.terminated == [key]
    attempt = world.store.get_attempt(job_id, 1)
    assert attempt.state == "lost" and attempt.finished_at is not None


def test_a_preempted_job_is_requeued_and_its_next_attempt_starts_its_own_clock(
    world: World,
) -> None:
    low = world.submit("low", resources={"cpu": 4})
    world.cycle(2)
    world.clock.t += 600
    world.store.heartbeat(low, 1, world.clock.dt())
    high = world.submit("high", priority=10, resources={"cpu": 4})
    world.cycle()
    assert world.executor.cancels, "the low-priority job is signalled"
    assert world.store.get_attempt(low, 1).reason.startswith("preempted for job")
    world.executor.finish(world.key(low), AttemptPhase.CANCELLED)
    world.cycle(3)
    assert world.state(low) is JobState.PENDING and world.state(high) is JobState.RUNNING
    assert world.store.get_job(low).run_time_s == pytest.approx(600)


def test_two_controllers_never_lead_at_once(world: World) -> None:
    other = make_controller(world.store, world.executor, world.clock)
    other.holder = "other"
    assert world.controller.is_leader
    assert not other.lead()
    world.clock.t += 11  # the leader stopped renewing: its lease expired
    assert other.lead()
    assert not world.controller.lead()


def test_a_cycle_longer_than_the_lease_is_no_change_of_leader_but_a_restart_is(
    world: World,
) -> None:
    """Seen on the Kueue benchmark: cycles of 10-30 s let the lease expire with no other
    replica around, and each renewal counted as taking the lead, re-running recovery (2,358
    "re-attaching" events for 500 jobs). Nobody took the lease in between, so the epoch and
    the memory stay; a restarted process with the same holder name still recovers."""
    assert world.controller.is_leader
    epoch = world.controller.epoch
    recovered: list[int] = []
    world.controller.recover = lambda: recovered.append(1)  # type: ignore[method-assign]
    world.clock.t += 30  # one long cycle: the lease expired, nobody else leads
    assert world.controller.lead() and world.controller.epoch == epoch and recovered == []
    restarted = make_controller(world.store, world.executor, world.clock)
    restarted.holder = world.controller.holder  # same host, port and home: same holder name
    world.clock.t += 30
    assert epoch is not None
    assert restarted.lead() and restarted.epoch == epoch + 1  # it recovered (fresh memory)


def test_a_secret_reference_is_resolved_at_launch_and_a_missing_one_fails_with_the_fix(
    world: World,
) -> None:
    seen: list[dict[str, str]] = []
    launch = world.executor.launch

    def record(request: LaunchRequest) -> dict[str, Any]:
        seen.append(dict(request.env))
        return launch(request)

    world.executor.launch = record  # type: ignore[method-assign]
    world.controller.secrets.put("default", "hf-token", "s3cret")
    ok = world.submit("ok", secrets={"HF_TOKEN": "hf-token"})
    world.cycle(2)
    assert world.state(ok) is JobState.RUNNING
    assert seen[-1]["HF_TOKEN"] == "s3cret"
    assert "s3cret" not in str(world.store.get_job(ok).spec)
    missing = world.submit("missing", secrets={"KEY": "nope"}, restart={"max_restarts": 0})
    world.cycle(2, advance=1)
    job = world.store.get_job(missing)
    assert job.state is JobState.FAILED
    assert "no secret 'nope'" in job.reason and "tyard secrets set default nope" in job.reason


def test_new_submissions_reschedule_at_a_bounded_rate_but_a_freed_slot_at_once(
    world: World,
) -> None:
    running = world.submit("running", resources={"cpu": 4})
    world.cycle(2)
    assert world.state(running) is JobState.RUNNING
    world.controller._scheduling.cost_s = 0.5  # as if a pass over a deep backlog took 0.5 s
    waiting = world.submit("waiting", resources={"cpu": 4})
    world.cycle(advance=0.5)
    assert world.store.get_job(waiting).pending_reason == ""  # not yet: at most every 2 s
    world.cycle(advance=1.6)
    assert world.store.get_job(waiting).pending_reason != ""
    world.executor.finish(world.key(running), AttemptPhase.SUCCEEDED)
    world.cycle(advance=0.01)  # the slot came free: scheduled in the same cycle
    assert world.state(waiting) is JobState.STARTING


@pytest.mark.parametrize("auto", [True, False], ids=["auto interval", "fixed interval"])
def test_a_restart_gets_the_young_daly_checkpoint_interval_only_when_asked(
    world: World, auto: bool
) -> None:
    job_id = world.submit(checkpoint={"interval": 100, "auto_interval": auto, "async_save": True})
    world.cycle(2)
    first = world.executor.requests[-1].env
    assert first["TYARD_CHECKPOINT_INTERVAL"] == "100"
    assert (first["TYARD_CHECKPOINT_ASYNC"], first["TYARD_CHECKPOINT_LAYOUT"]) == ("1", "auto")
    rows = [{"step": s, "ts": world.clock.t + s, "step_time_s": 1.0, "values": {}} for s in
            range(1, 21)]  # fmt: skip
    world.store.add_metrics(job_id, 1, rows)
    world.store.add_checkpoint(job_id, 1, step=10, path="c10", ts=world.clock.t + 10)
    world.store.update_attempt(job_id, 1, checkpoint_save_s=2.0)
    world.clock.t += 3600
    world.executor.finish(world.key(job_id), AttemptPhase.FAILED, "exit code 1")
    world.cycle(4, advance=5)
    assert world.store.get_job(job_id).attempts == 2
    advice = summarize(world.store, job_id, now=world.clock.dt()).checkpoint_advice
    assert advice is not None and advice.interval_steps is not None
    expected = str(advice.interval_steps) if auto else "100"
    assert world.executor.requests[-1].env["TYARD_CHECKPOINT_INTERVAL"] == expected
    assert advice.interval_steps != 100  # the advice differs, so the test tells them apart


def test_a_restarting_job_says_which_attempt_comes_and_from_which_step(world: World) -> None:
    job_id = world.submit(restart={"max_restarts": 2, "backoff": "30s"})
    world.cycle(2)
    world.store.add_checkpoint(job_id, 1, step=1200, path="c1200", ts=world.clock.t + 10)
    world.executor.finish(world.key(job_id), AttemptPhase.FAILED, "exit code 1")
    world.cycle(1)
    job = world.store.get_job(job_id)
    assert job.state is JobState.RESTARTING
    assert job.reason.endswith(
        "; restarting from the last checkpoint (step 1200) as attempt 2 in 30s (1 restart(s) left)"
    ), job.reason


def test_in_place_restarts_are_granted_within_the_restart_budget_and_counted_against_it(
    world: World,
) -> None:
    job_id = world.submit(
        launcher="torchrun",
        resources={"processes_per_node": 2},
        restart={"max_restarts": 3, "in_place": 2, "backoff": "0s"},
    )
    world.cycle(2)
    assert world.executor.requests[-1].in_place_restarts == 2
    assert world.executor.requests[-1].env["TYARD_IN_PLACE_RESTARTS"] == "2"
    key = world.key(job_id)
    # torchrun restarted the workers twice; their first reports recorded attempts 2 and 3
    world.store.restart_in_place(job_id, launch=1, number=2)
    world.store.restart_in_place(job_id, launch=1, number=3)
    world.cycle(advance=1)
    assert world.state(job_id) is JobState.RUNNING  # the same launch, polled by its handle
    assert world.store.get_attempt(job_id, 3).attempt_key == key
    # then the launch failed for good (torchrun's budget spent): one control-plane restart left
    world.executor.finish(key, AttemptPhase.FAILED, "rank 1 exited with code 1")
    world.cycle(4, advance=1)
    job = world.store.get_job(job_id)
    assert (job.attempts, job.restarts) == (4, 3)
    assert world.store.get_attempt(job_id, 3).state == "failed"
    assert world.executor.requests[-1].attempt == 4
    assert world.executor.requests[-1].in_place_restarts == 0  # nothing left to grant
    assert "TYARD_IN_PLACE_RESTARTS" not in world.executor.requests[-1].env
    # a python launcher (no torchrun agent to restart workers) never gets any
    other = world.submit("plain", restart={"max_restarts": 3, "in_place": 2})
    world.cycle(2, advance=1)
    assert [r.in_place_restarts for r in world.executor.requests if r.job_id == str(other)] == [0]


def test_a_hung_attempt_with_in_place_restarts_left_gets_its_workers_restarted_in_place(
    world: World,
) -> None:
    job_id = world.submit(
        launcher="torchrun",
        health={"heartbeat_timeout": "50s"},
        restart={"max_restarts": 3, "in_place": 1},
    )
    world.cycle(2)
    key = world.key(job_id)
    world.store.heartbeat(job_id, 1, world.clock.dt())
    world.cycle(advance=51)
    # killed for torchrun to restart (not cancelled: the launch and its allocation stay)
    assert (world.executor.worker_restarts, world.executor.cancels) == ([key], [])
    assert world.store.get_attempt(job_id, 1).reason.startswith("hung: no heartbeat for")
    events = [e.message for e in world.store.list_events(job_id) if e.kind == "restart"]
    assert len(events) == 1 and "killed its 2 worker(s) for torchrun" in events[0]
    world.cycle(3, advance=30)  # the restarted workers have not reported yet: wait
    assert (world.executor.worker_restarts, world.executor.cancels) == ([key], [])
    world.store.restart_in_place(job_id, launch=1, number=2)  # their first report
    world.store.heartbeat(job_id, 2, world.clock.dt())
    world.cycle(advance=51)  # hung again, and the launch's one in-place restart is spent
    assert world.executor.worker_restarts == [key]
    assert world.executor.cancels == [(key, 2.0)]  # the ordinary stop, then a new launch
    assert world.store.get_attempt(job_id, 2).reason.startswith("hung: no heartbeat for")


def test_restarted_workers_that_never_report_are_stopped_the_ordinary_way(world: World) -> None:
    job_id = world.submit(
        launcher="torchrun",
        health={"heartbeat_timeout": "50s"},
        restart={"max_restarts": 3, "in_place": 2},
    )
    world.cycle(2)
    world.store.heartbeat(job_id, 1, world.clock.dt())
    world.cycle(advance=51)
    assert len(world.executor.worker_restarts) == 1
    world.cycle(advance=121)  # _IN_PLACE_WAIT_S passed without a report from them
    assert len(world.executor.worker_restarts) == 1  # not a second time for this attempt
    assert world.executor.cancels == [(world.key(job_id), 2.0)]


C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
STACKS = f"""\
Current thread 0x00007f269e06fb80 (most recent call first):
  File "{C10D}", line 2810 in all_reduce
  File "/srv/llm/train.py", line 188 in train
  File "/srv/llm/train.py", line 217 in <module>
"""


def test_a_hung_attempt_is_asked_where_its_ranks_wait_once_before_it_is_stopped(
    world: World,
) -> None:
    world.executor.stacks = {0: STACKS, 1: None}
    job_id = world.submit(health={"heartbeat_timeout": "50s", "on_hang": "warn"})
    world.cycle(2)
    key = world.key(job_id)
    world.store.heartbeat(job_id, 1, world.clock.dt())
    world.cycle(3, advance=51)  # hung, three health checks: asked once
    assert world.executor.stack_dumps == [key]
    (event,) = [
        e.message for e in world.store.list_events(job_id) if "where the ranks" in e.message
    ]
    assert "rank 0 at train.py:188 in train, waiting in all_reduce (distributed_c10d.py:2810)" in (
        event
    )
    assert "rank 1: no stack dump" in event


def test_a_stopping_controller_launches_nothing_and_the_next_leader_launches_it(
    world: World,
) -> None:
    # Seen at the end of a benchmark: a cycle still running when stop() had shut the launch
    # pool down raised "cannot schedule new futures after shutdown" for a job it admitted.
    job_id = world.submit()
    world.controller._stop.set()
    world.cycle()
    assert world.executor.requests == []  # nothing handed over while stopping
    attempt = world.store.get_attempt(job_id, 1)
    assert attempt.state == "launching"  # the intent stays on record
    world.new_controller()
    assert world.controller.lead()
    world.cycle(2)
    assert [r.job_id for r in world.executor.requests] == [str(job_id)]


def test_the_loop_schedules_again_when_a_borrower_becomes_reclaimable(world: World) -> None:
    """Teams a and b own 4 of the node's 8 GPUs each; a's job borrows b's half. b's job
    submitted 20 s later waits (a borrower runs 60 s before reclaim stops it) and says so;
    the loop then schedules at that moment, not at its next 30 s pass, and the borrower is
    asked to stop for b."""
    world.store.ensure_team("a", gpu_quota=4)
    world.store.ensure_team("b", gpu_quota=4)
    world.controller.capacity = lambda: (
        NodeCapacity("n1", 32.0, 64 * 2**30, tuple(range(8)), "H100"),
    )
    borrower = world.submit("big", team="a", launcher="torchrun", resources={"gpus_per_node": 8})
    world.cycle(2)
    assert world.state(borrower) is JobState.RUNNING
    started = world.clock.t
    world.clock.t = started + 20
    lender = world.submit("small", team="b", launcher="torchrun", resources={"gpus_per_node": 4})
    world.cycle(advance=0.01)
    assert "become reclaimable in 40 s" in world.store.get_job(lender).pending_reason
    world.clock.t = started + 51  # a regular pass (30 s after the last one)
    world.cycle()
    assert world.executor.cancels == []
    world.clock.t = started + 60.5  # 9.5 s later: only the wake-up makes this a pass
    world.cycle()
    assert [key for key, _ in world.executor.cancels] == [world.key(borrower)]


def test_an_attempt_that_exits_with_a_configuration_error_is_not_restarted(world: World) -> None:
    job_id = world.submit(restart={"max_restarts": 3, "backoff": 0})
    world.cycle(2)
    key = world.key(job_id)
    said = "pod ty-1-1 exited with code 78 (configuration error): image x does not match"
    world.executor.statuses[key] = [AttemptStatus(AttemptPhase.FAILED, CONFIG_EXIT_CODE, said)]
    world.cycle(3)
    job = world.store.get_job(job_id)
    assert job.state is JobState.FAILED, job.reason
    assert job.restarts == 0 and job.attempts == 1
    assert "image x does not match" in job.reason and "not restarted" in job.reason
    # Any other failure still restarts within the budget.
    other = world.submit("other", restart={"max_restarts": 3, "backoff": 0})
    world.cycle(2, advance=1.0)
    world.executor.statuses[world.key(other)] = [AttemptStatus(AttemptPhase.FAILED, 1, "boom")]
    world.cycle(3, advance=1.0)
    assert world.store.get_job(other).restarts == 1
