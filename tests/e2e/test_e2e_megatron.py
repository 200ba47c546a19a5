"""A Megatron-style job through a real control plane: recognised from its arguments, its
checkpoints and progress followed without tensoryard in the job, and resumed with Megatron's
own arguments after a rank is killed (examples/megatron_style stands in for Megatron-LM,
whose training loop needs CUDA)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import REPO, ServerProcess, tyard, wait_for
from tests.e2e.test_e2e_jobs import TERMINAL, env_for, processes_of, submit

EXAMPLE = REPO / "examples" / "megatron_style"

pytestmark = pytest.mark.slow


def megatron_job(name: str, *args: str, **extra: object) -> dict[str, object]:
    """A spec for the Megatron-style script on 2 ranks, with Megatron's own arguments."""
    command = ["pretrain_gpt.py", "--tensor-model-parallel-size", "1", "--micro-batch-size", "4"]
    return {
        "name": name,
        "resources": {"processes_per_node": 2, "cpu": 2, "memory": "2Gi"},
        "command": [*command, "--log-interval", "1", *args],
        "workdir": str(EXAMPLE),
        **extra,
    }


def test_a_megatron_job_is_followed_and_resumed_from_its_own_checkpoint(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    control_plane.start()
    env = env_for(control_plane)
    pretrained = tmp_path / "pretrained"  # no tracker in it: Megatron starts from random
    pretrained.mkdir()
    spec = megatron_job(
        "megatron-style",
        "--train-iters", "30", "--save-interval", "10",
        "--load", str(pretrained), "--finetune",
        "--fail-at-iteration", "25", "--fail-rank", "1",
        checkpoint={"keep": 2},
        restart={"max_restarts": 2, "backoff": "1s"},
    )  # fmt: skip
    path = tmp_path / "megatron.yaml"
    path.write_text(yaml.safe_dump(spec))
    job_id = submit(path, env)

    client = control_plane.client()
    job = wait_for(client, job_id, TERMINAL, timeout=240)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["restarts"] == 1

    info = json.loads(tyard("describe", str(job_id), "--json", env=env).stdout)
    first, second = info["attempts_detail"]
    assert first["state"] == "failed" and "rank 1" in first["reason"]
    assert second["resumed_from_step"] == 20  # read from Megatron's "successfully loaded" line
    breakdown = info["summary"]["breakdown"]  # from Megatron's save/load-checkpoint timers
    assert breakdown["checkpoint_save_s"] > 0 and breakdown["checkpoint_restore_s"] > 0

    # The launches: the first runs the user's arguments plus --save and the signal handler;
    # the restart resumes from the job's own save directory, without --finetune.
    save = Path(job["run_dir"]) / "checkpoints"
    argv1 = json.loads((Path(job["run_dir"]) / "attempt-1" / "launch.json").read_text())["argv"]
    argv2 = json.loads((Path(job["run_dir"]) / "attempt-2" / "launch.json").read_text())["argv"]
    assert argv1[argv1.index("--load") + 1] == str(pretrained) and "--finetune" in argv1
    assert argv1[argv1.index("--save") + 1] == str(save) and "--exit-signal-handler" in argv1
    assert argv2[argv2.index("--load") + 1] == str(save) and "--finetune" not in argv2

    # Checkpoints: committed by Megatron's tracker, recorded per attempt, retention applied
    # to the iter_ directories (keep 2: iteration 10 retired and deleted).
    kept = sorted((c["step"], c["attempt"], c["format"]) for c in info["checkpoints"])
    assert kept == [(20, 1, "megatron-dist"), (30, 2, "megatron-dist")]
    events = [e["message"] for e in info["events"]]
    assert not (save / "iter_0000010").exists(), "\n".join(events)
    assert (save / "iter_0000030").is_dir()
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "30"

    # Progress from the logs: every iteration a metric row; the resumed attempt computes
    # exactly the losses the killed one did for the iterations both ran (21..24).
    metrics = client.metrics(job_id)
    loss = {(m["attempt"], m["step"]): m["values"]["loss"] for m in metrics}
    assert sorted(s for a, s in loss if a == 2) == list(range(21, 31))
    assert sorted(s for a, s in loss if a == 1)[:20] == list(range(1, 21))
    for step in range(21, 25):
        assert loss[(2, step)] == loss[(1, step)], step
    assert loss[(2, 30)] < loss[(1, 1)]
    summary = info["summary"]
    assert summary["steps"] == 30 and 0 < summary["goodput"] < 1
    human = tyard("describe", str(job_id), env={**env, "COLUMNS": "300"}).stdout
    assert "Megatron job (recognised from its arguments): checkpoints in" in human
    assert not processes_of(control_plane.home)


def test_a_cancelled_megatron_job_saves_a_checkpoint_through_its_signal_handler(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    client = control_plane.start()
    env = env_for(control_plane)
    spec = megatron_job(
        "megatron-cancel",
        "--train-iters", "100000", "--save-interval", "10000", "--iteration-sleep", "0.05",
    )  # fmt: skip
    job_id = client.submit(spec)["id"]
    deadline = time.monotonic() + 120
    while not [m for m in client.metrics(job_id) if m["step"] >= 10]:
        assert time.monotonic() < deadline, client.job(job_id)
        time.sleep(0.5)
    result = tyard("cancel", str(job_id), env=env)
    assert result.returncode == 0, result.stderr
    job = wait_for(client, job_id, TERMINAL, timeout=90)
    assert job["state"] == "CANCELLED"

    # --exit-signal-handler (added by tensoryard): the SIGTERM of the cancel made every rank
    # save at the end of its iteration, and the monitor recorded that checkpoint.
    steps = [m["step"] for m in client.metrics(job_id)]
    checkpoints = client.checkpoints(job_id)
    assert [c["step"] for c in checkpoints] == [max(steps)]
    assert checkpoints[0]["step"] % 10000 != 0
    save = Path(job["run_dir"]) / "checkpoints"
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == str(max(steps))
    deadline = time.monotonic() + 15
    while processes_of(control_plane.home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(control_plane.home)
