"""Events wake the loop: an executor that reports changes gets its named jobs reconciled at
once, the others only in the slow full pass (every `resync_interval_s`); one that reports
nothing keeps every attempt polled every cycle."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.unit.server.test_controller import Clock, ScriptedExecutor, World, make_controller
from tests.unit.server.test_controller import world as world  # the fixture

from tensoryard.executors.base import AttemptPhase, AttemptStatus, ReportsChanges
from tensoryard.executors.local.exits import ExitWatch
from tensoryard.server.control.pending import _COUNTS_REFRESH_S
from tensoryard.spec.states import JobState
from tensoryard.store import Store


class ReportingExecutor(ScriptedExecutor):
    """The scripted executor, counting polls per attempt key, that reports changes."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.polled: list[str] = []
        self.tell: Any = None

    def report_changes(self, changed: Any) -> bool:
        self.tell = changed
        return True

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        self.polled.append(handle["key"])
        return super().poll(handle)


@pytest.fixture
def events(migrated_sqlite_url: str, tmp_path: Path) -> World:
    clock = Clock()
    store = Store.open(migrated_sqlite_url, clock=clock.dt)
    store.ensure_team("default")
    executor = ReportingExecutor(store)
    controller = make_controller(store, executor, clock)
    assert isinstance(executor, ReportsChanges)
    controller._reconciler.events = executor.report_changes(controller.changed)
    assert controller.lead()
    return World(store, executor, clock, controller, tmp_path)


def test_between_full_passes_only_the_jobs_named_are_polled(events: World) -> None:
    executor = events.executor
    assert isinstance(executor, ReportingExecutor)
    a, b = events.submit("a"), events.submit("b")
    events.cycle(3, advance=0.1)
    assert events.state(a) is JobState.RUNNING and events.state(b) is JobState.RUNNING
    events.cycle(1, advance=3.0)  # a full pass: both polled
    executor.polled.clear()
    events.cycle(3, advance=0.1)
    assert executor.polled == []  # nothing named, nothing starting: no poll at all
    executor.finish(events.key(a), AttemptPhase.SUCCEEDED)
    executor.tell(a)
    events.cycle(1, advance=0.1)
    assert executor.polled == [events.key(a)]
    assert events.state(a) is JobState.SUCCEEDED
    # the slow full pass still looks at every attempt (a missed event is repaired there)
    executor.polled.clear()
    executor.finish(events.key(b), AttemptPhase.FAILED, "gone without an event")
    events.cycle(1, advance=0.1)
    assert executor.polled == []
    events.cycle(1, advance=2.5)
    assert executor.polled == [events.key(b)]
    assert events.state(b) is not JobState.RUNNING


def test_an_attempt_waiting_in_an_external_queue_waits_for_its_event(events: World) -> None:
    """A starting attempt is polled every cycle, unless its last poll found it waiting in an
    external queue (Kueue): then, like a running one, it waits for the watch event that its
    admission brings, or the full pass (which also checks its starting timeout)."""
    executor = events.executor
    assert isinstance(executor, ReportingExecutor)
    queued = AttemptStatus(AttemptPhase.STARTING, reason="waiting in Kueue", queued=True)
    executor.default = queued
    a, b = events.submit("a"), events.submit("b")
    events.cycle(2, advance=0.1)
    assert events.state(a) is JobState.STARTING and events.state(b) is JobState.STARTING
    events.cycle(1, advance=11.0)  # a full pass long after their last poll: both polled
    assert sorted(executor.polled[-2:]) == sorted([events.key(a), events.key(b)])
    executor.polled.clear()
    events.cycle(3, advance=0.1)
    assert executor.polled == []
    # a timed full pass leaves attempts seen queued within _QUEUED_RESYNC_S for a later one
    events.cycle(1, advance=3.0)
    assert executor.polled == []
    # b is admitted and its pods are starting: not queued any more, polled each cycle
    executor.statuses[events.key(b)] = [AttemptStatus(AttemptPhase.STARTING)]
    executor.tell(b)
    events.cycle(3, advance=0.1)
    assert executor.polled == [events.key(b)] * 3
    # a is admitted and runs: its watch event brings the poll that sees it
    executor.polled.clear()
    executor.statuses[events.key(a)] = [AttemptStatus(AttemptPhase.RUNNING)]
    executor.tell(a)
    events.cycle(1, advance=0.1)
    assert executor.polled.count(events.key(a)) == 1
    assert events.state(a) is JobState.RUNNING
    # a missed event is repaired by a full pass, within _QUEUED_RESYNC_S
    executor.statuses[events.key(b)] = [queued]
    events.cycle(1, advance=0.1)  # b polled (not known queued yet): queued again
    executor.polled.clear()
    executor.statuses[events.key(b)] = [AttemptStatus(AttemptPhase.RUNNING)]
    events.cycle(1, advance=2.5)  # a full pass, too soon after b's last poll
    assert events.key(b) not in executor.polled
    assert events.state(b) is JobState.STARTING
    events.cycle(1, advance=8.0)
    assert executor.polled.count(events.key(b)) == 1
    assert events.state(b) is JobState.RUNNING
    # a relist (a change the executor cannot name) polls every attempt, queued or not
    c = events.submit("c")
    events.cycle(2, advance=0.1)
    executor.polled.clear()
    executor.tell(None)
    events.cycle(1, advance=0.1)
    assert events.key(c) in executor.polled


