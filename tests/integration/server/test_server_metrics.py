"""`GET /metrics`: the platform's Prometheus metrics, read back with prometheus_client's parser."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.server.metrics import restart_reason, team_gpus
from tensoryard.spec.states import JobState

GOOD = {"name": "tiny", "command": ["train.py"], "launcher": "python"}


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    cp = build_control_plane(ServerConfig(home=tmp_path / "home", cpu_slots=2))
    yield cp
    cp.store.close()


def scrape(api: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = api.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_need_a_platform_admin_token(plane: ControlPlane) -> None:
    with TestClient(plane.app()) as api:
        assert api.get("/metrics").status_code == 401


def test_the_scrape_shows_jobs_queues_admissions_and_a_running_jobs_progress(
    plane: ControlPlane,
) -> None:
    store = plane.store
    with TestClient(plane.app()) as api:
        api.headers["Authorization"] = f"Bearer {plane.admin_token}"
        ids = [
            api.post("/api/v1/jobs", json={"spec": {**GOOD, "resources": {"cpu": 2}}}).json()["id"]
            for _ in range(3)
        ]
        plane.controller.lead()
        plane.controller.cycle()  # admits one (2 CPU slots), the others wait
        running = next(i for i in ids if store.get_job(i).state is not JobState.PENDING)
        plane.controller.wait_idle()
        # Drive the admitted job to RUNNING through the store (the workload itself is not
        # the point here) and report steps as the runtime would.
        job = store.get_job(running)
        if job.state is JobState.STARTING:
            attempt = store.get_attempt(running, job.attempts)
            store.mark_running(running, attempt.number, "test")
        now = datetime.now(UTC).timestamp()
        rows = [
            {
                "step": s,
                "ts": now - 10 + s,
                "step_time_s": 0.01,
                "values": {"loss": 3.0 - s / 10, "tokens": 4096},
            }
            for s in range(1, 6)
        ]
        number = store.get_job(running).attempts
        store.add_metrics(running, number, rows)
        store.add_checkpoint(running, number, step=5, path="/ckpt/5", ts=now - 20)
        store.heartbeat(running, number, datetime.now(UTC))
        m = scrape(api)

    assert m[("tyard_jobs", (("state", "PENDING"), ("team", "default")))] == 2
    assert m[("tyard_queue_length", (("team", "default"),))] == 2
    assert m[("tyard_pending_eta_overdue_seconds", (("team", "default"),))] == 0
    assert m[("tyard_admissions_total", (("team", "default"),))] == 1
    assert m[("tyard_pending_seconds_count", (("team", "default"),))] == 1
    assert m[("tyard_scheduler_cycle_seconds_count", ())] >= 1
    key = (("job", str(running)), ("team", "default"))
    assert m[("tyard_job_loss", key)] == pytest.approx(2.5)
    assert m[("tyard_job_step_time_seconds", key)] == pytest.approx(1.0)
    assert m[("tyard_job_tokens_per_second", key)] == pytest.approx(409_600)
    assert 15 <= m[("tyard_job_last_checkpoint_age_seconds", key)] < 60
    assert 0 <= m[("tyard_job_heartbeat_age_seconds", key)] < 30
    assert 0 < m[("tyard_job_goodput", key)] <= 1
    # Bounded cardinality: only running jobs carry a job label.
    jobs_labelled = {dict(labels).get("job") for (_, labels) in m if dict(labels).get("job")}
    assert jobs_labelled == {str(running)}
    plane.controller.stop()


def test_team_gpus_split_borrowed_use_over_the_idle_quotas_that_lend_it() -> None:
    gpus = team_gpus({"a": 8, "b": 8, "c": 8}, {"a": 12, "b": 2, "c": 6})
    assert (gpus["a"].borrowed, gpus["a"].lent) == (4, 0)
    # b has 6 idle, c 2: the 4 borrowed GPUs are lent 3:1.
    assert gpus["b"].lent == pytest.approx(3) and gpus["c"].lent == pytest.approx(1)


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("preempted for job 4: ...", "preempted"),
        ("hung: no step for 400s", "hung"),
        ("did not start within 900s", "not-started"),
        ("launch of attempt 2 failed: no such file", "launch-failed"),
        ("the job supervisor (pid 4) is gone and left no exit record", "lost"),
        ("rank 1 exited with code 137", "failed"),
        ("node n3 drained: XID 79 on GPU 2", "node-drained"),
    ],
)
def test_restart_reasons_map_to_a_fixed_label_set(text: str, label: str) -> None:
    assert restart_reason(text) == label
