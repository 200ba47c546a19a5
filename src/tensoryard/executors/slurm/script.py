"""The batch script of one attempt and the sbatch options that go with it.

    sbatch (options below) job.sbatch
      └─ batch shell on the first node: notes its Slurm job id, finds the rendezvous host
         └─ srun, one task per node ──> torchrun --node-rank $SLURM_NODEID ──> rank.py ──> script

The batch shell turns Slurm's early warning (`--signal=B:USR1@LEAD`, before the time limit or
a preemption) into SIGTERM for the workers, which checkpoint and stop (tensoryard.runtime), and
writes ``slurm-exit.json`` when srun returns, so the outcome survives Slurm forgetting the job.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tensoryard.errors import ExecutorError
from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.local.plan import RANK_WRAPPER
from tensoryard.executors.slurm.config import SlurmConfig, TeamMapping
from tensoryard.executors.slurm.status import JOB_NAME_PREFIX

__all__ = ["JobDescription", "batch_script", "job_description", "sbatch_args"]

_MIB = 1024 * 1024

# slurmrestd (v0.0.38) cannot signal only a job's steps (its DELETE with signal=TERM ends the
# whole job at once): in REST mode the batch shell turns tensoryard's cancel request
# (cancel.json) into SIGTERM for the workers itself, as `scancel --signal=TERM` does in sbatch
# mode; the grace's end is still enforced from the control plane.
_CANCEL_WATCH = """(
  while kill -0 "$step_pid" 2>/dev/null; do
    if [ -e "$attempt_dir/cancel.json" ]; then
      echo "tensoryard: cancel requested: SIGTERM to the workers (they checkpoint and stop)"
      scancel --signal=TERM "$SLURM_JOB_ID"; break
    fi
    sleep 1
  done
) &
"""

_TEMPLATE = """#!/bin/bash
# tensoryard job {job_id} attempt {attempt} (key {key}); written by the Slurm executor.
set -u
attempt_dir={attempt_dir}
if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
  # requeued by Slurm (slurmrestd v0.0.38 cannot switch requeue off): a new attempt is the
  # control plane's call, from the last checkpoint; this run of the old one ends here
  echo "tensoryard: Slurm requeued job $SLURM_JOB_ID (restart $SLURM_RESTART_COUNT);" \
    "not running the attempt again (restarts are tensoryard's)"
  exit 75
fi
printf '{{"slurm_job_id": %s, "started_at": %s, "nodes": "%s"}}\\n' \\
  "$SLURM_JOB_ID" "$(date +%s)" "$SLURM_JOB_NODELIST" \\
  > "$attempt_dir/slurm-started.$SLURM_JOB_ID.json"
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$first" -o 2>/dev/null | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')
# torchrun reads its options from PET_* variables: a static rendezvous on the first node
export PET_MASTER_ADDR="${{addr:-$first}}"
export PET_MASTER_PORT=$(( {port_low} + SLURM_JOB_ID % {port_span} ))
export TYARD_NODE_COUNT="$SLURM_JOB_NUM_NODES"
step_pid=""
warned() {{
  echo "tensoryard: Slurm warned of the end of job $SLURM_JOB_ID ($1):" \\
    "SIGTERM to the workers (they checkpoint and stop)"
  scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || kill -TERM "$step_pid" 2>/dev/null
}}
trap 'warned USR1' USR1
trap 'warned TERM' TERM
echo "tensoryard: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST," \\
  "rendezvous $PET_MASTER_ADDR:$PET_MASTER_PORT"
srun --ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL \\
  bash -c 'export TYARD_NODE="$SLURMD_NODENAME" PET_NODE_RANK="$SLURM_NODEID"; exec "$@"' \\
  tyard-step {step} &
step_pid=$!
{cancel_watch}while :; do
  wait "$step_pid"; rc=$?
  kill -0 "$step_pid" 2>/dev/null || break  # a trapped signal interrupted the wait
done
printf '{{"slurm_job_id": %s, "exit_code": %s, "ended_at": %s}}\\n' \\
  "$SLURM_JOB_ID" "$rc" "$(date +%s)" > "$attempt_dir/.slurm-exit.json.tmp" \\
  && mv "$attempt_dir/.slurm-exit.json.tmp" "$attempt_dir/slurm-exit.json"
# cancelled from tensoryard: the workers stopped (checkpointed); Slurm's record says CANCELLED
[ -e "$attempt_dir/cancel.json" ] && scancel "$SLURM_JOB_ID"
exit "$rc"
"""


def _step(request: LaunchRequest, attempt_dir: Path, python: str) -> list[str]:
    """The command of each node's task (after `bash -c ... tyard-step`)."""
    spec = request.spec
    program = [str(RANK_WRAPPER), str(attempt_dir), *spec.command]
    if spec.launcher != "torchrun":
        if spec.resources.nodes != 1:
            raise ExecutorError(
                f"job {request.job_id}: a multi-node job needs launcher: torchrun "
                f"(resources.nodes={spec.resources.nodes})"
            )
        return [python, *program]  # rank.py: RANK unset -> rank 0
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(spec.resources.nodes),
        "--nproc-per-node", str(spec.resources.procs),
        # node rank, master address and port: PET_* variables set by the batch script
        # restarts belong to the control plane (a new attempt, from the last checkpoint)
        "--max-restarts", "0",
        "--log-dir", str(attempt_dir / "torchrun"),
        *program,
    ]  # fmt: skip


