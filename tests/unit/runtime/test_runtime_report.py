"""Reporter: durable jsonl, batched POSTs to a real local server, retries, cost per call."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime.report import Reporter, ReporterConfig
from tensoryard.runtime.testing import RecordingReportServer

FAST = {"flush_interval_s": 0.05, "backoff_initial_s": 0.05, "backoff_max_s": 0.2}


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def server() -> Iterator[RecordingReportServer]:
    with RecordingReportServer() as srv:
        yield srv


def online(tmp_path: Path, server: RecordingReportServer, **overrides: Any) -> ReporterConfig:
    settings: dict[str, Any] = {**FAST, **overrides}
    return ReporterConfig(
        job_id="42",
        attempt=2,
        run_dir=tmp_path,
        server_url=server.url,
        token="secret",
        heartbeat_s=settings.pop("heartbeat_s", 5.0),
        **settings,
    )


def test_offline_reporting_writes_every_row_to_the_attempt_jsonl(tmp_path: Path) -> None:
    reporter = Reporter(ReporterConfig(attempt=3, run_dir=tmp_path))
    assert not reporter.online
    for step in range(1, 4):
        reporter.report(step, step_time_s=0.5, loss=4.0 - step, tokens=np.int64(64))
    reporter.close()
    rows = read_jsonl(tmp_path / "attempt-3" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["values"] == {"loss": 3.0, "tokens": 64.0}
    assert rows[0]["step_time_s"] == 0.5 and rows[0]["ts"] > 1e9


def test_rows_reach_the_server_in_batches_with_the_job_token(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    reporter = Reporter(online(tmp_path, server, max_batch=40, flush_interval_s=0.3))
    for step in range(1, 101):
        reporter.report(step, loss=1.0 / step)
    assert reporter.flush(10)
    reporter.close()
    assert [r["step"] for r in server.metric_rows()] == list(range(1, 101))
    batches = [len(req.body["metrics"]) for req in server.requests if req.body["metrics"]]
    assert max(batches) <= 40 and len(batches) < 100
    request = server.requests[0]
    assert request.path == "/api/v1/jobs/42/report"
    assert request.authorization == "Bearer secret"
    assert request.body["attempt"] == 2 and request.body["heartbeat_at"] > 1e9


def test_rows_reported_while_the_server_is_down_arrive_once_it_is_back(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    server.stop()
    reporter = Reporter(online(tmp_path, server))
    for step in range(1, 51):
        reporter.report(step, loss=float(step))
    time.sleep(0.5)  # several failed attempts with backoff
    assert reporter.failed_requests >= 2
    server.start()
    wait_until(lambda: len(server.metric_rows()) == 50)
    reporter.close()
    assert [r["step"] for r in server.metric_rows()] == list(range(1, 51))
    assert len(read_jsonl(tmp_path / "attempt-2" / "metrics.jsonl")) == 50


def test_server_errors_are_retried_without_losing_rows(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    server.fail_with(503)
    reporter = Reporter(online(tmp_path, server))
    reporter.report(1, loss=1.0)
    wait_until(lambda: reporter.failed_requests >= 2)
    server.fail_with(None)
    reporter.report(2, loss=2.0)
    wait_until(lambda: len(server.metric_rows()) == 2)
    reporter.close()
    assert [r["step"] for r in server.metric_rows()] == [1, 2]


def test_a_request_the_server_rejects_for_good_is_dropped_not_retried_forever(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    server.fail_with(422)
    reporter = Reporter(online(tmp_path, server))
    wait_until(lambda: reporter.failed_requests >= 1)  # the start-up heartbeat
    reporter.report(1, loss=1.0)
    wait_until(lambda: reporter.failed_requests >= 2)
    server.fail_with(None)
    reporter.report(2, loss=2.0)
    assert reporter.flush(5)
    reporter.close()
    assert [r["step"] for r in server.metric_rows()] == [2]
    assert len(read_jsonl(tmp_path / "attempt-2" / "metrics.jsonl")) == 2


def test_an_overflowing_queue_keeps_the_newest_rows_and_says_so(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    server.stop()
    reporter = Reporter(online(tmp_path, server, max_queue=10, max_batch=100))
    for step in range(1, 26):
        reporter.report(step, loss=float(step))
    assert reporter.dropped_rows >= 15
    server.start()
    wait_until(lambda: bool(server.metric_rows()) and server.metric_rows()[-1]["step"] == 25)
    reporter.close()
    steps = [r["step"] for r in server.metric_rows()]
    assert steps == sorted(steps) and steps[-1] == 25 and len(steps) <= 10
    events = [e["message"] for req in server.requests for e in req.body["events"]]
    assert any("dropped" in m and "metrics.jsonl" in m for m in events)
    assert len(read_jsonl(tmp_path / "attempt-2" / "metrics.jsonl")) == 25


def test_heartbeats_are_sent_without_new_rows(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    reporter = Reporter(online(tmp_path, server, heartbeat_s=0.1))
    wait_until(lambda: len(server.requests) >= 3)
    reporter.close()
    beats = [req.body["heartbeat_at"] for req in server.requests]
    assert beats == sorted(beats)
    assert all(req.body["metrics"] == [] for req in server.requests)


def test_resumed_from_step_is_sent_once_with_checkpoints_and_events(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    reporter = Reporter(online(tmp_path, server, heartbeat_s=0.1))
    reporter.set_resumed_from(100)
    reporter.checkpoint(150, "/ckpt/step-150", 1234, ts=5.0)
    reporter.report(101, loss=1.0)
    assert reporter.flush(5)
    wait_until(lambda: len(server.requests) >= 3)  # later heartbeats
    reporter.close()
    bodies = [req.body for req in server.requests]
    resumed = [b["resumed_from_step"] for b in bodies if "resumed_from_step" in b]
    assert resumed == [100]
    checkpoints = [c for b in bodies for c in b["checkpoints"]]
    assert checkpoints == [{"step": 150, "path": "/ckpt/step-150", "ts": 5.0, "size_bytes": 1234}]
    events = [e for b in bodies for e in b["events"]]
    assert {"kind": "runtime", "message": "resumed from step 100"} in events


def test_a_fresh_start_sends_a_null_resume_step_once(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    reporter = Reporter(online(tmp_path, server))
    reporter.set_resumed_from(None)
    assert reporter.flush(5)
    reporter.close()
    resumed = [
        r.body["resumed_from_step"] for r in server.requests if "resumed_from_step" in r.body
    ]
    assert resumed == [None]


def test_the_server_can_ask_the_job_to_cancel(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    reporter = Reporter(online(tmp_path, server, heartbeat_s=0.1))
    assert not reporter.cancel_requested
    server.set_cancel(True)
    wait_until(lambda: reporter.cancel_requested)
    reporter.close()


def test_only_rank_zero_writes_or_sends(tmp_path: Path, server: RecordingReportServer) -> None:
    reporter = Reporter(online(tmp_path, server), rank=1)
    reporter.report(1, loss=1.0)
    reporter.set_resumed_from(3)
    reporter.close()
    assert not reporter.online
    assert not (tmp_path / "attempt-2").exists()
    assert server.requests == []


def test_a_report_call_costs_microseconds(tmp_path: Path, server: RecordingReportServer) -> None:
    reporter = Reporter(online(tmp_path, server, flush_interval_s=0.01))
    costs = []
    for step in range(2000):
        start = time.perf_counter()
        reporter.report(step, loss=1.2345, lr=3e-4, grad_norm=0.5)
        costs.append(time.perf_counter() - start)
    reporter.close()
    median_us = statistics.median(costs) * 1e6
    print(f"report() median {median_us:.1f} us, p99 {sorted(costs)[1980] * 1e6:.1f} us")
    assert median_us < 200  # typically ~10 us; generous for a busy shared machine
    assert len(server.metric_rows()) == 2000


def test_close_gives_up_after_its_timeout_when_the_server_stays_down(tmp_path: Path) -> None:
    config = ReporterConfig(
        job_id="1",
        run_dir=tmp_path,
        server_url="http://127.0.0.1:9",  # the discard port: nothing listens
        close_timeout_s=0.3,
        backoff_initial_s=0.05,
    )
    reporter = Reporter(config)
    reporter.report(1, loss=1.0)
    start = time.monotonic()
    reporter.close()
    assert time.monotonic() - start < 3
    assert len(read_jsonl(tmp_path / "attempt-1" / "metrics.jsonl")) == 1


def test_config_comes_from_the_contract_environment(tmp_path: Path) -> None:
    env = {
        "TYARD_JOB_ID": "9",
        "TYARD_ATTEMPT": "4",
        "TYARD_RUN_DIR": str(tmp_path),
        "TYARD_SERVER_URL": "http://cp:8642/",
        "TYARD_JOB_TOKEN": "t",
        "TYARD_HEARTBEAT_S": "2.5",
    }
    config = ReporterConfig.from_env(env)
    assert config.report_url == "http://cp:8642/api/v1/jobs/9/report"
    assert config.metrics_path == tmp_path / "attempt-4" / "metrics.jsonl"
    assert (config.token, config.heartbeat_s) == ("t", 2.5)
    assert ReporterConfig.from_env({}).report_url is None


def test_a_metric_that_is_not_a_number_is_refused_with_a_fix(tmp_path: Path) -> None:
    reporter = Reporter(ReporterConfig(run_dir=tmp_path))
    with pytest.raises(RuntimeSetupError, match=r"metric 'phase'='warmup' is not a number"):
        reporter.report(1, phase="warmup")
    reporter.close()


def test_a_bad_heartbeat_period_names_the_variable() -> None:
    with pytest.raises(RuntimeSetupError, match="TYARD_HEARTBEAT_S"):
        ReporterConfig.from_env({"TYARD_HEARTBEAT_S": "soon"})


def test_checkpoint_timings_survive_a_failed_send_and_the_newest_values_win(
    tmp_path: Path, server: RecordingReportServer
) -> None:
    server.fail_with(503)
    reporter = Reporter(online(tmp_path, server))
    reporter.set_timings(checkpoint_save_s=0.5, checkpoint_restore_s=0.1)
    reporter.report(1, step_time_s=0.1, loss=1.0)
    wait_until(lambda: reporter.failed_requests >= 1)  # refused: put back for the next try
    server.fail_with(None)
    assert reporter.flush(5)
    reporter.set_timings(checkpoint_save_s=0.75, checkpoint_restore_s=0.1)
    assert reporter.flush(5)
    reporter.close()
    sent = [r.body["timings"]["checkpoint_save_s"] for r in server.requests if "timings" in r.body]
    assert sent[0] == 0.5 and sent[-1] == 0.75


@pytest.mark.parametrize(
    ("env", "numbers"),
    [
        ({"TYARD_ATTEMPT": "3"}, (3, None)),
        # numbered by the local executor's rank wrapper already
        ({"TYARD_ATTEMPT": "5", "TYARD_LAUNCH_ATTEMPT": "3", "TORCHELASTIC_RESTART_COUNT": "2"},
         (5, 3)),
        # a Kubernetes pod's torchrun restarted the workers; the control plane granted it
        ({"TYARD_ATTEMPT": "3", "TYARD_IN_PLACE_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "2"},
         (5, 3)),
        ({"TYARD_ATTEMPT": "3", "TYARD_IN_PLACE_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "0"},
         (3, None)),
        # plain torchrun --max-restarts without tensoryard's grant: one attempt throughout
        ({"TYARD_ATTEMPT": "1", "TORCHELASTIC_RESTART_COUNT": "4"}, (1, None)),
    ],
)  # fmt: skip
def test_a_worker_restarted_in_place_reports_as_the_next_attempt_of_its_launch(
    env: dict[str, str], numbers: tuple[int, int | None]
) -> None:
    config = ReporterConfig.from_env(env)
    assert (config.attempt, config.launch_attempt) == numbers


def test_a_bad_in_place_variable_is_a_setup_error_naming_it() -> None:
    env = {"TYARD_ATTEMPT": "1", "TYARD_IN_PLACE_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "x"}
    with pytest.raises(RuntimeSetupError, match="TORCHELASTIC_RESTART_COUNT"):
        ReporterConfig.from_env(env)
