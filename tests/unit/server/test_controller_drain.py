"""The control loop's half of the closed health loop: a draining node takes no new placements,
its running jobs get the checkpoint signal and are requeued onto a healthy node.

A real SQLite store, a test clock and the scripted executor of test_controller.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from test_controller import Clock, ScriptedExecutor, World, store_home

from tensoryard.errors import ExecutorError
from tensoryard.executors.base import AttemptPhase
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import Controller
from tensoryard.server.scheduling import CorePolicy, NodeCapacity
from tensoryard.spec.states import JobState
from tensoryard.store import NodeRecord, Store

NODES = (
    NodeCapacity("n1", cpu_slots=2, memory_bytes=64 * 2**30),
    NodeCapacity("n2", cpu_slots=2, memory_bytes=64 * 2**30),
)


def two_node_controller(store: Store, executor: ScriptedExecutor, clock: Clock) -> Controller:
    config = ServerConfig(home=store_home(store), launch_workers=0, cancel_grace_s=5)
    return Controller(
        store=store,
        executor=executor,  # type: ignore[arg-type]
        policy=CorePolicy(),
        capacity=lambda: NODES,
        config=config,
        clock=clock,
        job_key="k",
        holder="replica-a",
    )


@pytest.fixture
def world(migrated_sqlite_url: str, tmp_path: Path) -> World:
    clock = Clock()
    store = Store.open(migrated_sqlite_url, clock=clock.dt)
    store.ensure_team("default")
    executor = ScriptedExecutor(store)
    controller = two_node_controller(store, executor, clock)
    assert controller.lead()
    return World(store, executor, clock, controller, tmp_path)


def submit_two_cpu(world: World, name: str = "job") -> int:
    return world.submit(name, resources={"cpu": 2})


def test_the_nodes_of_the_executor_are_registered_ready_when_the_loop_takes_the_lead(
    world: World,
) -> None:
    assert [(n.name, n.state) for n in world.store.list_nodes()] == [
        ("n1", "ready"),
        ("n2", "ready"),
    ]
    assert [e.kind for e in world.store.node_history("n1")] == ["registered"]


def test_a_cordoned_node_takes_no_new_job_and_keeps_its_running_one(world: World) -> None:
    first = submit_two_cpu(world, "first")
    world.cycle(2)
    node = next(iter(world.store.get_job(first).placement))
    world.store.set_node_state(node, "cordoned", reason="maintenance", actor="admin")
    second = submit_two_cpu(world, "second")
    third = submit_two_cpu(world, "third")
    world.cycle(3, advance=1)
    assert world.state(first) is JobState.RUNNING
    assert world.store.get_job(first).placement == {node: []}
    other = "n2" if node == "n1" else "n1"
    running = [j for j in (second, third) if world.state(j) is JobState.RUNNING]
    assert len(running) == 1 and world.store.get_job(running[0]).placement == {other: []}
    assert world.executor.cancels == []


def test_a_draining_node_signals_its_job_which_is_requeued_and_resumes_on_the_other_node(
    world: World,
) -> None:
    job_id = submit_two_cpu(world)
    world.cycle(2)
    node = next(iter(world.store.get_job(job_id).placement))
    key = world.key(job_id)
    world.store.set_node_state(node, "draining", reason="XID 79 on GPU 2", actor="agent")
    world.cycle(1, advance=1)
    assert world.executor.cancels == [(key, 5)]
    world.cycle(2, advance=1)
    assert world.executor.cancels == [(key, 5)]  # signalled once
    world.executor.finish(key, AttemptPhase.CANCELLED, "SIGTERM")
    world.cycle(3, advance=1)
    job = world.store.get_job(job_id)
    assert job.state is JobState.RUNNING and job.attempts == 2
    assert job.restarts == 0  # a sick node is not the job's failure
    assert job.placement == {("n2" if node == "n1" else "n1"): []}
    first = world.store.get_attempt(job_id, 1)
    assert first.reason == f"node {node} drained: XID 79 on GPU 2"
    messages = [e.message for e in world.store.list_events(job_id) if e.kind == "drain"]
    assert messages and messages[0].startswith(f"node {node} drained: XID 79 on GPU 2")


def test_a_job_waiting_to_restart_on_a_draining_node_goes_back_to_pending(world: World) -> None:
    job_id = submit_two_cpu(world)
    world.cycle(2)
    node = next(iter(world.store.get_job(job_id).placement))
    world.executor.finish(world.key(job_id), AttemptPhase.FAILED, "exit 1")
    world.cycle(1, advance=1)
    assert world.state(job_id) is JobState.RESTARTING
    world.store.set_node_state(node, "draining", reason="IB port mlx5_0/1 down", actor="agent")
    world.cycle(1, advance=1)
    job = world.store.get_job(job_id)
    assert job.state in (JobState.PENDING, JobState.ADMITTED, JobState.STARTING)
    assert node not in job.placement


def test_after_a_control_plane_restart_a_drain_is_carried_on_and_the_node_stays_drained(
    world: World,
) -> None:
    job_id = submit_two_cpu(world)
    world.cycle(2)
    node = next(iter(world.store.get_job(job_id).placement))
    key = world.key(job_id)
    world.store.set_node_state(node, "draining", reason="XID 79 on GPU 2", actor="agent")
    world.cycle(1, advance=1)
    controller = two_node_controller(world.store, world.executor, world.clock)
    world.controller = controller
    assert controller.lead()
    assert world.store.get_node(node).state == "draining"  # a restart never uncordons
    world.executor.finish(key, AttemptPhase.CANCELLED, "SIGTERM")
    world.cycle(3, advance=1)
    job = world.store.get_job(job_id)
    assert job.state is JobState.RUNNING and node not in job.placement


def test_uncordon_makes_the_node_schedulable_again(world: World) -> None:
    world.store.set_node_state("n1", "draining", reason="XID 79 on GPU 2", actor="agent")
    world.store.set_node_state("n2", "cordoned", reason="maintenance", actor="admin")
    job_id = submit_two_cpu(world)
    world.cycle(2, advance=1)
    assert world.state(job_id) is JobState.PENDING
    assert "all 2 node(s) are cordoned or draining" in world.store.get_job(job_id).pending_reason
    world.store.set_node_state("n1", "ready", reason="GPU 2 replaced", actor="admin")
    world.cycle(3, advance=2)
    assert world.state(job_id) is JobState.RUNNING
    assert world.store.get_job(job_id).placement == {"n1": []}
    kinds = [e.kind for e in world.store.node_history("n1")]
    assert kinds == ["uncordon", "drain", "registered"]


def test_a_repeated_report_of_the_same_fault_writes_no_new_history(world: World) -> None:
    _, changed = world.store.set_node_state("n1", "draining", reason="XID 79", actor="agent")
    _, again = world.store.set_node_state("n1", "draining", reason="XID 79", actor="agent")
    _, cordon = world.store.set_node_state("n1", "cordoned", reason="XID 79", actor="admin")
    assert (changed, again, cordon) == (True, False, False)
    assert world.store.get_node("n1").state == "draining"
    assert len(world.store.node_history("n1")) == 2


def test_an_unknown_node_or_state_is_refused_with_the_fix(world: World) -> None:
    from tensoryard.errors import NotFound, SpecError

    with pytest.raises(NotFound, match="tyard nodes list"):
        world.store.set_node_state("n9", "cordoned", reason="x", actor="admin")
    with pytest.raises(SpecError, match="not a node state"):
        world.store.set_node_state("n1", "broken", reason="x", actor="admin")
    assert world.store.get_node("n1").state == "ready"


def test_every_launch_gets_nccl_debug_logs_and_the_flight_recorder_in_its_run_dir(
    world: World,
) -> None:
    seen: list[dict[str, str]] = []
    launch = world.executor.launch

    def recording(request):  # type: ignore[no-untyped-def]
        seen.append(dict(request.env))
        return launch(request)

    world.executor.launch = recording  # type: ignore[method-assign]
    default = world.submit("plain")
    own = world.submit("own", env={"NCCL_DEBUG": "WARN"})
    world.cycle(3)
    run_dir = Path(world.store.get_job(default).run_dir)
    plain, mine = sorted(seen, key=lambda env: env["TYARD_JOB_ID"])
    assert plain["NCCL_DEBUG"] == "INFO"
    assert plain["NCCL_DEBUG_FILE"] == str(run_dir / "nccl" / "nccl-%h-%p.log")
    assert plain["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert plain["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert plain["TORCH_FR_DUMP_TEMP_FILE"].startswith(str(run_dir / "nccl"))
    assert (run_dir / "nccl").is_dir()  # NCCL does not create directories
    assert "NCCL_DEBUG" not in mine  # the job's own spec.env wins (applied by the executor)
    assert int(mine["TYARD_JOB_ID"]) == own


def test_a_node_the_executor_finds_later_is_registered_ready(
    migrated_sqlite_url: str, tmp_path: Path
) -> None:
    clock = Clock()
    store = Store.open(migrated_sqlite_url, clock=clock.dt)
    nodes = list(NODES[:1])
    controller = two_node_controller(store, ScriptedExecutor(store), clock)
    controller.capacity = lambda: tuple(nodes)
    assert controller.lead()
    assert [n.name for n in store.list_nodes()] == ["n1"]
    nodes.append(NODES[1])
    clock.t += 2
    controller.cycle()
    assert [(n.name, n.state) for n in store.list_nodes()] == [("n1", "ready"), ("n2", "ready")]


def test_every_cycle_hands_the_stored_node_states_to_the_node_sync_and_survives_its_failure(
    world: World,
) -> None:
    seen: list[dict[str, str]] = []

    def sync(states: Mapping[str, NodeRecord]) -> None:
        seen.append({n: r.state for n, r in states.items()})
        if len(seen) == 1:
            raise ExecutorError("the API server is down")  # the next cycle retries

    world.controller.node_sync = sync
    world.store.set_node_state("n1", "draining", reason="XID 79", actor="agent")
    world.cycle(2, advance=1)
    assert seen[0] == {"n1": "draining", "n2": "ready"}
    assert seen[-1] == {"n1": "draining", "n2": "ready"} and len(seen) >= 2
    world.store.set_node_state("n1", "ready", reason="fixed", actor="admin")
    world.cycle(1, advance=1)
    assert seen[-1] == {"n1": "ready", "n2": "ready"}