def batch_script(request: LaunchRequest, attempt_dir: Path, key: str, config: SlurmConfig) -> str:
    low, high = config.rendezvous_ports
    step = " ".join(shlex.quote(w) for w in _step(request, attempt_dir, config.python))
    return _TEMPLATE.format(
        job_id=request.job_id,
        attempt=request.attempt,
        key=key,
        attempt_dir=shlex.quote(str(attempt_dir)),
        port_low=low,
        port_span=high - low + 1,
        step=step,
        cancel_watch=_CANCEL_WATCH if config.rest else "",
    )


def sbatch_args(
    request: LaunchRequest,
    attempt_dir: Path,
    key: str,
    config: SlurmConfig,
    mapping: TeamMapping,
    *,
    fencing_epoch: int,
) -> list[str]:
    """sbatch's options for one attempt (the script path goes last, added by the caller)."""
    spec = request.spec
    res = spec.resources
    args = [
        "--parsable",
        f"--job-name={JOB_NAME_PREFIX}{key}",
        f"--comment=tensoryard job={request.job_id} attempt={request.attempt} key={key} "
        f"epoch={fencing_epoch}",
        f"--nodes={res.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={max(1, math.ceil(res.cpu))}",
        f"--mem={max(1, math.ceil(res.memory / _MIB))}M",
        f"--output={attempt_dir / 'launcher.log'}",
        f"--chdir={Path(spec.workdir) if spec.workdir else request.run_dir}",
        "--export=ALL",
        "--no-requeue",  # a new attempt is the control plane's call (from the last checkpoint)
        f"--signal=B:USR1@{config.signal_lead_s}",
    ]
    if res.gpus_per_node:
        args.append(f"--gres=gpu:{res.gpus_per_node}")
    if spec.max_runtime is not None:
        args.append(f"--time={max(1, math.ceil(float(spec.max_runtime) / 60))}")
    if mapping.partition:
        args.append(f"--partition={mapping.partition}")
    if mapping.qos:
        args.append(f"--qos={mapping.qos}")
    if mapping.account:
        args.append(f"--account={mapping.account}")
    if config.admission == "tensoryard" and request.placement:
        args.append(f"--nodelist={','.join(sorted(request.placement))}")
    args.extend(config.extra_sbatch_args)
    return args


@dataclass(frozen=True, kw_only=True)
class JobDescription:
    """One attempt's Slurm job as data: what sbatch_args says with options, for slurmrestd's
    job submission (each REST API version shapes it its own way: rest_api.py)."""

    script: str
    name: str
    comment: str
    nodes: int
    cpus_per_task: int
    memory_mib: int  # per node
    standard_output: str
    working_directory: str
    environment: Mapping[str, str] = field(default_factory=dict)
    gpus_per_node: int = 0
    time_limit_min: int | None = None
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    required_nodes: tuple[str, ...] = ()
    signal_lead_s: int = 120


def job_description(
    request: LaunchRequest,
    attempt_dir: Path,
    key: str,
    config: SlurmConfig,
    mapping: TeamMapping,
    *,
    fencing_epoch: int,
    environment: Mapping[str, str],
) -> JobDescription:
    """The same job as `sbatch_args` + `batch_script`, for a slurmrestd submission."""
    spec = request.spec
    res = spec.resources
    pinned = config.admission == "tensoryard" and request.placement
    return JobDescription(
        script=batch_script(request, attempt_dir, key, config),
        name=f"{JOB_NAME_PREFIX}{key}",
        comment=f"tensoryard job={request.job_id} attempt={request.attempt} key={key} "
        f"epoch={fencing_epoch}",
        nodes=res.nodes,
        cpus_per_task=max(1, math.ceil(res.cpu)),
        memory_mib=max(1, math.ceil(res.memory / _MIB)),
        standard_output=str(attempt_dir / "launcher.log"),
        working_directory=str(Path(spec.workdir) if spec.workdir else request.run_dir),
        environment=dict(environment),
        gpus_per_node=res.gpus_per_node,
        time_limit_min=(
            max(1, math.ceil(float(spec.max_runtime) / 60))
            if spec.max_runtime is not None
            else None
        ),
        partition=mapping.partition,
        qos=mapping.qos,
        account=mapping.account,
        required_nodes=tuple(sorted(request.placement)) if pinned else (),
        signal_lead_s=config.signal_lead_s,
    )
