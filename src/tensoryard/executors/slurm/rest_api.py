"""The JSON of Slurm's REST API, one small adapter per OpenAPI version (pure data, no I/O).

slurmrestd changes its JSON between versions: v0.0.38 (Slurm 22.05) takes plain numbers, an
environment object and a `signal` string; v0.0.40+ (Slurm 23.11 and later) wrap numbers in
{"set", "infinite", "number"}, take the environment as "K=V" strings, a node count as a string
and the early-warning signal as three fields. Each adapter turns a JobDescription into its
submission body and reads its nodes and partitions; `parse_jobs` (status.py) already reads the
job listings of every version.

Verified against a real slurmrestd: v0.0.38 only. v0.0.40 and v0.0.41 follow SchedMD's
published OpenAPI schemas and have not been run against a server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensoryard.errors import ExecutorError
from tensoryard.executors.slurm.cluster import SlurmNode, gpu_count, gpu_model
from tensoryard.executors.slurm.script import JobDescription

__all__ = ["DIALECTS", "Dialect", "PartitionInfo", "supported_versions"]


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    default: bool
    up: bool


def _set(number: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": number}


def _int(raw: Any) -> int:
    """A plain integer (v0.0.38) or a {"set", "number"} one (v0.0.40+); 0 when unset."""
    if isinstance(raw, Mapping):
        raw = raw.get("number") if raw.get("set", True) else 0
    try:
        return int(raw or 0)
    except (TypeError, ValueError):
        return 0


def _words(raw: Any) -> list[str]:
    if isinstance(raw, str):
        return [raw] if raw else []
    if isinstance(raw, list):
        return [str(w) for w in raw]
    return []


class Dialect:
    """The shapes of one OpenAPI version. Subclasses set `version` and override what differs."""

    version = ""
    pins_nodes = True  # the submission can name the nodes (required_nodes)

    def path(self, tail: str) -> str:
        return f"/slurm/{self.version}/{tail}"

    def submit_body(self, job: JobDescription) -> dict[str, Any]:
        raise NotImplementedError

    def submitted_id(self, answer: Mapping[str, Any]) -> int:
        """The new job's id from the submission's answer."""
        try:
            return int(_int(answer["job_id"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ExecutorError(
                f"slurmrestd {self.version} answered the submission without a job id: "
                f"{dict(answer)!r:.300}"
            ) from exc

    def node(self, raw: Mapping[str, Any]) -> SlurmNode:
        gres = str(raw.get("gres") or "")
        return SlurmNode(
            name=str(raw.get("name") or ""),
            cpus=_int(raw.get("cpus")),
            memory_mib=_int(raw.get("real_memory")),
            gpus=gpu_count(gres),
            state=self.node_state(raw),
            partitions=tuple(_words(raw.get("partitions"))),
            gpu_model=gpu_model(gres),
        )

    def node_state(self, raw: Mapping[str, Any]) -> str:
        """In scontrol's words: base state, then "+FLAG" for each flag ("IDLE+DRAIN")."""
        words = [w.upper() for w in _words(raw.get("state"))]
        words += [w.upper() for w in _words(raw.get("state_flags"))]
        return "+".join(words) or "UNKNOWN"

    def partition(self, raw: Mapping[str, Any]) -> PartitionInfo:
        raise NotImplementedError


