"""The console's store reads on SQLite and PostgreSQL: the queue in start order, a page at a
time, and the light change feed of the live view."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import Store


def _jobs(store: Store, tmp_path: Path, n: int, team: str = "nlp") -> list[int]:
    store.ensure_team(team)
    ids = []
    for i in range(n):
        spec = JobSpec.model_validate(
            {"name": f"j{i}", "team": team, "user": "ann", "command": ["x"], "priority": i % 2}
        )
        ids.append(store.create_job(spec, run_dir_root=tmp_path / "runs").id)
    return ids


def test_pending_jobs_come_in_start_order_a_page_at_a_time(store: Store, tmp_path: Path) -> None:
    a, b, c, d, e = _jobs(store, tmp_path, 5)
    now = store.now()
    store.set_pending_info(
        [(c, "quota", now + timedelta(minutes=1)), (a, "gang", now + timedelta(minutes=9))]
    )
    # known estimates first (soonest first), then priority 1 before 0, then the older job
    order = [c, a, b, d, e]
    first, total = store.queue_page(pending=True, limit=2)
    rest, _ = store.queue_page(pending=True, offset=2, limit=10)
    assert total == 5 and [j.id for j in first + rest] == order
    other = _jobs(store, tmp_path, 1, team="vision")
    assert [j.id for j in store.queue_page(pending=True, teams=["vision"])[0]] == other
    assert store.queue_page(pending=True, team="nlp", user="bob") == ([], 0)


def test_active_jobs_and_their_placements_are_listed_without_specs(
    store: Store, tmp_path: Path
) -> None:
    a, _b = _jobs(store, tmp_path, 2)
    store.transition(a, JobState.ADMITTED, reason="t", placement={"n1": [0, 1]})
    running, total = store.queue_page(pending=False)
    assert total == 1 and running[0].id == a
    assert store.active_placements() == [(a, "nlp", "ann", {"n1": [0, 1]})]


def test_the_change_feed_names_each_changed_job_with_its_team_and_state(
    store: Store, tmp_path: Path
) -> None:
    before = store.now() - timedelta(seconds=1)
    (a,) = _jobs(store, tmp_path, 1)
    rows, now = store.job_changes(before)
    assert [(i, t, s) for i, t, s, _ in rows] == [(a, "nlp", "PENDING")]
    store.request_cancel(a)
    later, _ = store.job_changes(now - timedelta(seconds=1))
    assert [i for i, *_ in later] == [a]
    assert store.job_changes(store.now() + timedelta(seconds=5))[0] == []
