"""A lost node is never reused: the attempt that lost it ends with the node named, and the
restart leaves the node at once (first failure), onto a spare, or back to the queue with
"waiting for a node to replace" until the node is back.

A real SQLite store, a test clock and the scripted executor of test_controller.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_controller import Clock, ScriptedExecutor, World, store_home

from tensoryard.executors.base import AttemptPhase, AttemptStatus
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import Controller
from tensoryard.server.scheduling import CorePolicy, NodeCapacity
from tensoryard.spec.states import JobState
from tensoryard.store import Store


def node(name: str) -> NodeCapacity:
    return NodeCapacity(name, cpu_slots=2, memory_bytes=64 * 2**30)


class Cluster:
    """The executor's nodes, changed by the test (a node deleted, NotReady, back)."""

    def __init__(self, *names: str) -> None:
        self.nodes = {n: node(n) for n in names}

    def __call__(self) -> tuple[NodeCapacity, ...]:
        return tuple(self.nodes.values())


def make(url: str, tmp_path: Path, cluster: Cluster, executor_name: str = "local") -> World:
    clock = Clock()
    store = Store.open(url, clock=clock.dt)
    store.ensure_team("default")
    executor = ScriptedExecutor(store)
    config = ServerConfig(
        home=store_home(store), launch_workers=0, cancel_grace_s=5, executor=executor_name
    )
    controller = Controller(
        store=store,
        executor=executor,  # type: ignore[arg-type]
        policy=CorePolicy(),
        capacity=cluster,
        config=config,
        clock=clock,
        job_key="k",
        holder="replica-a",
    )
    assert controller.lead()
    return World(store, executor, clock, controller, tmp_path)


def gang(world: World) -> int:
    return world.submit(
        "gang",
        launcher="torchrun",
        resources={"nodes": 2, "cpu": 2},
        restart={"backoff": "0s"},
    )


def lose(world: World, job_id: int, name: str, why: str) -> None:
    """The executor sees the node lost under the running attempt."""
    world.executor.statuses[world.key(job_id)] = [
        AttemptStatus(AttemptPhase.FAILED, None, why, (1,), lost_nodes=(name,))
    ]


@pytest.fixture
def url(migrated_sqlite_url: str) -> str:
    return migrated_sqlite_url


def test_with_a_spare_only_the_lost_node_is_swapped_on_the_first_failure(
    url: str, tmp_path: Path
) -> None:
    cluster = Cluster("n1", "n2", "n3")
    world = make(url, tmp_path, cluster)
    job_id = gang(world)
    world.cycle(2)
    placed = sorted(world.store.get_job(job_id).placement)
    lost, kept = placed[1], placed[0]
    del cluster.nodes[lost]  # the Node object was deleted
    lose(world, job_id, lost, f"node {lost} deleted under rank 1")
    world.cycle(3, advance=1)
    job = world.store.get_job(job_id)
    assert job.attempts == 2 and job.state is JobState.RUNNING
    assert job.restarts == 0  # the cluster's failure, not the job's
    assert lost not in job.placement and kept in job.placement and "n3" in job.placement
    first = world.store.get_attempt(job_id, 1)
    assert first.reason == f"node {lost} deleted under rank 1"
    events = [e.message for e in world.store.list_events(job_id)]
    assert any(f"{lost} replaced by n3" in m for m in events), events


def test_without_a_spare_the_job_waits_for_a_replacement_then_resumes_when_the_node_is_back(
    url: str, tmp_path: Path
) -> None:
    cluster = Cluster("n1", "n2")
    world = make(url, tmp_path, cluster)
    job_id = gang(world)
    world.cycle(2)
    world.store.add_checkpoint(job_id, 1, step=1200, path="c1200", ts=world.clock.t)
    cluster.nodes["n2"] = NodeCapacity(
        "n2", cpu_slots=2, memory_bytes=64 * 2**30, cordoned=True
    )  # NotReady: no new placements
    lose(world, job_id, "n2", "node n2 NotReady since 12:01:03Z under rank 1")
    world.cycle(3, advance=1)
    job = world.store.get_job(job_id)
    assert job.state is JobState.PENDING and job.placement == {}
    assert "waiting for a node to replace n2" in job.reason
    assert job.restarts == 0  # the cluster's failure, not the job's
    launches = dict(world.executor.launches)
    world.cycle(3, advance=1)
    assert world.executor.launches == launches  # nothing placed on the NotReady node
    # why-pending says what is happening first, then why it waits
    assert world.store.get_job(job_id).pending_reason == (
        "restarting attempt 2 from step 1200 after attempt 1 ended (node n2 NotReady since "
        "12:01:03Z under rank 1), waiting for a node to replace n2; needs 2 node(s) but only 1 "
        "of 2 are schedulable now (the others are cordoned, draining or NotReady: `tyard nodes "
        "list` says why); it starts when enough are back"
    )
    cluster.nodes["n2"] = node("n2")  # Ready again: used again, at the next cycle
    world.cycle(3, advance=1)
    job = world.store.get_job(job_id)
    assert job.state is JobState.RUNNING and job.attempts == 2
    assert sorted(job.placement) == ["n1", "n2"]


