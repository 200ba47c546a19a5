"""Goodput accounting in the control plane: the breakdown of a crashed-and-resumed job from
stored rows (exact numbers with a controlled clock), checkpoint timings arriving in reports,
the team total, the Young/Daly advice, /metrics and `tyard describe`."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tensoryard.cli.jobs import _goodput_lines
from tensoryard.runtime.goodput import young_daly_interval
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.server.summary import summarize
from tensoryard.spec.job import JobSpec
from tensoryard.spec.states import JobState
from tensoryard.store import Store


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


def rows(steps: range, first_end: float, step_s: float = 1.0) -> list[dict[str, Any]]:
    return [
        {"step": s, "ts": first_end + i * step_s, "step_time_s": step_s, "values": {"loss": 1.0}}
        for i, s in enumerate(steps)
    ]


def crash_and_resume(store: Store, clock: Clock, tmp_path: Path, *, hung: bool) -> int:
    """Submitted at 1000; attempt 1 runs 1010-1030 (steps 1-8 from 1015, checkpoint at 5),
    crashes (or is stopped as hung); attempt 2 runs 1033-1045 resuming from 5 (steps 6-10)."""
    store.ensure_team("default")
    spec = JobSpec(name="gp", launcher="python", command=["x.py"])
    job = store.create_job(spec, run_dir_root=tmp_path)
    clock.t = 1010
    store.start_attempt(job.id, handle={})
    store.add_metrics(job.id, 1, rows(range(1, 9), 1016))
    store.add_checkpoint(job.id, 1, step=5, path="c5", ts=1020)
    store.update_attempt(job.id, 1, checkpoint_save_s=0.5, checkpoint_restore_s=0.0)
    clock.t = 1030
    reason = "hung: no step for 7s after step 8" if hung else "exit code 1"
    store.finish_attempt(job.id, 1, state="failed", reason=reason, exit_code=1)
    clock.t = 1033
    store.start_attempt(job.id, handle={}, resumed_from_step=5)
    store.add_metrics(job.id, 2, rows(range(6, 11), 1037))
    store.add_checkpoint(job.id, 2, step=10, path="c10", ts=1041)
    store.update_attempt(job.id, 2, checkpoint_save_s=0.25, checkpoint_restore_s=1.0)
    clock.t = 1045
    store.finish_attempt(job.id, 2, state="succeeded", reason="done", exit_code=0)
    return job.id


@pytest.mark.parametrize("hung", [False, True], ids=["a crash", "a hang"])
def test_the_breakdown_of_a_crashed_and_resumed_job_adds_up(
    sqlite_url: str, tmp_path: Path, hung: bool
) -> None:
    clock = Clock()
    with Store.open(sqlite_url, clock=clock) as store:
        job_id = crash_and_resume(store, clock, tmp_path, hung=hung)
        summary = summarize(store, job_id, now=datetime.fromtimestamp(2000, UTC))
    b = summary.breakdown
    assert b is not None
    assert (b.allocated_s, b.productive_s, b.lost_s) == (32.0, 10.0, 3.0)
    assert b.goodput == pytest.approx(10 / 32)
    assert (b.startup_s, b.checkpoint_save_s, b.checkpoint_restore_s) == (7.0, 0.75, 1.0)
    assert (b.queueing_s, b.restart_wait_s) == (10.0, 3.0)
    # attempt 1's last step ended at 1023; stopped as hung at 1030
    assert b.hang_s == (7.0 if hung else 0.0)
    assert b.other_s == pytest.approx(32 - 10 - 7 - 0.75 - 1 - 3 - b.hang_s)
    advice = summary.checkpoint_advice
    assert advice is not None
    expected = young_daly_interval(0.375, 32.0, step_s=1.0)  # 2 saves, 1 failure in 32s
    assert advice.save_s == 0.375 and advice.mtbf_s == 32.0
    assert advice.interval_steps == expected.interval_steps
    assert advice.current_interval_steps == 50 and advice.auto is False
    assert "1 failure(s)" in advice.source


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    cp = build_control_plane(ServerConfig(home=tmp_path / "home", cpu_slots=2))
    yield cp
    cp.store.close()


@pytest.fixture
def api(plane: ControlPlane) -> TestClient:
    # Not entered: no lifespan, so no controller launches the job behind the test's back.
    client = TestClient(plane.app())
    client.headers["Authorization"] = f"Bearer {plane.admin_token}"
    return client


def test_reported_checkpoint_timings_reach_the_summary_team_total_and_metrics(
    api: TestClient, plane: ControlPlane
) -> None:
    spec = {"name": "gp", "command": ["x.py"], "launcher": "python"}
    job = api.post("/api/v1/jobs", json={"spec": spec}).json()
    for state in (JobState.ADMITTED, JobState.STARTING):
        plane.store.transition(job["id"], state, reason="test")
    plane.store.start_attempt(job["id"], handle={})
    plane.store.mark_running(job["id"], 1, "test")
    token = plane.store.issue_job_token(job["id"], attempt=1)
    body = {
        "attempt": 1,
        "metrics": rows(range(1, 4), datetime.now(UTC).timestamp(), step_s=0.001),
        "checkpoints": [{"step": 2, "path": "c2", "ts": 1.0, "size_bytes": 10}],
        "timings": {"checkpoint_save_s": 0.4, "checkpoint_restore_s": 0.2},
    }
    hdr = {"Authorization": f"Bearer {token}"}
    for _ in range(2):  # cumulative values: a re-sent report changes nothing
        answer = api.post(f"/api/v1/jobs/{job['id']}/report", json=body, headers=hdr)
        assert answer.is_success, answer.text
    attempt = plane.store.get_attempt(job["id"], 1)
    assert (attempt.checkpoint_save_s, attempt.checkpoint_restore_s) == (0.4, 0.2)
    summary = api.get(f"/api/v1/jobs/{job['id']}/summary").json()
    b = summary["breakdown"]
    assert b["productive_s"] == pytest.approx(0.003) and b["checkpoint_save_s"] == 0.4
    assert b["checkpoint_restore_s"] == 0.2 and b["allocated_s"] > 0
    advice = summary["checkpoint_advice"]
    assert advice["save_s"] == 0.4 and "no failure" in advice["source"]
    team = api.get("/api/v1/teams/default/goodput").json()
    assert team["jobs"] == 1 and team["breakdown"]["checkpoint_save_s"] == 0.4
    scraped = text_string_to_metric_families(api.get("/metrics").text)
    samples = {
        (x.name, x.labels.get("kind")): x.value for family in scraped for x in family.samples
    }
    assert samples[("tyard_job_badput_seconds", "checkpoint_save")] == 0.4
    assert samples[("tyard_job_badput_seconds", "checkpoint_restore")] == 0.2
    assert samples[("tyard_job_productive_seconds", None)] == pytest.approx(0.003)
    assert 0 < samples[("tyard_job_allocated_goodput", None)] <= 1
    lines = _goodput_lines(summary)
    assert lines[0].startswith("goodput ") and "checkpoint save 0.4s" in lines[0]
    assert "Young/Daly suggests" in lines[1] and "set checkpoint.auto_interval" in lines[1]


def test_negative_timings_are_refused_naming_the_field(
    api: TestClient, plane: ControlPlane
) -> None:
    spec = {"name": "gp", "command": ["x.py"], "launcher": "python"}
    job = api.post("/api/v1/jobs", json={"spec": spec}).json()
    plane.store.start_attempt(job["id"], handle={})
    token = plane.store.issue_job_token(job["id"], attempt=1)
    body = {"attempt": 1, "timings": {"checkpoint_save_s": -1}}
    response = api.post(
        f"/api/v1/jobs/{job['id']}/report", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 422 and "checkpoint_save_s" in response.text
    assert plane.store.get_attempt(job["id"], 1).checkpoint_save_s is None


def test_the_goodput_of_an_unknown_team_is_404(api: TestClient) -> None:
    response = api.get("/api/v1/teams/nope/goodput")
    assert response.status_code == 404 and "nope" in response.text
