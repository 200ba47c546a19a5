"""session(): dist init, resume, checkpoints every interval, cancel and SIGTERM stops."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime import Session, init, session
from tensoryard.runtime.testing import RecordingReportServer


def job_env(tmp_path: Path, attempt: int = 1, **extra: str) -> dict[str, str]:
    return {
        "TYARD_JOB_ID": "5",
        "TYARD_ATTEMPT": str(attempt),
        "TYARD_RUN_DIR": str(tmp_path / "run"),
        "TYARD_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "TYARD_CHECKPOINT_INTERVAL": "4",
        "TYARD_CHECKPOINT_KEEP": "2",
        **extra,
    }


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def run(sess: Session, steps: int) -> list[int]:
    model, opt = build()
    done = []
    for step in sess.loop(steps, model, opt):
        loss = (model(torch.ones(2, 4)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sess.report(step, loss=loss.item())
        done.append(step)
    return done


def metric_steps(tmp_path: Path, attempt: int) -> list[int]:
    path = tmp_path / "run" / f"attempt-{attempt}" / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_session_checkpoints_every_interval_and_at_the_end(tmp_path: Path) -> None:
    with session(env=job_env(tmp_path)) as sess:
        assert not sess.dist.is_distributed and sess.dist.is_main
        assert run(sess, 10) == list(range(1, 11))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "step-000000008",
        "step-000000010",
    ]
    assert metric_steps(tmp_path, 1) == list(range(1, 11))
    assert sess.goodput.estimate().steps == 10


def test_a_new_attempt_resumes_after_the_last_checkpoint(tmp_path: Path) -> None:
    with session(env=job_env(tmp_path), final_checkpoint=False) as sess:
        run(sess, 6)
    with session(env=job_env(tmp_path, attempt=2)) as sess:
        assert run(sess, 10) == [5, 6, 7, 8, 9, 10]
        assert sess.resumed_from == 4
    assert metric_steps(tmp_path, 2) == [5, 6, 7, 8, 9, 10]


def test_step_time_is_measured_from_the_step_start_to_report(tmp_path: Path) -> None:
    with session(env=job_env(tmp_path)) as sess:
        model, opt = build()
        for step in sess.loop(2, model, opt):
            time.sleep(0.05)
            sess.report(step, loss=1.0)
            time.sleep(0.2)  # after report: not part of the step time
    path = tmp_path / "run" / "attempt-1" / "metrics.jsonl"
    times = [json.loads(line)["step_time_s"] for line in path.read_text().splitlines()]
    assert all(0.05 <= t < 0.2 for t in times)


def test_a_cancel_from_the_control_plane_stops_the_loop_after_a_checkpoint(
    tmp_path: Path,
) -> None:
    with RecordingReportServer() as server:
        server.set_cancel(True)
        env = job_env(tmp_path, TYARD_SERVER_URL=server.url, TYARD_HEARTBEAT_S="0.05")
        with session(env=env, stop_check_every=1) as sess:
            model, opt = build()
            steps = []
            for step in sess.loop(1000, model, opt):
                steps.append(step)
                time.sleep(0.01)
        assert sess.stopped and len(steps) < 1000
        assert (tmp_path / "ckpt" / f"step-{steps[-1]:09d}").is_dir()
        events = [e["message"] for r in server.requests for e in r.body["events"]]
        assert any(m.startswith(f"stopped at step {steps[-1]}") for m in events)
        assert any(r.body.get("checkpoints") for r in server.requests)


def test_sigterm_stops_the_loop_after_a_checkpoint_and_restores_the_handler(
    tmp_path: Path,
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with session(env=job_env(tmp_path), stop_check_every=1) as sess:
        model, opt = build()
        for step in sess.loop(100, model, opt):
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
    assert sess.stopped
    assert (tmp_path / "ckpt" / "step-000000003").is_dir()
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_error_in_training_is_reported_as_an_event(tmp_path: Path) -> None:
    with RecordingReportServer() as server:
        env = job_env(tmp_path, TYARD_SERVER_URL=server.url)
        with pytest.raises(ValueError, match="boom"), session(env=env) as sess:
            sess.reporter.set_resumed_from(None)
            raise ValueError("boom")
        kinds = [(e["kind"], e["message"]) for r in server.requests for e in r.body["events"]]
        assert ("error", "training failed: ValueError: boom") in kinds


def test_a_sigterm_during_a_failing_ranks_last_flush_waits_until_the_error_is_sent(
    tmp_path: Path,
) -> None:
    # torchrun SIGTERMs every rank once one has failed; a rank that fails too must still get
    # its own error out before the signal acts (it used to die mid-flush, error lost).
    error = ("error", "training failed: ValueError: boom")
    with RecordingReportServer() as server:

        def sent() -> list[tuple[str, str]]:
            return [(e["kind"], e["message"]) for r in server.requests for e in r.body["events"]]

        delivered: list[bool] = []  # per SIGTERM: had the error reached the server by then?

        def on_sigterm(signum: int, frame: object) -> None:
            delivered.append(error in sent())

        before = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            server.set_delay(0.6)  # the flush of the error takes 0.6 s
            env = job_env(tmp_path, TYARD_SERVER_URL=server.url)
            timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
            with pytest.raises(ValueError, match="boom"), session(env=env):
                timer.start()  # arrives while the error is being flushed
                raise ValueError("boom")
            timer.join()
            handler = signal.getsignal(signal.SIGTERM)
        finally:
            signal.signal(signal.SIGTERM, before)
        assert error in sent()
    # held during the flush, then delivered once, to the handler that was there before
    assert delivered == [True]
    assert handler is on_sigterm


def test_without_torchrun_variables_init_is_a_single_process() -> None:
    ctx = init(env={})
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed) == (0, 1, True, False)
    assert ctx.any_rank(True) and ctx.mean(2.5) == 2.5 and ctx.all_gather_object(7) == [7]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
        ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 is not below WORLD_SIZE=2"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ],
    ids=[
        "a missing rendezvous address says to launch with torchrun",
        "a rank outside the world is refused",
        "a non-numeric rank names the variable",
    ],
)
def test_a_broken_torchrun_environment_raises_a_setup_error(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(RuntimeSetupError, match=message):
        init(env=env, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_asking_for_cuda_without_a_gpu_says_how_to_fix_it() -> None:
    with pytest.raises(RuntimeSetupError, match="gpus_per_node"):
        init(env={}, device="cuda")
