"""Concurrent writers on both backends: nothing lost, nothing duplicated, no double transition."""

from __future__ import annotations

import multiprocessing
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from alembic import command

from tensoryard.errors import Conflict
from tensoryard.spec import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import Store
from tensoryard.store._db import alembic_config, head_revision

S = JobState
R = TypeVar("R")
THREADS = 8
JOBS_PER_WORKER = 10


def spec(name: str) -> JobSpec:
    return JobSpec(name=name, command=["train.py"])


def in_parallel(workers: int, fn: Callable[[int, threading.Barrier], R]) -> list[R]:
    """Run fn(i, barrier) on `workers` threads that start together; return their results."""
    barrier = threading.Barrier(workers)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda i: fn(i, barrier), range(workers)))


def race_transitions(store: Store, job_ids: list[int], seed: int, to: S, frm: S) -> list[int]:
    """Try to move every job; return the ids this worker won."""
    order = list(job_ids)
    random.Random(seed).shuffle(order)
    won = []
    for job_id in order:
        try:
            store.transition(job_id, to, reason=f"worker {seed}", expected=[frm])
            won.append(job_id)
        except Conflict:
            pass
    return won


def assert_each_won_once(
    store: Store, job_ids: list[int], winners: list[int], frm: S, to: S
) -> None:
    assert Counter(winners) == Counter(job_ids), "every job must move exactly once"
    for job_id in job_ids:
        assert store.get_job(job_id).state is to
        moves = [e for e in store.list_events(job_id) if e.message.startswith(f"{frm} -> {to}:")]
        assert len(moves) == 1


def test_threads_submitting_and_racing_transitions_lose_and_duplicate_nothing(store: Store) -> None:
    store.ensure_team("default")

    def submit_many(worker: int, barrier: threading.Barrier) -> list[int]:
        barrier.wait()
        store.ensure_team("raced")  # every thread creates the same team at once
        return [
            store.create_job(spec(f"w{worker}-{i}"), run_dir_root=Path("/r")).id
            for i in range(JOBS_PER_WORKER)
        ]

    ids = [job_id for batch in in_parallel(THREADS, submit_many) for job_id in batch]
    assert [t.name for t in store.list_teams()] == ["default", "raced"]
    assert len(ids) == len(set(ids)) == THREADS * JOBS_PER_WORKER
    page = store.list_jobs(limit=1000, newest_first=False)
    assert page.total == len(ids) and sorted(ids) == [j.id for j in page.items]
    assert sorted({j.name for j in page.items}) == sorted(
        f"w{w}-{i}" for w in range(THREADS) for i in range(JOBS_PER_WORKER)
    )
    assert all(j.run_dir == f"/r/job-{j.id}" for j in page.items)

    def admit(worker: int, barrier: threading.Barrier) -> list[int]:
        barrier.wait()
        return race_transitions(store, ids, worker, S.ADMITTED, S.PENDING)

    winners = [j for batch in in_parallel(THREADS, admit) for j in batch]
    assert_each_won_once(store, ids, winners, S.PENDING, S.ADMITTED)


def test_concurrent_attempts_metrics_and_events_on_one_job_stay_consistent(store: Store) -> None:
    store.ensure_team("default")
    job_id = store.create_job(spec("one"), run_dir_root=Path("/r")).id
    per_worker = 5

    def work(worker: int, barrier: threading.Barrier) -> tuple[list[int], int, list[int]]:
        barrier.wait()
        numbers = [
            store.start_attempt(job_id, handle={"w": worker}).number for _ in range(per_worker)
        ]
        # Every worker re-sends overlapping steps 0..29 of attempt 1.
        rows = [{"step": s, "ts": float(s), "values": {"loss": 1.0}} for s in range(30)]
        random.Random(worker).shuffle(rows)
        inserted = sum(store.add_metrics(job_id, 1, rows[i : i + 7]) for i in range(0, 30, 7))
        events = [store.add_event(job_id, "runtime", f"{worker}-{i}").id for i in range(per_worker)]
        return numbers, inserted, events

    # A follower tails the events the whole time, as `tyard describe --follow` would.
    followed: list[int] = []
    writers_done = threading.Event()

    def follow() -> None:
        while True:
            last_round = writers_done.is_set()
            batch = store.list_events(job_id, after_id=followed[-1] if followed else 0)
            followed.extend(e.id for e in batch)
            if last_round:
                return
            time.sleep(0.005)

    follower = threading.Thread(target=follow)
    follower.start()
    results = in_parallel(THREADS, work)
    writers_done.set()
    follower.join(60)
    numbers = sorted(n for r in results for n in r[0])
    assert numbers == list(range(1, THREADS * per_worker + 1))
    assert store.get_job(job_id).attempts == THREADS * per_worker
    assert sum(r[1] for r in results) == 30
    assert [m.step for m in store.list_metrics(job_id)] == list(range(30))
    event_ids = [e for r in results for e in r[2]]
    assert len(set(event_ids)) == len(event_ids)
    listed = [e.id for e in store.list_events(job_id)]
    assert set(event_ids) < set(listed)
    assert followed == listed, "tailing by after_id must never skip an event"


