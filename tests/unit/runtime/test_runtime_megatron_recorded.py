"""Megatron-Core's real output (recorded on an H200, see fixtures/megatron-core-h200/README.md)
replayed through the Megatron monitor: the same steps, metrics, timers and resume point as the
monitor reported live on that machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.unit.runtime.test_runtime_megatron import Sink

from tensoryard.runtime.megatron import TRACKER, MegatronMonitor, recognise

FIXTURE = Path(__file__).parent / "fixtures" / "megatron-core-h200"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def recorded_rows(attempt: int) -> list[dict[str, Any]]:
    lines = (FIXTURE / f"attempt-{attempt}" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def replay(attempt: int, tmp_path: Path) -> Sink:
    logs = tmp_path / f"attempt-{attempt}"
    logs.mkdir()
    sink = Sink()
    monitor = MegatronMonitor(logs, tmp_path / "save", sink)
    monitor.start()
    text = (FIXTURE / f"attempt-{attempt}" / "rank-0.log").read_text()
    log = logs / "rank-0.log"
    for chunk in (text[: len(text) // 3], text[len(text) // 3 :]):  # as if read mid-write
        with log.open("a") as f:
            f.write(chunk)
        monitor.poll()
    return sink


@pytest.mark.parametrize("attempt", [1, 2])
def test_the_recorded_megatron_core_output_gives_the_steps_the_machine_reported(
    attempt: int, tmp_path: Path
) -> None:
    sink = replay(attempt, tmp_path)
    recorded = recorded_rows(attempt)
    assert [step for step, _, _ in sink.rows] == [row["step"] for row in recorded]
    for (_, step_time, values), row in zip(sink.rows, recorded, strict=True):
        assert step_time == pytest.approx(row["step_time_s"])
        assert values == pytest.approx(row["values"])
    assert recorded[-1]["step"] == (140 if attempt == 1 else 300)


def test_the_resume_point_and_checkpoint_timers_are_read_from_the_real_lines(
    tmp_path: Path,
) -> None:
    first = replay(1, tmp_path)
    assert first.resumed == [None]  # a fresh start: no "loaded" line
    assert first.timings[-1] == (pytest.approx(4.06129), 0.0)  # the save at iteration 100
    second = replay(2, tmp_path)
    assert second.resumed == [100]
    save_s, restore_s = second.timings[-1]
    assert restore_s == pytest.approx(0.85564)
    assert save_s > 2.0  # the saves at 200 and 300
    assert second.rows[0][0] == 110 and second.rows[0][1] == pytest.approx(10 * 0.1864)


def test_the_launches_carried_the_arguments_tensoryard_adds(tmp_path: Path) -> None:
    def script_args(attempt: int) -> list[str]:
        argv = json.loads((FIXTURE / f"attempt-{attempt}" / "argv.json").read_text())["argv"]
        return argv[argv.index("pretrain_gpt.py") :]

    first, second = script_args(1), script_args(2)
    assert recognise(first) is not None  # from Megatron's own arguments, no framework: set
    save = first[first.index("--save") + 1]
    assert "--load" not in first and "--exit-signal-handler" in first
    assert second[second.index("--load") + 1] == save and "--exit-signal-handler" in second
    listing = (FIXTURE / "checkpoints-ls.txt").read_text()
    assert TRACKER in listing and "iter_0000300" in listing and "__0_0.distcp" in listing


@pytest.mark.parametrize(
    ("args", "named"),
    [
        pytest.param(
            ["--use-mcore-models"],
            "--use-mcore-models: Megatron-Core's attention allocates on CUDA",
            marks=pytest.mark.skipif(_cuda(), reason="a GPU is here: the flag is allowed"),
        ),
        (["--tensor-model-parallel-size", "2"], "add --use-mcore-models"),
        (["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size"),
    ],
)
def test_the_example_refuses_what_it_cannot_run_naming_the_flag(
    args: list[str], named: str
) -> None:
    import subprocess
    import sys

    script = Path(__file__).parents[3] / "examples" / "megatron_style" / "pretrain_gpt.py"
    done = subprocess.run(
        [sys.executable, str(script), "--train-iters", "1", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