class V0038(Dialect):
    """Slurm 22.05's v0.0.38 (the one run here). It has no field for a node list
    (`required_nodes` is refused as a disabled key), no batch-only warning signal (`B:` is
    refused in `signal`) and sets `requeue` to true whatever it is sent; the batch script
    refuses to run a requeued attempt again."""

    version = "v0.0.38"
    pins_nodes = False

    def submit_body(self, job: JobDescription) -> dict[str, Any]:
        if job.required_nodes:
            raise ExecutorError(
                "slurmrestd v0.0.38 cannot pin nodes (fix: set admission: slurm in the Slurm "
                "config, or submit with sbatch by removing rest_url)"
            )
        desc: dict[str, Any] = {
            "name": job.name,
            "comment": job.comment,
            # as sbatch's --nodes=N (the schema's [min, max] array comes out as one node)
            "nodes": str(job.nodes),
            "tasks_per_node": 1,
            "cpus_per_task": job.cpus_per_task,
            "memory_per_node": job.memory_mib,
            "standard_output": job.standard_output,
            "current_working_directory": job.working_directory,
            "environment": dict(job.environment),
            "requeue": False,
            # steps only: the workers get SIGTERM, checkpoint and stop (what the batch
            # script's USR1 trap does in sbatch mode)
            "signal": f"TERM@{job.signal_lead_s}",
        }
        if job.gpus_per_node:
            desc["gres"] = f"gpu:{job.gpus_per_node}"
        if job.time_limit_min is not None:
            desc["time_limit"] = job.time_limit_min
        for key in ("partition", "qos", "account"):
            if getattr(job, key):
                desc[key] = getattr(job, key)
        return {"script": job.script, "job": desc}

    def partition(self, raw: Mapping[str, Any]) -> PartitionInfo:
        flags = {w.lower() for w in _words(raw.get("flags"))}
        return PartitionInfo(
            name=str(raw.get("name") or ""),
            default="default" in flags,
            up=str(raw.get("state") or "").upper() == "UP",
        )


class V0040(Dialect):
    """Slurm 23.11's v0.0.40 (from SchedMD's published schema; not run here)."""

    version = "v0.0.40"
    script_in_job = False  # v0.0.40 takes the script beside the job; v0.0.41 inside it

    def submit_body(self, job: JobDescription) -> dict[str, Any]:
        desc: dict[str, Any] = {
            "name": job.name,
            "comment": job.comment,
            "nodes": str(job.nodes),
            "tasks_per_node": 1,
            "cpus_per_task": job.cpus_per_task,
            "memory_per_node": _set(job.memory_mib),
            "standard_output": job.standard_output,
            "current_working_directory": job.working_directory,
            "environment": [f"{k}={v}" for k, v in job.environment.items()],
            "requeue": False,
            "kill_warning_signal": "USR1",
            "kill_warning_flags": ["BATCH_JOB"],  # sbatch's --signal=B:USR1@LEAD
            "kill_warning_delay": _set(job.signal_lead_s),
        }
        if job.gpus_per_node:
            desc["tres_per_node"] = f"gres/gpu:{job.gpus_per_node}"
        if job.time_limit_min is not None:
            desc["time_limit"] = _set(job.time_limit_min)
        for key in ("partition", "qos", "account"):
            if getattr(job, key):
                desc[key] = getattr(job, key)
        if job.required_nodes:
            desc["required_nodes"] = list(job.required_nodes)
        if self.script_in_job:
            return {"job": {**desc, "script": job.script}}
        return {"script": job.script, "job": desc}

    def partition(self, raw: Mapping[str, Any]) -> PartitionInfo:
        inner = raw.get("partition")
        states = _words(inner.get("state")) if isinstance(inner, Mapping) else []
        flags = {w.upper() for w in _words(raw.get("flags"))}
        flags |= {w.upper() for w in states}
        return PartitionInfo(
            name=str(raw.get("name") or ""),
            default="DEFAULT" in flags,
            up="UP" in flags,
        )


class V0041(V0040):
    """Slurm 24.05's v0.0.41 (from SchedMD's published schema; not run here)."""

    version = "v0.0.41"
    script_in_job = True


DIALECTS: dict[str, Dialect] = {d.version: d for d in (V0041(), V0040(), V0038())}


def supported_versions() -> list[str]:
    """Newest first."""
    return sorted(DIALECTS, key=_version_key, reverse=True)


def _version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.lstrip("v").split("."))
    except ValueError:
        return (-1,)