def test_a_long_external_queue_is_polled_in_shares_oldest_first(
    events: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timed full pass polls a long queue's attempts a share at a time (resync_interval_s
    / _QUEUED_RESYNC_S of the queue), the longest unpolled first, so every one is looked at
    about every _QUEUED_RESYNC_S and no pass polls the whole queue."""
    from tensoryard.server.control import reconcile

    monkeypatch.setattr(reconcile, "_QUEUED_MIN_PER_PASS", 1)
    executor = events.executor
    assert isinstance(executor, ReportingExecutor)
    executor.default = AttemptStatus(AttemptPhase.STARTING, reason="in Kueue", queued=True)
    ids = [events.submit(f"j{i}") for i in range(4)]  # (the test world's node has 4 slots)
    events.cycle(2, advance=0.1)
    assert all(events.state(i) is JobState.STARTING for i in ids)
    seen: list[list[str]] = []
    for _ in range(9):  # full passes 2 s apart: 1 of the 4 each (2 s / 10 s of the queue)
        executor.polled.clear()
        events.cycle(1, advance=2.0)
        seen.append(list(executor.polled))
    assert seen[:4] == [[]] * 4  # polled within _QUEUED_RESYNC_S: left alone
    assert all(len(polled) == 1 for polled in seen[4:8])  # then one a pass, oldest first
    assert sorted(k for polled in seen[4:8] for k in polled) == sorted(events.key(i) for i in ids)
    assert seen[8] == []  # each was polled within the last 10 s


def test_an_unknown_change_polls_every_attempt(events: World) -> None:
    executor = events.executor
    assert isinstance(executor, ReportingExecutor)
    ids = [events.submit(f"j{i}") for i in range(3)]
    events.cycle(3, advance=0.1)
    events.cycle(1, advance=3.0)
    executor.polled.clear()
    executor.tell(None)
    events.cycle(1, advance=0.1)
    assert sorted(executor.polled) == sorted(events.key(i) for i in ids)


def test_without_events_every_attempt_is_polled_every_cycle(world: World) -> None:
    a = world.submit("a")
    world.cycle(3, advance=0.1)
    polls: list[str] = []
    real = world.executor.poll

    def counting(handle: dict[str, Any]) -> AttemptStatus:
        polls.append(handle["key"])
        return real(handle)

    world.executor.poll = counting  # type: ignore[method-assign]
    world.cycle(3, advance=0.1)
    assert polls == [world.key(a)] * 3


def test_the_exit_watch_names_the_job_whose_process_ended() -> None:
    told: list[int | None] = []
    done = threading.Event()

    def changed(job_id: int | None) -> None:
        told.append(job_id)
        done.set()

    watch = ExitWatch(changed)
    if not watch.enabled:  # Linux < 5.3: the loop polls instead; CI's kernel has them
        assert not os.environ.get("CI"), "pidfd_open is missing on this CI machine"
        pytest.skip("this kernel has no pidfds")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    watch.add(proc.pid, psutil.Process(proc.pid).create_time(), 42)
    watch.add(proc.pid, psutil.Process(proc.pid).create_time(), 42)  # once is enough
    assert watch.watching() == 1
    started = time.monotonic()
    assert done.wait(10)
    assert told == [42]
    assert time.monotonic() - started < 5
    proc.wait()
    assert watch.watching() == 0
    # a process that is gone already is not watched (its end is seen by the next poll)
    watch.add(proc.pid, 0.0, 43)
    assert watch.watching() == 0


def test_the_loop_does_not_read_back_the_reasons_it_just_wrote(world: World) -> None:
    """A deep backlog's reasons are rewritten hundreds a cycle; the refresh's query leaves out
    the rows the loop stamped itself (it holds them), and still reads anyone else's change."""
    ids = [world.submit(f"j{i}") for i in range(3)]
    index = world.controller._jobs
    index.refresh()  # the index holds them, PENDING (no scheduling pass ran)
    since = index._since
    assert since is not None
    written, stamp = world.store.set_pending_info([(i, "waiting for a test", None) for i in ids])
    assert sorted(written) == sorted(ids)
    for job_id in written:
        index.note_pending_info(job_id, "waiting for a test", None, stamp)
    assert index._own_stamps == {stamp}
    # the store's query: without the stamps every row written comes back, with them none
    everything, _ = world.store.jobs_changed_since(since, known={})
    assert sorted(j.id for j in everything) == sorted(ids)
    skipped, _ = world.store.jobs_changed_since(since, known={}, skip_stamps={stamp})
    assert skipped == []
    # another writer's change is read (its stamp is its own)
    world.clock.t += 0.001  # (one equal to the loop's to the microsecond waits for the full check)
    world.store.request_cancel(ids[0])
    changed, _ = world.store.jobs_changed_since(since, known={}, skip_stamps=index._own_stamps)
    assert [j.id for j in changed] == [ids[0]]
    index.refresh()
    assert ids[0] in index.cancel_requested


