"""Megatron jobs: recognition, resume arguments, log parsing and the monitor that reports them.

The log lines below are composed from the format strings of Megatron-LM's ``training_log``
(megatron/training/training.py: `` iteration {:8d}/{:8d} |``, `` consumed samples: {:12d} |``,
`` elapsed time per iteration (ms): {:.1f} |``, `` learning rate: {:.6E} |``, `` {key}: {:.6E}
|`` per loss, ...) and of checkpointing.py (``successfully saved checkpoint from iteration {:7d}
to {} [ t {}/{}, p {}/{} ]``); the numbers are made up."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import SpecError
from tensoryard.registry.pruning import job_checkpoint_root
from tensoryard.runtime.megatron import (
    MegatronMonitor,
    checkpoint_dir,
    launch_command,
    parse_iteration,
    read_tracker,
    recognise,
)
from tensoryard.spec.job import parse_job_spec

ITER_20 = (
    " [2026-11-30 10:41:20] iteration       20/    1000 | consumed samples:          320 |"
    " elapsed time per iteration (ms): 820.7 | throughput per GPU (TFLOP/s/GPU): 412.3 |"
    " learning rate: 4.000000E-05 | global batch size:    16 | lm loss: 1.072453E+01 |"
    " mtp_1 loss: 1.101000E+01 | loss scale: 131072.0 | grad norm: 3.874 | num zeros: 71.0 |"
    " number of skipped iterations:   0 | number of nan iterations:   0 |"
)
MEGATRON_CMD = [
    "pretrain_gpt.py",
    "--tensor-model-parallel-size", "2",
    "--micro-batch-size", "4",
    "--train-iters", "1000",
    "--save-interval", "100",
]  # fmt: skip


def iteration_line(it: int, ms: float, loss: float, total: int = 100) -> str:
    return (
        f" [2026-11-30 10:41:20] iteration {it:8d}/{total:8d} | consumed samples: {it * 16:12d} |"
        f" elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 |"
        f" global batch size: {16:5d} | lm loss: {loss:.6E} | loss scale: 1.0 |"
        f" number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |"
    )


# -- recognition and launch arguments -------------------------------------------------------


def test_a_megatron_command_line_is_recognised_and_another_is_not() -> None:
    args = recognise([*MEGATRON_CMD, "--save", "/ckpt", "--load=/init", "--finetune"])
    assert args is not None
    assert (args.save, args.load, args.save_interval, args.finetune) == (
        "/ckpt", "/init", 100, True
    )  # fmt: skip
    assert recognise(["train.py", "--steps", "40", "--micro-batch-size", "4"]) is None  # one only
    assert recognise(["train.py", "--steps", "40"], "megatron") is not None  # said so
    assert recognise(MEGATRON_CMD, "none") is None  # opted out


def test_the_first_launch_gets_save_and_the_exit_signal_handler_and_keeps_its_load() -> None:
    cmd = [*MEGATRON_CMD, "--load", "/pretrained", "--finetune"]
    out = launch_command(cmd, save_dir=Path("/runs/7/checkpoints"), resume=False)
    assert out[: len(cmd)] == cmd  # the user's arguments, untouched
    assert out[len(cmd) :] == ["--save", "/runs/7/checkpoints", "--exit-signal-handler"]


def test_a_launch_after_a_checkpoint_resumes_from_the_save_dir_without_fresh_start_flags() -> None:
    cmd = [
        *MEGATRON_CMD, "--save", "/ckpt", "--load=/pretrained", "--finetune", "--no-load-optim",
        "--no-load-rng", "--exit-signal-handler",
    ]  # fmt: skip
    out = launch_command(cmd, save_dir=Path("/ckpt"), resume=True)
    assert out == [*MEGATRON_CMD, "--save", "/ckpt", "--exit-signal-handler", "--load", "/ckpt"]
    assert launch_command(out, save_dir=Path("/ckpt"), resume=True) == out  # idempotent


def test_the_save_dir_is_the_commands_relative_to_the_workdir_else_the_jobs() -> None:
    spec = parse_job_spec({"name": "m", "command": [*MEGATRON_CMD, "--save", "ck"]})
    spec.workdir = "/srv/llm"
    assert job_checkpoint_root("/runs/3", spec) == Path("/srv/llm/ck")
    plain = parse_job_spec({"name": "m", "command": MEGATRON_CMD})
    assert job_checkpoint_root("/runs/3", plain) == Path("/runs/3/checkpoints")
    other = parse_job_spec({"name": "t", "command": ["train.py", "--save", "ck"]})
    assert job_checkpoint_root("/runs/3", other) == Path("/runs/3/checkpoints")


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"launcher": "python"}, ["runs under torchrun", "fix: launcher: torchrun"]),
        (
            {"checkpoint": {"dir": "/a"}, "command": [*MEGATRON_CMD, "--save", "/b"]},
            ["checkpoint.dir (/a)", "--save (/b)", "fix: keep one"],
        ),
        ({"restart": {"in_place": 1}}, ["restart.in_place", "fix: in_place: 0"]),
    ],
)
def test_a_megatron_spec_that_cannot_work_is_refused_with_the_fix(
    extra: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(SpecError) as err:
        parse_job_spec({"name": "m", "command": MEGATRON_CMD, **extra})
    for word in words:
        assert word in str(err.value)


# -- log lines ----------------------------------------------------------------------------------


def test_an_iteration_line_is_parsed_into_metrics() -> None:
    parsed = parse_iteration(ITER_20)
    assert parsed is not None
    assert (parsed.iteration, parsed.train_iters) == (20, 1000)
    assert parsed.iteration_time_s == pytest.approx(0.8207)
    assert parsed.values == {
        "consumed_samples": 320.0,
        "tflops_per_gpu": 412.3,
        "lr": 4e-05,
        "global_batch_size": 16.0,
        "loss": 10.72453,
        "mtp_1_loss": 11.01,
        "loss_scale": 131072.0,
        "grad_norm": 3.874,
        "num_zeros": 71.0,
        "skipped_iterations": 0.0,
        "nan_iterations": 0.0,
    }
    assert parse_iteration(" validation loss at iteration 50 | lm loss value: 8.88E+00 |") is None
    assert parse_iteration("saving checkpoint at iteration     100 to /c") is None


# -- the monitor ------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.rows: list[tuple[int, float | None, dict[str, float]]] = []
        self.checkpoints: list[tuple[int, str, int]] = []
        self.resumed: list[int | None] = []
        self.timings: list[tuple[float, float]] = []
        self.events: list[str] = []

    def report(self, step: int, *, step_time_s: float | None = None, **values: float) -> None:
        self.rows.append((step, step_time_s, values))

    def checkpoint(
        self,
        step: int,
        path: str | Path,
        size_bytes: int,
        ts: float | None = None,
        *,
        format: str | None = None,
    ) -> None:
        self.checkpoints.append((step, str(path), size_bytes))

    def event(self, message: str, *, kind: str = "runtime") -> None:
        self.events.append(message)

    def set_resumed_from(self, step: int | None) -> None:
        self.resumed.append(step)

    def set_timings(self, *, checkpoint_save_s: float, checkpoint_restore_s: float) -> None:
        self.timings.append((checkpoint_save_s, checkpoint_restore_s))


def commit(save: Path, iteration: int) -> None:
    """What Megatron does: the checkpoint's files first, the tracker last."""
    where = checkpoint_dir(save, iteration)
    where.mkdir(parents=True)
    (where / "__0_0.distcp").write_bytes(b"x" * 1000)
    (where / "common.pt").write_bytes(b"y" * 24)
    (save / "latest_checkpointed_iteration.txt").write_text(str(iteration))


