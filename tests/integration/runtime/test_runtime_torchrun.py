"""The tiny_gpt example under real torchrun (2 processes, gloo, CPU): a run killed by SIGKILL
and resumed from its checkpoint reproduces the uninterrupted run's losses exactly: the data
loader's position travels in the checkpoint, and the dataset is prepared once per data dir."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tensoryard.executors.local.plan import RANK_WRAPPER
from tensoryard.runtime.goodput import StepTime, compute_goodput
from tensoryard.runtime.testing import RecordingReportServer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
TRAIN = REPO / "examples" / "tiny_gpt" / "train.py"
STEPS, INTERVAL, FAIL_AT = 30, 5, 13
BATCH, WORLD = 4, 2
TINY = [
    f"--steps={STEPS}",
    f"--batch-size={BATCH}",
    "--seq-len=32",
    "--d-model=32",
    "--layers=1",
    "--heads=2",
    "--dropout=0.1",  # dropout draws from each rank's RNG: exact resume needs it restored
    "--max-bytes=300000",
    "--lr=1e-2",
    "--warmup=5",
]


@dataclass
class Attempt:
    returncode: int
    output: str
    rows: list[dict[str, Any]]


def launch(
    root: Path,
    attempt: int,
    *extra: str,
    server_url: str | None = None,
    in_place: int = 0,
) -> Attempt:
    env = {
        **os.environ,
        "TYARD_JOB_ID": "1",
        "TYARD_ATTEMPT": str(attempt),
        "TYARD_RUN_DIR": str(root / "run"),
        "TYARD_CHECKPOINT_DIR": str(root / "ckpt"),
        "TYARD_CHECKPOINT_INTERVAL": str(INTERVAL),
        "TYARD_CHECKPOINT_KEEP": "3",
        "TYARD_HEARTBEAT_S": "1",
        "OMP_NUM_THREADS": "1",
    }
    if server_url:
        env["TYARD_SERVER_URL"] = server_url
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2"]
    if in_place:  # as the local executor launches it: through the rank wrapper
        (root / "attempt-dir").mkdir(exist_ok=True)
        command += [f"--max-restarts={in_place}", str(RANK_WRAPPER), str(root / "attempt-dir")]
    command += [str(TRAIN), *TINY, *extra]
    proc = subprocess.run(
        command, env=env, cwd=root, capture_output=True, text=True, timeout=240, check=False
    )
    metrics = root / "run" / f"attempt-{attempt}" / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    rows = [json.loads(line) for line in lines]
    return Attempt(proc.returncode, proc.stdout + proc.stderr, rows)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Attempt:
    result = launch(tmp_path_factory.mktemp("uninterrupted"), 1)
    assert result.returncode == 0, result.output[-3000:]
    return result


@dataclass
class Interrupted:
    first: Attempt
    second: Attempt
    server: RecordingReportServer
    root: Path


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Interrupted:
    root = tmp_path_factory.mktemp("interrupted")
    fail = [f"--fail-at-step={FAIL_AT}", "--fail-rank=1"]
    with RecordingReportServer() as server:
        first = launch(root, 1, *fail, server_url=server.url)
        second = launch(root, 2, *fail, server_url=server.url)
    assert second.returncode == 0, second.output[-3000:]
    return Interrupted(first, second, server, root)


def losses(rows: list[dict[str, Any]]) -> dict[int, float]:
    return {row["step"]: row["values"]["loss"] for row in rows}


def test_a_rank_killed_mid_run_fails_the_attempt_after_the_last_checkpoint(
    interrupted: Interrupted,
) -> None:
    assert interrupted.first.returncode != 0
    assert f"fault injection: killing rank 1 at step {FAIL_AT}" in interrupted.first.output
    assert [r["step"] for r in interrupted.first.rows] == list(range(1, FAIL_AT))


def test_the_resumed_attempt_continues_from_the_checkpoint_with_identical_losses(
    uninterrupted: Attempt, interrupted: Interrupted
) -> None:
    last_checkpoint = (FAIL_AT - 1) // INTERVAL * INTERVAL
    assert [r["step"] for r in interrupted.second.rows] == list(
        range(last_checkpoint + 1, STEPS + 1)
    )
    reference = losses(uninterrupted.rows)
    for step, loss in {**losses(interrupted.first.rows), **losses(interrupted.second.rows)}.items():
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=1e-7), f"step {step}"


def test_only_rank_zero_reports_and_the_resume_point_is_sent_once_per_attempt(
    interrupted: Interrupted,
) -> None:
    bodies = [request.body for request in interrupted.server.requests]
    resumed = {(b["attempt"], b["resumed_from_step"]) for b in bodies if "resumed_from_step" in b}
    assert resumed == {(1, None), (2, (FAIL_AT - 1) // INTERVAL * INTERVAL)}
    sent = [(b["attempt"], row["step"]) for b in bodies for row in b["metrics"]]
    assert len(sent) == len(set(sent))  # rank 1 sent nothing, nothing was sent twice
    written = [(1, r["step"]) for r in interrupted.first.rows]
    written += [(2, r["step"]) for r in interrupted.second.rows]
    assert sorted(sent) == written  # rank 0 flushed its queue even as its peer died
    checkpoints = sorted(c["step"] for b in bodies for c in b["checkpoints"])
    assert checkpoints == list(range(INTERVAL, STEPS + 1, INTERVAL))


def test_goodput_counts_the_steps_recomputed_after_the_restart(interrupted: Interrupted) -> None:
    rows = [StepTime(1, r["step"], r["step_time_s"]) for r in interrupted.first.rows]
    rows += [StepTime(2, r["step"], r["step_time_s"]) for r in interrupted.second.rows]
    last_checkpoint = (FAIL_AT - 1) // INTERVAL * INTERVAL
    result = compute_goodput(rows, {1: None, 2: last_checkpoint}, wall_s=1000.0)
    assert result.steps_lost == FAIL_AT - 1 - last_checkpoint
    assert result.steps_kept == STEPS


def test_workers_restarted_in_place_report_as_the_next_attempt_and_resume_exactly(
    uninterrupted: Attempt, tmp_path: Path
) -> None:
    # One torchrun, --max-restarts=1: rank 1 is killed at step 13 and torchrun restarts both
    # workers itself; they run as attempt 2 of launch 1 and resume from step 10's checkpoint.
    fail = [f"--fail-at-step={FAIL_AT}", "--fail-rank=1"]
    with RecordingReportServer() as server:
        run = launch(tmp_path, 1, *fail, server_url=server.url, in_place=1)
    assert run.returncode == 0, run.output[-3000:]
    last_checkpoint = (FAIL_AT - 1) // INTERVAL * INTERVAL
    second = tmp_path / "run" / "attempt-2" / "metrics.jsonl"
    rows = [json.loads(line) for line in second.read_text().splitlines()]
    assert [r["step"] for r in run.rows] == list(range(1, FAIL_AT))
    assert [r["step"] for r in rows] == list(range(last_checkpoint + 1, STEPS + 1))
    reference = losses(uninterrupted.rows)
    for step, loss in {**losses(run.rows), **losses(rows)}.items():
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=1e-7), f"step {step}"
    bodies = [request.body for request in server.requests]
    assert {(b["attempt"], b.get("launch_attempt")) for b in bodies} == {(1, None), (2, 1)}
    resumed = {(b["attempt"], b["resumed_from_step"]) for b in bodies if "resumed_from_step" in b}
    assert resumed == {(1, None), (2, last_checkpoint)}
    log = (tmp_path / "attempt-dir" / "rank-0.log").read_text()
    assert "workers restarted in place by torchrun (restart 1): rank 0 runs as attempt 2" in log


def test_the_loss_falls_clearly_over_a_short_run(uninterrupted: Attempt) -> None:
    values = [row["values"]["loss"] for row in uninterrupted.rows]
    first, last = sum(values[:3]) / 3, sum(values[-5:]) / 5
    assert last < 0.8 * first, values


def test_sigterm_to_the_job_writes_a_checkpoint_before_the_ranks_exit(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TYARD_ATTEMPT": "1",
        "TYARD_RUN_DIR": str(tmp_path / "run"),
        "TYARD_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "TYARD_CHECKPOINT_INTERVAL": "100000",  # only the stop writes a checkpoint
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(TRAIN), *TINY, "--steps=100000"]
    metrics = tmp_path / "run" / "attempt-1" / "metrics.jsonl"
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, "training never started"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)  # what the executor's cancel does
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(saved) == 1 and saved[0].startswith("step-"), output[-3000:]
    step = int(saved[0].removeprefix("step-"))
    assert step % 10 == 0  # the ranks agree to stop at the next stop check
    assert "stopped at step" in output


def test_every_checkpoint_holds_the_loader_position_of_its_step(interrupted: Interrupted) -> None:
    checkpoints = sorted((interrupted.root / "ckpt").glob("step-*"))
    assert checkpoints, "no checkpoint written"
    for path in checkpoints:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        data = state["extra"]["data"]
        assert data["format"] == "tensoryard-loader-state"
        assert data["consumed_samples"] == state["step"] * BATCH * WORLD, path.name


def test_the_dataset_is_prepared_once_and_the_restarted_attempt_reuses_it(
    interrupted: Interrupted,
) -> None:
    assert "prepared: " in interrupted.first.output
    assert "up to date: " in interrupted.second.output
    assert "prepared: " not in interrupted.second.output
    data_dir = interrupted.root / "data" / "tiny-gpt-stdlib"  # $TYARD_RUN_DIR/../data/...
    datasets = [p for p in data_dir.iterdir() if p.is_dir()]
    assert len(datasets) == 1 and (datasets[0] / "manifest.json").is_file()


def test_resuming_with_a_checkpoint_of_other_data_fails_with_a_clear_error(
    interrupted: Interrupted, tmp_path: Path
) -> None:
    shutil.copytree(interrupted.root / "ckpt", tmp_path / "ckpt")
    result = launch(tmp_path, 3, "--max-bytes=200000")  # another corpus, so another dataset
    assert result.returncode != 0 and result.rows == []
    message = "was trained on other data: loader state is from another dataset or config: datasets:"
    assert message in result.output, result.output[-3000:]
    assert 'train.py", line' not in result.output  # a message, not a traceback from the script
    assert "exitcode  : 2" in result.output  # torchrun's failure summary
