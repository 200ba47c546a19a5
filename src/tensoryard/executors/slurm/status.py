"""Slurm's view of a job, parsed from `squeue --json` (OpenAPI v0.0.38 and later), and its
translation into the executor protocol's phases and pending reasons.

Pure functions over plain data: the tests feed them JSON recorded from a real cluster.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tensoryard.errors import ExecutorError

__all__ = [
    "JOB_NAME_PREFIX",
    "SlurmJob",
    "decode_wait_status",
    "describe_exit",
    "jobs_by_key",
    "parse_jobs",
    "pending_reason",
]

JOB_NAME_PREFIX = "tyard."  # + attempt key: how every attempt is found again in the queue

PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
ALIVE_STATES = PENDING_STATES | {"RUNNING", "SUSPENDED", "COMPLETING", "STOPPED", "SIGNALING"}

# Slurm's pending reasons (squeue's state_reason), in the platform's words; Slurm's own word is
# always kept next to them. Reasons not listed are shown as Slurm words them.
_REASONS: dict[str, str] = {
    "Resources": "the nodes or GPUs it asks for are in use",
    "Priority": "jobs of higher priority are ahead of it in the partition",
    "Dependency": "it waits for a job it depends on",
    "BeginTime": "its start time has not come",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "NodeDown": "a node it needs is down",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows",
    "PartitionTimeLimit": "its time limit is above its partition's",
    "PartitionConfig": "its partition's settings do not allow it",
    "Reservation": "it waits for its reservation to start",
    "JobHeldUser": "it is held by its user (scontrol release)",
    "JobHeldAdmin": "it is held by an administrator",
    "launch_failed_requeued_held": "its launch failed and Slurm held it",
    "BadConstraints": "its constraints can never be met",
    "QOSMaxGRESPerUser": "the QOS's limit of GPUs per user is reached",
    "QOSMaxJobsPerUserLimit": "the QOS's limit of running jobs per user is reached",
    "QOSMaxNodePerUserLimit": "the QOS's limit of nodes per user is reached",
    "QOSGrpGRES": "the QOS's GPU limit is reached",
    "QOSGrpCpuLimit": "the QOS's CPU limit is reached",
    "QOSGrpNodeLimit": "the QOS's node limit is reached",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above the QOS's",
    "QOSNotAllowed": "its QOS is not allowed in this partition or account",
    "InvalidQOS": "its QOS does not exist",
    "InvalidAccount": "its account does not exist",
    "AssocGrpGRES": "the account's GPU limit is reached",
    "AssocGrpCpuLimit": "the account's CPU limit is reached",
    "AssocGrpNodeLimit": "the account's node limit is reached",
    "AssocMaxJobsLimit": "the account's limit of running jobs is reached",
    "AssocGrpJobsLimit": "the account's limit of running jobs is reached",
    "AssocGrpBillingMinutes": "the account's compute budget is spent",
}


@dataclass(frozen=True)
class SlurmJob:
    """The fields of one `squeue --json` job that the executor uses."""

    job_id: int
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str  # state_reason: "None", "Resources", "NonZeroExitCode", ...
    exit_code: int | None  # the raw wait status Slurm stores (see decode_wait_status)
    nodes: str  # "n[1-2]" once allocated
    comment: str
    partition: str
    start_time: float | None
    end_time: float | None
    description: str = ""  # state_description: Slurm's longer words, when it has them

    @property
    def alive(self) -> bool:
        return self.state in ALIVE_STATES

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def attempt_key(self) -> str | None:
        return (
            self.name.removeprefix(JOB_NAME_PREFIX)
            if self.name.startswith(JOB_NAME_PREFIX)
            else None
        )


def _state(raw: Any) -> str:
    # v0.0.38 gives a string; v0.0.40+ a list of flags ("RUNNING", "COMPLETING", ...)
    if isinstance(raw, list):
        states = [str(s) for s in raw]
        return next((s for s in states if s in ALIVE_STATES or s not in _FLAGS), "UNKNOWN")
    return str(raw or "UNKNOWN")


_FLAGS = frozenset({"COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT"})


def _number(raw: Any) -> int | None:
    """An integer field: plain in v0.0.38; {"set": bool, "number": n} in v0.0.40+."""
    if isinstance(raw, Mapping):
        if not raw.get("set", True) or raw.get("infinite"):
            return None
        raw = raw.get("number")
    if raw is None or isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _exit_code(raw: Any) -> int | None:
    # v0.0.38: the raw wait status as an integer; v0.0.40+: {"return_code": .., "signal": ..}
    if isinstance(raw, Mapping) and ("return_code" in raw or "signal" in raw):
        sig = raw.get("signal") or {}
        number = _number(sig.get("id")) if isinstance(sig, Mapping) else None
        if number:
            return number & 0x7F
        code = _number(raw.get("return_code"))
        return None if code is None else (code & 0xFF) << 8
    return _number(raw)


def _time(raw: Any) -> float | None:
    value = _number(raw)
    return float(value) if value else None


def parse_jobs(data: Mapping[str, Any]) -> list[SlurmJob]:
    """Every job of one `squeue --json` answer. Raises ExecutorError on errors Slurm reported
    or on a shape it does not know."""
    errors = data.get("errors") or []
    if errors:
        words = "; ".join(str(e.get("error") or e.get("description") or e) for e in errors)
        raise ExecutorError(f"squeue reported: {words}")
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        raise ExecutorError("squeue --json answered without a list of jobs (not Slurm's OpenAPI?)")
    out = []
    for raw in jobs:
        try:
            out.append(
                SlurmJob(
                    job_id=int(_number(raw["job_id"]) or 0),
                    name=str(raw.get("name") or ""),
                    state=_state(raw.get("job_state")),
                    reason=str(raw.get("state_reason") or "None"),
                    exit_code=_exit_code(raw.get("exit_code")),
                    nodes=str(raw.get("nodes") or ""),
                    comment=str(raw.get("comment") or ""),
                    partition=str(raw.get("partition") or ""),
                    start_time=_time(raw.get("start_time")),
                    end_time=_time(raw.get("end_time")),
                    description=str(raw.get("state_description") or ""),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ExecutorError(
                f"squeue --json: a job entry has an unknown shape ({exc!r})"
            ) from exc
    return out


def jobs_by_key(jobs: Iterable[SlurmJob]) -> dict[str, list[SlurmJob]]:
    """tensoryard's jobs by attempt key (newest Slurm job last); other users' jobs left out."""
    out: dict[str, list[SlurmJob]] = {}
    for job in sorted(jobs, key=lambda j: j.job_id):
        key = job.attempt_key
        if key:
            out.setdefault(key, []).append(job)
    return out


def decode_wait_status(status: int) -> int:
    """Slurm's exit_code is a wait(2) status: the exit code as a process sees it (-N: killed
    by signal N), e.g. 768 -> 3, 9 -> -9 (SIGKILL), 0 -> 0."""
    if status & 0x7F:
        return -(status & 0x7F)
    return (status >> 8) & 0xFF


def describe_exit(code: int) -> str:
    """'exited with code 3' / 'killed by SIGKILL'."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


def pending_reason(job: SlurmJob) -> str:
    """Why a pending job waits, in the platform's words with Slurm's kept:
    'pending in Slurm: the nodes or GPUs it asks for are in use (Slurm reason: Resources)'."""
    word = job.reason
    if word in ("", "None"):
        return "pending in Slurm (submitted; not yet considered by its scheduler)"
    text = _REASONS.get(word)
    if text is None:
        return f"pending in Slurm (Slurm reason: {word})"
    return f"pending in Slurm: {text} (Slurm reason: {word})"
