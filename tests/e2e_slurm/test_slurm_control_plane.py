"""The control plane on a real Slurm cluster (`tyard server --executor slurm`): the tiny GPT on
two Slurm nodes through torchrun, a killed rank restarted from its checkpoint as a new Slurm
job, cancel from tyard, a control plane SIGKILLed right after sbatch, bad input refused before
anything is submitted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tensoryard.client import Client
from tensoryard.errors import ClientError
from tests.e2e.conftest import ServerProcess, free_port, tyard, wait_for
from tests.e2e.test_e2e_jobs import tiny_job
from tests.e2e_slurm.conftest import SlurmCluster, wait_until

pytestmark = pytest.mark.slow

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def plane(slurm: SlurmCluster, tmp_path: Path) -> Iterator[ServerProcess]:
    home = tmp_path / "home"
    home.mkdir()
    config = slurm.config_file(tmp_path / "slurm.yaml", teams={"*": {"partition": "debug"}})
    server = ServerProcess(
        home=home,
        port=free_port(),
        extra_args=["--executor", "slurm", "--slurm-config", str(config), "--cancel-grace", "60"],
    )
    yield server
    server.stop()


def two_node_job(tmp_path: Path, *args: str, **extra: Any) -> dict[str, Any]:
    spec = yaml.safe_load(tiny_job(tmp_path, *args, **extra).read_text())
    spec["resources"] = {"nodes": 2, "processes_per_node": 1, "cpu": 1, "memory": "1Gi"}
    return dict(spec)


def submitted(client: Client, job_id: int) -> dict[int, dict[str, Any]]:
    """Attempt number -> what the executor recorded after sbatch (slurm-job.json)."""
    run_dir = Path(client.job(job_id)["run_dir"])
    out = {}
    for a in client.attempts(job_id):
        record = run_dir / f"attempt-{a['number']}" / "slurm-job.json"
        if record.exists():
            out[a["number"]] = json.loads(record.read_text())
    return out


def slurm_jobs_of(slurm: SlurmCluster, client: Client, job_id: int) -> list[dict[str, Any]]:
    keys = {r["attempt_key"] for r in submitted(client, job_id).values()}
    return [j for j in slurm.jobs() if j["name"].removeprefix("tyard.") in keys]


def explain(client: Client, job_id: int, run_dir: str) -> str:
    out = [e["message"] for e in client.events(job_id)]
    for attempt in Path(run_dir).glob("attempt-*"):
        for log in sorted(attempt.glob("*.log")):
            out.append(f"--- {log}\n{log.read_text(errors='replace')[-1500:]}")
    return "\n".join(out)


def test_tiny_gpt_trains_to_the_end_on_two_slurm_nodes(
    slurm: SlurmCluster, plane: ServerProcess, tmp_path: Path
) -> None:
    client = plane.start()
    job_id = client.submit(two_node_job(tmp_path, "--steps", "20"))["id"]
    job = wait_for(client, job_id, TERMINAL, timeout=240)
    assert job["state"] == "SUCCEEDED", explain(client, job_id, job["run_dir"])
    [attempt] = client.attempts(job_id)
    assert sorted(attempt["nodes"]) == ["n1", "n2"]
    [sjob] = slurm_jobs_of(slurm, client, job_id)
    assert sjob["job_state"] == "COMPLETED" and sjob["nodes"] == "n[1-2]"
    key = submitted(client, job_id)[1]["attempt_key"]
    assert sjob["name"] == f"tyard.{key}"
    assert f"attempt=1 key={key} epoch=1" in sjob["comment"]  # the leader's fencing token
    attempt_dir = Path(job["run_dir"]) / "attempt-1"
    # one torchrun per node (srun), one rank each, per-rank logs that `tyard logs` shows
    for rank, node in ((0, "n1"), (1, "n2")):
        record = yaml.safe_load((attempt_dir / f"rank-{rank}.exit.json").read_text())
        assert record["exit_code"] == 0 and record["node"] == node
    steps = sorted(m["step"] for m in client.metrics(job_id))
    assert steps[-1] == 20
    logs = tyard(
        "logs",
        str(job_id),
        "--rank",
        "1",
        env={"TYARD_SERVER": plane.url, "TYARD_HOME": str(plane.home)},
    )
    assert logs.returncode == 0, logs.stderr
    assert "[rank 1]" in logs.stdout


def test_a_killed_rank_fails_the_slurm_job_and_a_new_one_resumes_from_the_checkpoint(
    slurm: SlurmCluster, plane: ServerProcess, tmp_path: Path
) -> None:
    client = plane.start()
    spec = two_node_job(tmp_path, "--steps", "30", "--fail-at-step", "15", "--fail-rank", "1")
    job_id = client.submit(spec)["id"]
    job = wait_for(client, job_id, TERMINAL, timeout=300)
    assert job["state"] == "SUCCEEDED", explain(client, job_id, job["run_dir"])
    first, second = client.attempts(job_id)
    assert first["state"] == "failed" and "rank 1 killed by SIGKILL" in first["reason"], first
    assert second["state"] == "succeeded" and second["resumed_from_step"] == 10
    resumed = sorted(m["step"] for m in client.metrics(job_id) if m["attempt"] == 2)
    assert resumed[0] == 11 and resumed[-1] == 30  # only the steps since the checkpoint again
    states = sorted(j["job_state"] for j in slurm_jobs_of(slurm, client, job_id))
    assert states == ["COMPLETED", "FAILED"]  # two Slurm jobs, one per attempt


def test_cancel_from_tyard_removes_the_slurm_job(
    slurm: SlurmCluster, plane: ServerProcess, tmp_path: Path
) -> None:
    client = plane.start()
    job_id = client.submit(two_node_job(tmp_path, "--steps", "100000"))["id"]
    wait_for(client, job_id, {"RUNNING"}, timeout=180)
    wait_until(lambda: client.checkpoints(job_id), timeout=120, what="a first checkpoint")
    client.cancel(job_id)
    job = wait_for(client, job_id, TERMINAL, timeout=60)
    assert job["state"] == "CANCELLED"
    # SIGTERM reached the workers through Slurm (scancel --signal=TERM): they checkpointed
    # and stopped within the grace; the Slurm job ended; none is left
    ended = ("COMPLETED", "FAILED", "CANCELLED")
    jobs = wait_until(
        lambda: [j for j in slurm_jobs_of(slurm, client, job_id) if j["job_state"] in ended],
        timeout=30,
        what="the Slurm job to end",
    )
    assert len(jobs) == len(slurm_jobs_of(slurm, client, job_id)) == 1
    run_dir = Path(job["run_dir"]) / "attempt-1"
    for rank in (0, 1):  # each rank was told to stop (SIGTERM) and ended cleanly
        record = json.loads((run_dir / f"rank-{rank}.exit.json").read_text())
        assert record["sigterm_at"] is not None and record["exit_code"] == 0, record
    assert "on request (checkpoint written)" in (run_dir / "rank-0.log").read_text()
    assert jobs[0]["job_state"] == "CANCELLED"  # in Slurm's record too (sacct, squeue)


def test_a_control_plane_killed_right_after_sbatch_submits_nothing_twice(
    slurm: SlurmCluster, plane: ServerProcess, tmp_path: Path
) -> None:
    """SIGKILL between sbatch and the store's record of it (crash point launch.after_start):
    the restarted control plane launches the recorded attempt again, finds the Slurm job by its
    attempt key and submits nothing; the job runs once and ends."""
    script = tmp_path / "once.py"
    script.write_text("import time; time.sleep(2); print('ran')\n")
    spec = {
        "name": "once",
        "launcher": "python",
        "command": [str(script)],
        "workdir": str(tmp_path),
        "resources": {"cpu": 1, "memory": "64Mi"},
        "restart": {"max_restarts": 0},
    }
    plane.env = {"TYARD_CRASH_AT": "launch.after_start"}
    client = plane.start()
    job_id = client.submit(spec)["id"]
    assert plane.proc is not None
    assert plane.proc.wait(60) == -9, "the control plane did not reach its crash point"
    plane.env = {}
    client = plane.start()
    job = wait_for(client, job_id, TERMINAL, timeout=120)
    assert job["state"] == "SUCCEEDED", explain(client, job_id, job["run_dir"])
    assert len(client.attempts(job_id)) == 1
    key = submitted(client, job_id)[1]["attempt_key"]
    named = slurm.jobs_named(f"tyard.{key}")
    assert len(named) == 1, named  # one sbatch for the attempt, though launch ran twice
    assert (Path(job["run_dir"]) / "attempt-1" / "rank-0.log").read_text().strip() == "ran"


def test_impossible_jobs_are_refused_before_anything_is_submitted(
    slurm: SlurmCluster, plane: ServerProcess, tmp_path: Path
) -> None:
    client = plane.start()
    before = len(slurm.jobs())
    base = two_node_job(tmp_path, "--steps", "5")
    cases = {
        "resources.gpus_per_node": {"nodes": 1, "gpus_per_node": 8, "processes_per_node": 8},
        "resources.nodes": {"nodes": 3, "processes_per_node": 1},
        "resources.memory": {"nodes": 1, "memory": "64Gi"},
        "resources.cpu": {"nodes": 1, "cpu": 64},
    }
    for field, resources in cases.items():
        with pytest.raises(ClientError) as caught:
            client.submit({**base, "resources": resources})
        assert caught.value.status == 422
        assert field in str(caught.value.detail), caught.value.detail
    spec_file = tmp_path / "big.yaml"
    spec_file.write_text(yaml.safe_dump({**base, "resources": cases["resources.gpus_per_node"]}))
    cli = tyard(
        "submit", str(spec_file), env={"TYARD_SERVER": plane.url, "TYARD_HOME": str(plane.home)}
    )
    assert cli.returncode == 2 and "no node of partition 'debug' has more than 4" in cli.stderr
    assert len(slurm.jobs()) == before  # nothing reached Slurm


def test_with_slurm_admission_slurm_chooses_the_nodes(slurm: SlurmCluster, tmp_path: Path) -> None:
    """admission: slurm: tensoryard admits (quotas) and submits without --nodelist."""
    home = tmp_path / "home"
    home.mkdir()
    config = slurm.config_file(
        tmp_path / "slurm.yaml", admission="slurm", teams={"*": {"partition": "long"}}
    )
    server = ServerProcess(
        home=home,
        port=free_port(),
        extra_args=["--executor", "slurm", "--slurm-config", str(config)],
    )
    try:
        client = server.start()
        script = tmp_path / "hello.py"
        script.write_text("import os; print('on', os.environ['TYARD_NODE'])\n")
        spec = {
            "name": "hello",
            "launcher": "python",
            "command": [str(script)],
            "workdir": str(tmp_path),
            "resources": {"cpu": 1, "memory": "64Mi"},
        }
        job_id = client.submit(spec)["id"]
        job = wait_for(client, job_id, TERMINAL, timeout=120)
        assert job["state"] == "SUCCEEDED", explain(client, job_id, job["run_dir"])
        [sjob] = slurm_jobs_of(slurm, client, job_id)
        assert sjob["required_nodes"] == "" and sjob["partition"] == "long"
        log = (Path(job["run_dir"]) / "attempt-1" / "rank-0.log").read_text()
        assert log.strip() == f"on {sjob['nodes']}"
    finally:
        server.stop()


def test_a_control_plane_killed_mid_run_finds_the_slurm_job_again(
    slurm: SlurmCluster, plane: ServerProcess, tmp_path: Path
) -> None:
    """SIGKILL while the job runs: the Slurm job keeps running (it does not belong to the
    control plane's process tree) and the restarted control plane reattaches to it."""
    script = tmp_path / "long.py"
    script.write_text("import time; print('start', flush=True); time.sleep(8); print('end')\n")
    spec = {
        "name": "long",
        "launcher": "python",
        "command": [str(script)],
        "workdir": str(tmp_path),
        "resources": {"cpu": 1, "memory": "64Mi"},
        "restart": {"max_restarts": 0},
    }
    client = plane.start()
    job_id = client.submit(spec)["id"]
    wait_for(client, job_id, {"RUNNING"}, timeout=60)
    plane.kill()
    client = plane.start()
    job = wait_for(client, job_id, TERMINAL, timeout=120)
    assert job["state"] == "SUCCEEDED", explain(client, job_id, job["run_dir"])
    assert len(client.attempts(job_id)) == 1
    log = (Path(job["run_dir"]) / "attempt-1" / "rank-0.log").read_text()
    assert log.split() == ["start", "end"]  # the one run, never restarted
    assert len(slurm_jobs_of(slurm, client, job_id)) == 1
