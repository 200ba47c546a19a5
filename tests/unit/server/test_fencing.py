"""Fencing tokens: a control loop that lost the lease can change no row and start nothing, and
every event names the replica and epoch that wrote it (SQLite; PostgreSQL in
tests/e2e/test_e2e_fencing.py)."""

from __future__ import annotations

import pytest
from tests.unit.server.test_controller import World, make_controller
from tests.unit.server.test_controller import world as world  # the fixture

from tensoryard.errors import FencedOut
from tensoryard.spec.states import JobState
from tensoryard.store import Fence


def test_a_fenced_write_under_a_stale_epoch_changes_nothing_and_says_why(world: World) -> None:
    store = world.store
    job_id = world.submit()
    epoch = world.controller.epoch
    assert epoch is not None
    told: list[str] = []
    stale = store.fenced(
        lambda: Fence("controller", "replica-a", epoch - 1, 3.0), on_fenced=told.append
    )
    with pytest.raises(FencedOut, match="moved on"):
        stale.add_event(job_id, "runtime", "from a deposed leader")
    assert told and "epoch" in told[0]
    assert all(e.message != "from a deposed leader" for e in store.list_events(job_id))
    fresh = store.fenced(lambda: Fence("controller", "replica-a", epoch, 3.0))
    event = fresh.add_event(job_id, "runtime", "from the leader")
    assert (event.replica, event.epoch) == (store.replica, epoch)


def test_a_view_that_leads_nothing_writes_nothing(world: World) -> None:
    job_id = world.submit()
    with pytest.raises(FencedOut, match="does not hold"):
        world.store.fenced(lambda: None).add_event(job_id, "runtime", "x")


def test_api_writes_are_not_fenced_but_name_their_replica(world: World) -> None:
    job_id = world.submit()
    event = world.store.add_event(job_id, "runtime", "from the API")
    assert event.replica == world.store.replica and event.epoch is None


def test_a_deposed_leader_steps_down_at_its_first_write_and_launches_nothing(
    world: World,
) -> None:
    old = world.controller
    job_id = world.submit()
    world.clock.t += 11  # the leader froze: its lease expired
    new = make_controller(world.store, world.executor, world.clock)
    new.holder = "replica-b"
    assert new.lead() and new.epoch == (old.epoch or 0) + 1
    # The old one resumes and runs the cycle it was in, without renewing first.
    with pytest.raises(FencedOut):
        old.cycle()
    assert not old.is_leader and old.epoch is None
    assert world.executor.launches == {}
    assert world.state(job_id) is JobState.PENDING
    assert not old.leading_now()
    # The new leader runs the job, once.
    new.cycle()
    new.cycle()
    assert list(world.executor.launches.values()) == [1]
    audit = [a.action for a in world.store.list_audit(action="leader.")]
    assert "leader.take" in audit and "leader.step-down" in audit


def test_a_launch_is_refused_when_the_lease_moved_on_between_intent_and_launch(
    world: World,
) -> None:
    job_id = world.submit()
    world.cycle()  # admitted (and, with no launch workers, launched in the same pass)
    first = dict(world.executor.launches)
    other = make_controller(world.store, world.executor, world.clock)
    other.holder = "replica-b"
    world.clock.t += 11
    assert other.lead()
    with pytest.raises(FencedOut):
        world.controller.check_fence()
    assert not world.controller.is_leader
    assert world.executor.launches == first
    assert world.state(job_id) in (JobState.STARTING, JobState.RUNNING, JobState.ADMITTED)


def test_healthz_leadership_needs_a_fresh_lease_and_a_recent_cycle(world: World) -> None:
    c = world.controller
    assert c.is_leader and not c.leading_now()  # no cycle completed yet
    world.cycle()
    assert c.leading_now()
    world.clock.t += c.config.lease_ttl_s + 1  # paused: no renewal, no cycle
    assert c.is_leader and not c.leading_now()
