"""The sbatch options and batch script of one attempt (pure; the real runs are in
tests/e2e_slurm)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.slurm.config import SlurmConfig, TeamMapping
from tensoryard.executors.slurm.script import batch_script, sbatch_args
from tensoryard.spec.job import JobSpec


@dataclasses.dataclass(frozen=True)
class FencedRequest(LaunchRequest):
    fencing_epoch: int = 0


def request(**resources: object) -> FencedRequest:
    spec = JobSpec.model_validate(
        {
            "name": "gpt",
            "launcher": "torchrun",
            "command": ["train.py", "--steps", "10"],
            "resources": {"nodes": 2, "gpus_per_node": 4, "cpu": 8, "memory": "64Gi", **resources},
            "max_runtime": "90m",
        }
    )
    return FencedRequest(
        job_id="12",
        attempt=3,
        spec=spec,
        run_dir=Path("/shared/runs/job-12"),
        placement={"n7": [0, 1, 2, 3], "n2": [0, 1, 2, 3]},
        attempt_key="j12-a3-abc",
        fencing_epoch=5,
    )


def test_sbatch_options_carry_resources_mapping_key_and_epoch() -> None:
    req = request()
    args = sbatch_args(
        req,
        Path("/shared/runs/job-12/attempt-3"),
        "j12-a3-abc",
        SlurmConfig(signal_lead_s=300),
        TeamMapping(partition="gpu", qos="high", account="nlp"),
        fencing_epoch=req.fencing_epoch,
    )
    assert "--job-name=tyard.j12-a3-abc" in args
    assert "--comment=tensoryard job=12 attempt=3 key=j12-a3-abc epoch=5" in args
    for want in (
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gres=gpu:4",
        "--cpus-per-task=8",
        "--mem=65536M",
        "--time=90",
        "--signal=B:USR1@300",
        "--no-requeue",
        "--partition=gpu",
        "--qos=high",
        "--account=nlp",
        "--nodelist=n2,n7",  # the scheduler's placement, pinned
    ):
        assert want in args, (want, args)


def test_slurm_admission_leaves_the_nodes_to_slurm_and_cpu_jobs_ask_for_no_gres() -> None:
    req = request(gpus_per_node=0, processes_per_node=2)
    args = sbatch_args(
        req, Path("/a"), "k", SlurmConfig(admission="slurm"), TeamMapping(), fencing_epoch=0
    )
    assert not [a for a in args if a.startswith(("--nodelist", "--gres", "--partition"))]


def test_the_batch_script_runs_one_torchrun_per_node_under_the_rank_wrapper() -> None:
    script = batch_script(
        request(), Path("/shared/runs/job-12/attempt-3"), "k", SlurmConfig(python="/opt/py")
    )
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1" in script
    assert 'PET_NODE_RANK="$SLURM_NODEID"' in script
    assert "/opt/py -m torch.distributed.run --nnodes 2 --nproc-per-node 4" in script
    assert (
        "--max-restarts 0" in script and "rank.py /shared/runs/job-12/attempt-3 train.py" in script
    )
    assert "trap 'warned USR1' USR1" in script
    assert "PET_MASTER_PORT=$(( 29400 + SLURM_JOB_ID % 100 ))" in script