def test_a_deep_backlogs_reasons_are_read_in_turns(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above _ALL_REASONS_BELOW pending jobs a pass reads the reasons of the jobs it visited
    or that changed and the next turn of the backlog, so each is written within a few passes
    and no single pass renders them all."""
    from tensoryard.server.control import schedule

    monkeypatch.setattr(schedule, "_ALL_REASONS_BELOW", 10)
    ids = [world.submit(f"j{i}", resources={"cpu": 3}) for i in range(25)]
    written: list[int] = []
    real = world.controller._pending.decided

    def counting(job: Any, reason: str, eta_s: float | None, now: float) -> None:
        written.append(job.id)
        real(job, reason, eta_s, now)

    world.controller._pending.decided = counting  # type: ignore[method-assign]
    world.cycle(1)  # every job is new: each one's first reason is read
    waiting = [i for i in ids if world.state(i) is JobState.PENDING]
    assert len(waiting) == 24 and sorted(written) == sorted(waiting)
    assert all(world.store.get_job(i).pending_reason for i in waiting)
    turns = []
    for _ in range(3):  # passes every reschedule_interval_s: a turn of 10 (+ the visited)
        written.clear()
        world.cycle(1, advance=31.0)
        assert 0 < len(written) < 24  # (the last turn of a round is shorter)
        turns.append(set(written))
    assert set().union(*turns) == set(waiting)  # all read again within three turns


def _one_job_reasons(store: Store, tmp_path: Path) -> tuple[int, Callable[[str, float], str]]:
    """One pending job and `decide(reason, now)`: the scheduler decides `reason` at `now`, the
    pass writes what is queued, and the stored reason comes back."""
    from tensoryard.server.control.index import JobIndex
    from tensoryard.server.control.pending import PendingReasons
    from tensoryard.spec.job import JobSpec

    store.ensure_team("default")
    (job,) = store.create_jobs([JobSpec(name="j", command=["x.py"])], run_dir_root=tmp_path)
    index = JobIndex(store, clock=lambda: 0.0)
    reasons = PendingReasons(store=store, index=index)
    index.put(store.get_job(job.id))

    def decide(reason: str, now: float) -> str:
        reasons.decided(index.jobs.get(job.id) or store.get_job(job.id), reason, None, now)
        reasons.write()
        return store.get_job(job.id).pending_reason

    return job.id, decide


def test_a_reason_whose_counts_alone_moved_is_rewritten_at_most_every_refresh(
    store: Store, tmp_path: Path
) -> None:
    """A deep backlog's counts ("24 more held for the head of line") move at every pass:
    rewriting them all each pass was a fifth of the loop at 2,000 pending and an event per
    job per pass. A counts-only change waits `_COUNTS_REFRESH_S`; a reason that says
    something new, or a moved estimate, is written at the next pass."""
    job_id, decide = _one_job_reasons(store, tmp_path)
    refresh = _COUNTS_REFRESH_S
    decide("only 0 GPUs are free (24 more held for the head of line)", 100.0)
    shown = decide("only 0 GPUs are free (40 more held for the head of line)", 101.0)  # counts
    assert shown.endswith("(24 more held for the head of line)")
    shown = decide("only 0 GPUs are free (8 more held for the head of line)", 100.0 + refresh)
    assert shown.endswith("(8 more held for the head of line)")
    shown = decide("quota of team default is used up (16 of 16 GPUs)", 101.0 + refresh)  # new
    assert shown.startswith("quota of team default")
    messages = [e.message for e in store.list_events(job_id) if e.kind == "pending"]
    assert len(messages) == 2  # the first reason and the new gist; no event for counts
    assert messages[0].endswith("(24 more held for the head of line)")
    assert messages[1].startswith("quota of team default")


def test_a_reason_that_flips_back_within_the_refresh_is_not_rewritten(
    store: Store, tmp_path: Path
) -> None:
    """A full queue's waiting jobs flip between two reasons as slots free and fill within a
    second ("queue default uses 256 of its 256" <-> "only 0 GPUs are free"): each flip was an
    UPDATE and an event per job per pass. Going back to the reason before the last change
    waits `_COUNTS_REFRESH_S`; a third reason is written at once."""
    job_id, decide = _one_job_reasons(store, tmp_path)
    refresh = _COUNTS_REFRESH_S
    full, busy = "queue default uses 256 of its 256", "only 0 GPUs are free, no placement fits"
    assert decide(full, 100.0) == full
    assert decide(busy, 100.5) == busy  # a new reason: at once
    assert decide(full, 101.0) == busy  # back to the one before: waits
    assert decide(busy, 101.5) == busy
    assert decide(full, 102.0) == busy
    assert decide(full, 100.5 + refresh) == full  # the refresh is up: written
    assert decide("team default's quota is used up", 100.6 + refresh).startswith("team default")
    messages = [e.message for e in store.list_events(job_id) if e.kind == "pending"]
    assert messages == [full, busy, full, "team default's quota is used up"]