def test_the_monitor_reports_steps_checkpoints_and_timers_as_megatron_writes_them(
    tmp_path: Path,
) -> None:
    save, logs = tmp_path / "ck", tmp_path / "attempt-1"
    save.mkdir()
    logs.mkdir()
    sink = Sink()
    monitor = MegatronMonitor(logs, save, sink)
    monitor.poll()
    assert sink.rows == [] and sink.checkpoints == []

    rank1 = logs / "rank-1.log"  # the last rank prints training_log
    rank0 = logs / "rank-0.log"  # rank 0 prints the checkpoint lines
    rank0.write_text(
        "WARNING: could not find the metadata file ck/latest_checkpointed_iteration.txt\n"
        "    will not load any checkpoints and will start from random\n"
    )
    rank1.write_text(iteration_line(10, 500.0, 9.5) + "\n" + iteration_line(20, 400.0, 8.0))
    monitor.poll()  # the second line has no newline yet: it waits
    assert sink.resumed == [None]
    assert [(s, t) for s, t, _ in sink.rows] == [(10, pytest.approx(5.0))]
    with rank1.open("a") as f:
        f.write("\n")
    commit(save, 10)
    commit(save, 20)  # two saves between two looks: both are reported, in order
    with rank0.open("a") as f:
        f.write(
            "saving checkpoint at iteration      20 to ck in torch_dist format\n"
            "  successfully saved checkpoint from iteration      20 to ck [ t 1/1, p 1/1 ]\n"
            "(min, max) time across ranks (ms):\n"
            "    save-checkpoint ................................: (3413.14, 3500.00)\n"
        )
    monitor.poll()
    step, step_time, values = sink.rows[-1]
    assert (step, step_time) == (20, pytest.approx(4.0))  # 10 iterations of 0.4 s
    assert values["loss"] == 8.0 and values["iteration_time_s"] == pytest.approx(0.4)
    assert sink.checkpoints == [
        (10, str(save / "iter_0000010"), 1024),
        (20, str(save / "iter_0000020"), 1024),
    ]
    assert sink.timings[-1] == (pytest.approx(3.5), 0.0)

    monitor.poll()  # nothing new: nothing reported twice
    assert len(sink.rows) == 2 and len(sink.checkpoints) == 2
    (save / "latest_checkpointed_iteration.txt").write_text("10")  # going backwards: ignored
    monitor.poll()
    assert len(sink.checkpoints) == 2