def test_a_transition_waits_for_a_concurrent_writer_and_then_sees_its_change(
    store: Store,
) -> None:
    """Compare-and-set under a row lock: the loser re-reads the winner's state, never overwrites."""
    store.ensure_team("default")
    job_id = store.create_job(spec("cas"), run_dir_root=Path("/r")).id
    holder = _hold_write_lock_and_admit(store, job_id)
    outcome: dict[str, Any] = {}

    def contender() -> None:
        try:
            store.transition(job_id, S.ADMITTED, reason="late", expected=[S.PENDING])
            outcome["result"] = "moved"
        except Conflict as exc:
            outcome["result"] = str(exc)

    thread = threading.Thread(target=contender)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive(), "the contender must wait for the lock holder"
    holder()  # commit the competing change
    thread.join(30)
    assert "is ADMITTED, not PENDING" in outcome["result"]
    assert [e.message for e in store.list_events(job_id)][-1] == "PENDING -> ADMITTED: first"


def _hold_write_lock_and_admit(store: Store, job_id: int) -> Callable[[], None]:
    """Change the job outside the store, holding the lock; return a function that commits."""
    insert_event = (
        "INSERT INTO events (job_id, ts, kind, message) "
        f"VALUES ({job_id}, CURRENT_TIMESTAMP, 'state', 'PENDING -> ADMITTED: first')"
    )
    if store.dialect == "sqlite":
        path = sa.make_url(store.url).database
        raw = sqlite3.connect(str(path), isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")
        raw.execute(f"UPDATE jobs SET state = 'ADMITTED' WHERE id = {job_id}")
        raw.execute(insert_event)

        def commit_sqlite() -> None:
            raw.execute("COMMIT")
            raw.close()

        return commit_sqlite
    conn = store.engine.connect()
    tx = conn.begin()
    conn.exec_driver_sql(f"SELECT id FROM jobs WHERE id = {job_id} FOR UPDATE")
    conn.exec_driver_sql(f"UPDATE jobs SET state = 'ADMITTED' WHERE id = {job_id}")
    conn.exec_driver_sql(insert_event)

    def commit_pg() -> None:
        tx.commit()
        conn.close()

    return commit_pg


# -- separate processes ------------------------------------------------------------------------

PROCESSES = 3


def _process_open(url: str) -> str:
    Store.open(url).close()
    return "ok"


def _process_submit_and_race(args: tuple[str, int, list[int]]) -> tuple[list[int], list[int]]:
    url, worker, shared_ids = args
    store = Store.open(url)
    try:
        mine = [
            store.create_job(spec(f"p{worker}-{i}"), run_dir_root=Path("/r")).id
            for i in range(JOBS_PER_WORKER)
        ]
        won = race_transitions(store, shared_ids, worker, S.ADMITTED, S.PENDING)
        return mine, won
    finally:
        store.close()


@pytest.mark.slow
def test_processes_migrating_submitting_and_racing_together_lose_and_duplicate_nothing(
    store: Store,
) -> None:
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    # Fork (cheap: no re-import) with no pooled connection open for the children to inherit.
    store.engine.dispose()
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(PROCESSES, mp_context=ctx) as pool:
        # 1. Every process opens the empty database at once: it is migrated exactly once.
        assert list(pool.map(_process_open, [store.url] * PROCESSES)) == ["ok"] * PROCESSES
        with store.engine.connect() as conn:
            versions = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
        assert versions == [(head_revision(),)]
        # 2. They submit their own jobs while racing to admit the shared ones.
        store.ensure_team("default")
        shared = [store.create_job(spec(f"s{i}"), run_dir_root=Path("/r")).id for i in range(20)]
        work = [(store.url, w, shared) for w in range(PROCESSES)]
        results = list(pool.map(_process_submit_and_race, work))
    submitted = [j for r in results for j in r[0]]
    assert len(set(submitted)) == len(submitted) == PROCESSES * JOBS_PER_WORKER
    assert store.list_jobs(limit=1000).total == len(shared) + len(submitted)
    assert_each_won_once(store, shared, [j for r in results for j in r[1]], S.PENDING, S.ADMITTED)
