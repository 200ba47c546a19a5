"""The pipeline example end to end: a control plane subprocess, `tyard pipeline run --wait`,
and examples/pipelines/tiny-gpt.yaml (pretrain -> fine-tune -> evaluate the tiny GPT with DDP
on the CPU) at small step counts; then the same run again, served from the cache."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, ServerProcess, tyard

EXAMPLE = REPO / "examples" / "pipelines" / "tiny-gpt.yaml"
SMALL = ["--param", "pretrain_steps=40", "--param", "finetune_steps=20"]

pytestmark = pytest.mark.slow


def step_of(checkpoint: str) -> int:
    """The step of a checkpoint directory `.../step-000000040`."""
    return int(Path(checkpoint).name.removeprefix("step-"))


def lineage_metric(lineage: dict[str, object], key: str) -> float:
    """The metric of the version a `models lineage --json` answer describes."""
    version = lineage.get("version", lineage)
    assert isinstance(version, dict), lineage
    metrics = version["metrics"]
    assert isinstance(metrics, dict)
    return float(metrics[key])


def test_the_tiny_gpt_pipeline_pretrains_fine_tunes_evaluates_and_then_reuses_its_outputs(
    control_plane: ServerProcess,
) -> None:
    control_plane.start()
    env = {"TYARD_SERVER": control_plane.url, "TYARD_HOME": str(control_plane.home)}

    ran = tyard("pipeline", "run", str(EXAMPLE), *SMALL, "--wait", "--json", env=env, timeout=420)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    record = json.loads(ran.stdout.strip().splitlines()[-1])
    assert record["state"] == "SUCCEEDED", record["reason"]
    steps = {s["name"]: s for s in record["steps"]}
    assert [s["name"] for s in record["steps"]] == [
        "pretrain", "finetune", "eval-base", "evaluate", "register"
    ]  # fmt: skip
    # live progress went to stderr: every step, and a training step of a running job
    for name in steps:
        assert name in ran.stderr
    assert "job 1 RUNNING" in ran.stderr

    pretrain, finetune = steps["pretrain"]["outputs"], steps["finetune"]["outputs"]
    assert step_of(pretrain["checkpoint"]) == 40 and pretrain["step"] == 40
    assert step_of(finetune["checkpoint"]) == 20 and finetune["step"] == 20
    assert Path(finetune["checkpoint"], "state.pt").is_file()
    base, tuned = steps["eval-base"]["outputs"], steps["evaluate"]["outputs"]
    assert math.isclose(tuned["perplexity"], math.exp(tuned["loss"]), rel_tol=1e-6)
    # fine-tuning on the instruction set lowers perplexity on held-out instructions
    assert tuned["perplexity"] < base["perplexity"] < 257
    # the fine-tuned checkpoint became version 1 of default/tiny-gpt, now `production`
    register = steps["register"]
    assert register["state"] == "SUCCEEDED", register["reason"]
    assert register["outputs"]["version"] == 1
    assert register["outputs"]["job_id"] == finetune["job_id"]
    model = tyard("models", "show", "default/tiny-gpt", "--json", env=env)
    assert model.returncode == 0, model.stderr[-2000:]
    shown_model = json.loads(model.stdout)
    assert shown_model["aliases"] == {"production": 1}
    version = tyard("models", "lineage", "default/tiny-gpt:production", "--json", env=env)
    assert version.returncode == 0, version.stderr[-2000:]
    lineage = json.loads(version.stdout)
    assert lineage["version"]["job_id"] == finetune["job_id"]
    assert lineage["version"]["tags"]["stage"] == "sft"
    assert math.isclose(lineage_metric(lineage, "perplexity"), tuned["perplexity"], rel_tol=1e-9)

    shown = tyard("pipeline", "show", str(record["id"]), env=env)
    assert shown.returncode == 0 and "register" in shown.stdout

    again = tyard("pipeline", "run", str(EXAMPLE), *SMALL, "--wait", "--json", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads(again.stdout.strip().splitlines()[-1])
    # the job steps come from the cache; the same model does not beat itself: no version 2
    assert [s["state"] for s in second["steps"]] == ["CACHED"] * 4 + ["SKIPPED"]
    assert all(f"pipeline {record['id']}" in s["reason"] for s in second["steps"][:4])
    assert "is false" in second["steps"][4]["reason"]
    assert second["steps"][3]["outputs"] == steps["evaluate"]["outputs"]

    listed = tyard("pipeline", "list", "--json", env=env)
    assert [p["id"] for p in json.loads(listed.stdout)] == [second["id"], record["id"]]


def test_a_bad_pipeline_file_is_refused_before_anything_runs(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    control_plane.start()
    env = {"TYARD_SERVER": control_plane.url, "TYARD_HOME": str(control_plane.home)}
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\n"
        "steps:\n"
        "  - {name: a, needs: [c], job: {command: [x.py]}}\n"
        "  - {name: b, job: {command: [x.py, '${{ params.lr }}']}}\n"
    )
    ran = tyard("pipeline", "run", str(bad), env=env)
    assert ran.returncode == 2
    assert "steps.0.needs.0" in ran.stderr and "'c', which is not a step" in ran.stderr
    unknown = tyard("pipeline", "run", str(EXAMPLE), "--param", "lr=1", env=env)
    assert unknown.returncode == 2 and "unknown parameter 'lr'" in unknown.stderr
    assert control_plane.client().pipelines() == []


def test_a_pipeline_carries_on_after_the_control_plane_is_sigkilled_mid_step(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    client = control_plane.start()
    script = tmp_path / "step.py"
    script.write_text(
        "import json, os, sys, time\n"
        "time.sleep(float(sys.argv[1]))\n"
        "out = os.path.join(os.environ['TYARD_RUN_DIR'], 'outputs.json')\n"
        "json.dump({'value': sys.argv[2]}, open(out, 'w'))\n"
    )
    job = {"launcher": "python", "workdir": str(tmp_path), "restart": {"max_restarts": 0}}
    spec = {
        "name": "restartable",
        "steps": [
            {"name": "first", "job": {**job, "command": ["step.py", "6", "one"]}},
            {"name": "second",
             "job": {**job, "command": ["step.py", "0", "${{ steps.first.outputs.value }}-two"]}},
        ],
    }  # fmt: skip
    pid = client.run_pipeline(spec)["id"]
    deadline = time.monotonic() + 60
    while True:
        first = client.pipeline(pid)["steps"][0]
        if first["job_id"] and client.job(first["job_id"])["state"] == "RUNNING":
            break
        assert time.monotonic() < deadline, first
        time.sleep(0.2)
    control_plane.kill()  # SIGKILL while the first step's job runs
    client = control_plane.start()
    deadline = time.monotonic() + 90
    while (record := client.pipeline(pid))["state"] == "RUNNING":
        assert time.monotonic() < deadline, record
        time.sleep(0.3)
    assert record["state"] == "SUCCEEDED", record
    assert [len(s["job_ids"]) for s in record["steps"]] == [1, 1]
    assert record["steps"][1]["outputs"]["value"] == "one-two"
    assert client.jobs()["total"] == 2


def test_tyard_pipeline_cancel_stops_the_running_step_and_the_rest(
    control_plane: ServerProcess, tmp_path: Path
) -> None:
    client = control_plane.start()
    env = {"TYARD_SERVER": control_plane.url, "TYARD_HOME": str(control_plane.home)}
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(120)\n")
    spec = tmp_path / "long.yaml"
    spec.write_text(
        "name: long\n"
        "steps:\n"
        "  - {name: sleep, job: {launcher: python, command: [sleep.py]}}\n"
        "  - {name: after, needs: [sleep], job: {launcher: python, command: [sleep.py]}}\n"
    )
    started = tyard("pipeline", "run", str(spec), "--json", env=env)
    assert started.returncode == 0, started.stderr
    pid = json.loads(started.stdout)["id"]
    deadline = time.monotonic() + 60
    while (
        not (job_id := client.pipeline(pid)["steps"][0]["job_id"])
        or client.job(job_id)["state"] != "RUNNING"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelled = tyard("pipeline", "cancel", str(pid), "--json", env=env)
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["cancel_requested"]
    deadline = time.monotonic() + 60
    while (record := client.pipeline(pid))["state"] == "RUNNING":
        assert time.monotonic() < deadline, record
        time.sleep(0.3)
    assert record["state"] == "CANCELLED"
    assert [s["state"] for s in record["steps"]] == ["CANCELLED", "CANCELLED"]
    assert client.job(job_id)["state"] == "CANCELLED"
    again = tyard("pipeline", "cancel", str(pid), env=env)
    assert again.returncode == 2 and "already ended" in again.stderr