def test_a_resumed_attempt_counts_steps_from_where_it_loaded_and_skips_the_old_checkpoint(
    tmp_path: Path,
) -> None:
    save, logs = tmp_path / "ck", tmp_path / "attempt-2"
    logs.mkdir()
    commit(save, 20)  # written by attempt 1
    sink = Sink()
    monitor = MegatronMonitor(logs, save, sink)
    monitor.start()
    (logs / "rank-0.log").write_text(
        " loading distributed checkpoint from ck at iteration 20\n"
        "  successfully loaded checkpoint from ck [ t 1/1, p 1/1 ] at iteration 20\n"
        "(min, max) time across ranks (ms):\n"
        "    load-checkpoint ................................: (120.00, 250.00)\n"
    )
    (logs / "rank-1.log").write_text(iteration_line(25, 100.0, 7.0) + "\n")
    monitor.poll()
    assert sink.resumed == [20]
    assert sink.checkpoints == []  # iteration 20 was attempt 1's
    assert sink.rows[0][:2] == (25, pytest.approx(0.5))  # 5 iterations since 20
    assert sink.timings[-1] == (0.0, pytest.approx(0.25))


def test_run_makes_a_last_pass_when_stopped(tmp_path: Path) -> None:
    import threading

    save, logs = tmp_path / "ck", tmp_path / "a"
    logs.mkdir()
    sink = Sink()
    monitor = MegatronMonitor(logs, save, sink, poll_s=60.0)
    monitor.start()  # before the workload starts: what is committed later is reported
    stop = threading.Event()
    thread = threading.Thread(target=monitor.run, args=(stop,))
    thread.start()
    (logs / "rank-0.log").write_text(iteration_line(30, 100.0, 6.0) + "\n")
    commit(save, 30)
    stop.set()
    thread.join(timeout=10)
    assert [r[0] for r in sink.rows] == [30]
    assert [c[0] for c in sink.checkpoints] == [30]
    assert read_tracker(save) == 30


def test_follow_passes_the_output_through_reports_it_and_ends_like_the_command(
    tmp_path: Path,
) -> None:
    """`python -m tensoryard.runtime.megatron follow -- CMD` as a pod runs it, against a
    recording report server."""
    import subprocess
    import sys

    from tensoryard.runtime.testing import RecordingReportServer

    save = tmp_path / "ck"
    script = tmp_path / "fake_megatron.py"
    script.write_text(
        "import os, pathlib, sys\n"
        f"print({iteration_line(10, 200.0, 5.0)!r}, flush=True)\n"
        "save = pathlib.Path(os.environ['TYARD_MEGATRON_SAVE'])\n"
        "(save / 'iter_0000010').mkdir(parents=True)\n"
        "(save / 'iter_0000010' / 'common.pt').write_bytes(b'z' * 10)\n"
        "(save / 'latest_checkpointed_iteration.txt').write_text('10')\n"
        "print('  successfully saved checkpoint from iteration      10 to ck [ t 1/1, p 1/1 ]',"
        " flush=True)\n"
        "sys.exit(3)\n"
    )
    with RecordingReportServer() as server:
        env = {
            **os.environ,
            "TYARD_MEGATRON_SAVE": str(save),
            "TYARD_JOB_ID": "7",
            "TYARD_ATTEMPT": "1",
            "TYARD_SERVER_URL": server.url,
            "TYARD_JOB_TOKEN": "t",
        }
        done = subprocess.run(
            [sys.executable, "-m", "tensoryard.runtime.megatron", "follow", "--",
             sys.executable, str(script)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        bodies = [r.body for r in server.requests]
    assert done.returncode == 3, done.stderr
    assert "iteration       10/" in done.stdout and "successfully saved" in done.stdout
    steps = [m["step"] for b in bodies for m in b.get("metrics", [])]
    checkpoints = [(c["step"], c["path"]) for b in bodies for c in b.get("checkpoints", [])]
    assert steps == [10]
    assert checkpoints == [(10, str(save / "iter_0000010"))]


def test_follow_without_a_command_says_how_to_call_it() -> None:
    from tensoryard.runtime.megatron import main

    assert main(["follow"]) == 2
