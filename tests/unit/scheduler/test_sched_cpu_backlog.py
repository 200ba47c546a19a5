"""A deep backlog of CPU-only work behind a full cluster (the embedded default's case): the
cycle stops visiting a queue once no node has the CPU any job left in it needs, and the
waiting jobs' reasons are the same as when every job was visited."""

from __future__ import annotations

import pytest

from tensoryard.scheduler import Node, Placement, Scheduler, Snapshot, Workload, core
from tensoryard.spec.queue import QueueSpec, QuotaConfig


@pytest.fixture
def visits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Ids of the workloads the cycle visited, in order."""
    seen: list[str] = []
    real = core._visit

    def counting(st: object, w: Workload, line: object, position: int) -> bool:
        seen.append(w.id)
        return real(st, w, line, position)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "_visit", counting)
    return seen


def _snapshot(n: int, free_cpu: float = 0.0, estimate_s: float = 7200) -> Snapshot:
    node = Node("n", cpu_total=4.0, mem_total=64 * 2**30)
    held = 4.0 - free_cpu
    running = Workload(
        id="r",
        queue="default",
        cpu_per_node=held,
        submit_time=0.0,
        runtime_estimate_s=3600,
        placement=Placement(None, {"n": ()}, cpu_per_node=held),
        start_time=1.0,
        preemptible=False,
    )
    pending = tuple(
        Workload(
            id=f"p{i}",
            queue="default",
            cpu_per_node=2.0 if i % 3 == 0 else 1.0,
            submit_time=10.0 + i,
            runtime_estimate_s=estimate_s,
        )
        for i in range(n)
    )
    quotas = QuotaConfig.build([QueueSpec(name="default")])
    return Snapshot(nodes=(node,), pending=pending, running=(running,), quotas=quotas)


def test_full_cluster_closes_a_cpu_queue_after_the_head(visits: list[str]) -> None:
    decisions = Scheduler().schedule(_snapshot(5000), 1000.0)
    assert not decisions.admissions
    # the head reserves the node, the next one fails and closes the queue: 2 visits, not 5000
    assert visits == ["p0", "p1"]
    info = decisions.pending.get("p1")
    assert info is not None and info.code == "capacity" and info.position == 1
    last = decisions.pending.get("p4999")
    assert last is not None and last.code == "capacity" and last.position == 4999
    assert "no node has that much free" in last.reason


def test_free_cpu_keeps_the_queue_open_for_jobs_that_fit(visits: list[str]) -> None:
    # 1 core free: the 2-core head cannot start (it reserves the node), but 1-core jobs short
    # enough to backfill could, so the queue stays open past the head; the next one is admitted
    decisions = Scheduler().schedule(_snapshot(7, free_cpu=1.0, estimate_s=60), 1000.0)
    assert [a.workload_id for a in decisions.admissions] == ["p1"]
    assert visits[:2] == ["p0", "p1"]
    # with the core taken, nothing left fits: the queue closes at the next failure
    assert len(visits) == 3


def test_reasons_match_a_visit_of_every_job() -> None:
    """The reasons of the jobs the closed queue never visited read as a visited job's do."""
    snap = _snapshot(40)
    closed = Scheduler().schedule(snap, 1000.0)
    for i in range(1, 40):
        info = closed.pending.get(f"p{i}")
        assert info is not None
        assert info.code == "capacity"
        assert info.position == i
        assert info.details["cpu_per_node"] == (2.0 if i % 3 == 0 else 1.0)