def test_a_single_node_job_leaves_a_deleted_node_at_once(url: str, tmp_path: Path) -> None:
    cluster = Cluster("n1", "n2")
    world = make(url, tmp_path, cluster)
    job_id = world.submit("one", resources={"cpu": 2}, restart={"backoff": "0s"})
    world.cycle(2)
    lost = next(iter(world.store.get_job(job_id).placement))
    del cluster.nodes[lost]
    lose(world, job_id, lost, f"node {lost} deleted")
    world.cycle(3, advance=1)
    job = world.store.get_job(job_id)
    assert job.state is JobState.RUNNING and job.attempts == 2
    assert lost not in job.placement


def test_a_cancel_landing_before_a_pending_reason_is_written_is_not_lost(
    url: str, tmp_path: Path
) -> None:
    """Seen in the console's benchmark: the loop wrote a pending job's new start estimate after
    a cancel had landed, put back its own older copy of the job under the new stamp, and its
    next refresh skipped the row: the job stayed PENDING with the cancel requested."""
    world = make(url, tmp_path, Cluster("n1"))
    blocker = world.submit("blocker", resources={"cpu": 2})
    world.cycle(2)
    waiting = world.submit("waiting", resources={"cpu": 2})
    world.cycle(1, advance=1)  # its reason and estimate are computed
    c = world.controller
    c._pending.put(waiting, "waiting for n1 (test)", None)  # a write still to come
    world.clock.t += 0.5
    world.store.request_cancel(waiting)  # the cancel lands in between
    c._pending.write()
    world.cycle(2, advance=1)
    assert world.state(waiting) is JobState.CANCELLED
    assert world.state(blocker) is JobState.RUNNING


def test_a_node_whose_agent_falls_silent_is_lost_and_its_gang_moves_uncharged(
    url: str, tmp_path: Path
) -> None:
    cluster = Cluster("n1", "n2", "n3")
    world = make(url, tmp_path, cluster)  # the local executor's default: 30 s of silence
    world.store.register_nodes(["n1", "n2", "n3"])
    job_id = gang(world)
    world.cycle(2)
    placed = sorted(world.store.get_job(job_id).placement)
    lost = placed[1]
    first_key = world.key(job_id)
    for _ in range(4):  # every agent reports every 10 s, but the lost node's after the first
        for name in ("n1", "n2", "n3"):
            if name != lost or _ == 0:
                world.store.node_heartbeat(name)
        world.cycle(1, advance=10)
    world.cycle(2, advance=1)
    job = world.store.get_job(job_id)
    assert job.attempts == 2 and job.state is JobState.RUNNING, job.reason
    assert job.restarts == 0  # the node's failure, not the job's
    assert lost not in job.placement and "n3" in job.placement
    assert first_key in world.executor.terminated  # killed by key: a lost node cannot checkpoint
    first = world.store.get_attempt(job_id, 1)
    assert f"node {lost} lost: its agent has not reported since" in first.reason, first.reason
    assert "--agent-heartbeat-timeout 30s" in first.reason
    # A node that never had an agent is never lost for want of one; the silent one is back
    # as soon as its agent reports again.
    view = {n.name: n for n in world.controller._nodes.capacity(world.clock())}
    assert view[lost].cordoned and "agent has not reported" in view[lost].condition
    world.store.node_heartbeat(lost)
    world.cycle(1, advance=2)
    view = {n.name: n for n in world.controller._nodes.capacity(world.clock())}
    assert not view[lost].cordoned


def test_agent_silence_is_not_node_loss_where_the_executor_sees_its_nodes(
    url: str, tmp_path: Path
) -> None:
    cluster = Cluster("n1", "n2", "n3")
    world = make(url, tmp_path, cluster, executor_name="kubernetes")
    world.store.register_nodes(["n1", "n2", "n3"])
    for name in ("n1", "n2", "n3"):
        world.store.node_heartbeat(name)
    job_id = gang(world)
    world.cycle(2)
    world.cycle(6, advance=10)  # 60 s without a heartbeat: the kubelet, not the agent, decides
    job = world.store.get_job(job_id)
    assert job.attempts == 1 and job.state is JobState.RUNNING
