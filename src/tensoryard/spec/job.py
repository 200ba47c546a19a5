"""JobSpec: what a researcher submits. Validated once at the edge (CLI, API)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from tensoryard import envvars
from tensoryard.errors import FieldIssue, SpecError
from tensoryard.spec._common import (
    StrictModel,
    load_yaml_text,
    parse_duration_s,
    parse_memory_bytes,
    read_spec_file,
    spec_error_from_validation,
)
from tensoryard.spec.megatron import recognise

__all__ = [
    "CheckpointSpec",
    "HealthSpec",
    "JobSpec",
    "KeepBestSpec",
    "ResourcesSpec",
    "RestartPolicy",
    "SchedulingSpec",
    "VolumeSpec",
    "load_job_spec",
    "mounts_overlap",
    "parse_job_spec",
]

NAME_PATTERN = r"^[a-z][a-z0-9-]{0,62}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
METRIC_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]{0,127}$"
# A PersistentVolumeClaim's name: a DNS-1123 subdomain (lowercase, digits, '-' and '.').
CLAIM_PATTERN = r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$"
# Where the platform mounts its own things in a training container: no volume goes there.
RESERVED_MOUNTS = ("/dev", "/proc", "/sys", "/opt/tensoryard", "/etc", "/usr", "/bin", "/lib")
MAX_VOLUMES = 16

# Sanity ceilings: beyond these a value is a typo, not a request.
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 16
MAX_PROCS_PER_NODE = 256
MAX_CPU = 1024
MAX_MEMORY = 64 * 1024**4  # 64 TiB

Bytes = Annotated[int, BeforeValidator(parse_memory_bytes)]
Seconds = Annotated[float, BeforeValidator(parse_duration_s)]


class ResourcesSpec(StrictModel):
    """What one job needs: a gang of `nodes` identical workers."""

    nodes: int = Field(1, ge=1, le=MAX_NODES, description="Number of nodes (all or nothing).")
    gpus_per_node: int = Field(
        0, ge=0, le=MAX_GPUS_PER_NODE, description="GPUs on each node; 0 runs on the CPU."
    )
    processes_per_node: int | None = Field(
        None,
        ge=1,
        le=MAX_PROCS_PER_NODE,
        description="Worker processes per node; defaults to gpus_per_node (or 1 on the CPU).",
    )
    cpu: float = Field(1.0, gt=0, le=MAX_CPU, description="CPU cores per node.")
    memory: Bytes = Field(
        2 * 1024**3, ge=1, le=MAX_MEMORY, description="Memory per node, like '16Gi'."
    )

    @model_validator(mode="after")
    def _procs_match_gpus(self) -> ResourcesSpec:
        if self.processes_per_node is None:
            self.processes_per_node = self.gpus_per_node or 1
        if self.gpus_per_node and self.processes_per_node not in (1, self.gpus_per_node):
            raise ValueError(
                f"processes_per_node={self.processes_per_node} with gpus_per_node="
                f"{self.gpus_per_node} (fix: use one process per GPU, i.e. "
                f"processes_per_node: {self.gpus_per_node}, or 1 for a single controller)"
            )
        return self

    @property
    def procs(self) -> int:
        """Processes per node, with the default applied."""
        return self.processes_per_node or (self.gpus_per_node or 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _keep_best_mapping(value: Any) -> Any:
    if isinstance(value, str | int | float | list):
        raise ValueError(
            f"{value!r} is not a mapping (fix: keep_best: {{metric: eval_loss, mode: min, "
            "count: 1})"
        )
    return value


class KeepBestSpec(StrictModel):
    """Keep the `count` best checkpoints by a metric the job reports at the checkpoint's step."""

    metric: str = Field(
        ..., description="A metric the job reports at its checkpoint steps, like eval_loss."
    )
    mode: Literal["min", "max"] = Field(
        "min", description="min: lower is better (a loss); max: higher is better (accuracy)."
    )
    count: int = Field(1, ge=1, le=1000, description="How many of the best to keep.")

    @field_validator("metric")
    @classmethod
    def _metric_name(cls, value: str) -> str:
        if not re.match(METRIC_PATTERN, value):
            raise ValueError(
                f"{value!r} is not a metric name (fix: the name the job reports, like "
                "eval_loss: letters, digits, '_', '.', '/' or '-', at most 128)"
            )
        return value


class CheckpointSpec(StrictModel):
    """Where the job keeps checkpoints, how often the runtime writes one and which to keep.

    Retention: a checkpoint kept by any of `keep`, `keep_best` and `keep_every` stays; the
    newest one and any promoted to a model version always stay. The control plane applies it
    whenever the job reports a checkpoint (docs/artifacts.md)."""

    dir: str | None = Field(
        None, description="Checkpoint directory; defaults to the job's run directory."
    )
    interval: int = Field(50, ge=1, le=10_000_000, description="Write a checkpoint every N steps.")
    keep: int = Field(3, ge=1, le=1000, description="Keep the last K checkpoints.")
    keep_best: Annotated[KeepBestSpec | None, BeforeValidator(_keep_best_mapping)] = Field(
        None,
        description="Also keep the best checkpoints by a metric, like "
        "{metric: eval_loss, mode: min, count: 1}.",
    )
    keep_every: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="Also keep every checkpoint whose step is a multiple of this, like 1000.",
    )
    auto_interval: bool = Field(
        False,
        description="On each restart, use the Young/Daly interval computed from the failures "
        "seen and the measured save cost (interval is the first attempt's).",
    )
    async_save: bool = Field(
        False, description="Save in the background: training waits only for a CPU snapshot."
    )
    layout: Literal["auto", "full", "sharded"] = Field(
        "auto",
        description="auto: sharded (torch.distributed.checkpoint) for FSDP/DTensor models, "
        "full (rank 0) otherwise.",
    )


class RestartPolicy(StrictModel):
    """How failures are retried: restart from the latest checkpoint up to max_restarts times."""

    max_restarts: int = Field(3, ge=0, le=1000)
    backoff: Seconds = Field(2.0, ge=0, le=3600, description="Wait before a restart, like '10s'.")
    in_place: int = Field(
        0,
        ge=0,
        le=100,
        description="Of max_restarts, how many may restart the workers inside the running "
        "torchrun (same processes' allocation, no new launch, no backoff); single-node torchrun "
        "jobs on the local executor. Each one counts against max_restarts.",
    )


class HealthSpec(StrictModel):
    """When the control plane calls a running attempt hung, and what it does then."""

    heartbeat_timeout: Seconds | None = Field(
        None,
        gt=0,
        le=7 * 86400,
        description="No heartbeat for this long means hung, like '5m' (default: the server's).",
    )
    stall_factor: float = Field(
        10.0,
        ge=2,
        le=1000,
        description="No new step for this many times the median step time means hung.",
    )
    min_stall: Seconds = Field(
        300.0,
        ge=1,
        le=7 * 86400,
        description="Never call a stall a hang before this long without a step, like '5m'.",
    )
    on_hang: Literal["restart", "warn"] = Field(
        "restart",
        description="restart: stop the attempt (checkpoint signal first) and restart it; "
        "warn: only record an event.",
    )
    hang_grace: Seconds = Field(
        2.0,
        ge=0,
        le=3600,
        description="Seconds a hung attempt gets between SIGTERM and SIGKILL, like '2s'. Its "
        "ranks wait in a collective and cannot checkpoint, so waiting the full cancel grace "
        "only delays the restart from the last checkpoint.",
    )


class SchedulingSpec(StrictModel):
    """Hints for the scheduler."""

    gpu_model: str | None = Field(None, description="Required GPU model, like 'H100'.")
    topology: Literal["none", "preferred", "required"] = Field(
        "preferred", description="Keep a multi-node gang under one leaf switch."
    )
    preemptible: bool = Field(True, description="May be preempted (after a checkpoint grace).")


def mounts_overlap(a: str, b: str) -> bool:
    """Whether two mount paths are the same directory or one lies under the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


class VolumeSpec(StrictModel):
    """A PersistentVolumeClaim mounted into every pod of the job (Kubernetes executor): a
    dataset, a shared cache, a team's checkpoint area."""

    claim: str = Field(
        ..., description="Name of a PersistentVolumeClaim in the cluster's namespace."
    )
    mount: str = Field(..., description="Absolute path where the pods see it, like /data.")
    read_only: bool = Field(False, description="Mount it read-only (a shared dataset).")

    @field_validator("claim")
    @classmethod
    def _claim_name(cls, value: str) -> str:
        if not re.match(CLAIM_PATTERN, value):
            raise ValueError(
                f"{value!r} is not a PersistentVolumeClaim name (fix: the name `kubectl get "
                "pvc` shows: lowercase letters, digits, '-' and '.')"
            )
        return value

    @field_validator("mount")
    @classmethod
    def _absolute_mount(cls, value: str) -> str:
        path = value.rstrip("/") or "/"
        if not path.startswith("/") or path == "/":
            raise ValueError(f"{value!r} is not an absolute directory (fix: a path like /data)")
        if any(part in (".", "..") for part in path.split("/")):
            raise ValueError(f"{value!r} has '.' or '..' in it (fix: a plain path like /data)")
        for reserved in RESERVED_MOUNTS:
            if path == reserved or path.startswith(reserved + "/"):
                raise ValueError(
                    f"{value!r} is under {reserved}, which the image or the platform uses "
                    "(fix: mount it elsewhere, like /data)"
                )
        return path


class JobSpec(StrictModel):
    """A training job: a gang of processes running `command` under a launcher."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Job name (lowercase, digits, '-').")
    team: str = Field("default", pattern=NAME_PATTERN, description="Team whose queue runs it.")
    user: str = Field("anonymous", min_length=1, max_length=128)
    priority: int = Field(0, ge=-1000, le=1000, description="Higher runs first.")
    resources: ResourcesSpec = Field(default_factory=lambda: ResourcesSpec())
    launcher: Literal["torchrun", "python"] = Field("torchrun")
    command: list[str] = Field(..., min_length=1, description="Script and arguments.")
    framework: Literal["auto", "megatron", "none"] = Field(
        "auto",
        description="megatron: a Megatron-LM/Megatron-Core job: resume arguments passed on "
        "restart, its checkpoints and progress followed (docs/goodput.md); auto: recognised "
        "from Megatron-only arguments in the command; none: never.",
    )
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variable -> name of a secret of the job's team, injected at "
        "launch (`tyard secrets set TEAM NAME`); the value never appears in the spec.",
    )
    workdir: str | None = Field(None, description="Working directory; defaults to the spec's.")
    image: str | None = Field(None, description="Container image (cluster executors only).")
    volumes: list[VolumeSpec] = Field(
        default_factory=list,
        max_length=MAX_VOLUMES,
        description="PersistentVolumeClaims mounted into every pod (Kubernetes executor only).",
    )
    checkpoint: CheckpointSpec = Field(default_factory=lambda: CheckpointSpec())
    restart: RestartPolicy = Field(default_factory=lambda: RestartPolicy())
    max_runtime: Seconds | None = Field(
        None, gt=0, description="Stop after this much run time (all attempts), like '2h'."
    )
    health: HealthSpec = Field(default_factory=lambda: HealthSpec())
    scheduling: SchedulingSpec = Field(default_factory=lambda: SchedulingSpec())

    @field_validator("secrets")
    @classmethod
    def _secret_refs(cls, value: dict[str, str]) -> dict[str, str]:
        for env, name in value.items():
            if env.upper().startswith(envvars.PREFIX):
                raise ValueError(
                    f"{env!r}: TYARD_* variables are the control plane's (fix: another name)"
                )
            if not re.match(ENV_NAME_PATTERN, env):
                raise ValueError(
                    f"{env!r} is not an environment variable name (fix: use A-Z, 0-9 and '_')"
                )
            if not re.match(NAME_PATTERN, name):
                raise ValueError(
                    f"{name!r} is not a secret name (fix: lowercase letters, digits and '-')"
                )
        return value

    @field_validator("volumes")
    @classmethod
    def _separate_mounts(cls, value: list[VolumeSpec]) -> list[VolumeSpec]:
        mounts = [v.mount for v in value]
        for i, mount in enumerate(mounts):
            for other in mounts[:i]:
                if mounts_overlap(mount, other):
                    raise ValueError(
                        f"volumes mount {other} and {mount} overlap (fix: give each volume "
                        "its own directory)"
                    )
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: Any) -> Any:
        if isinstance(value, str):
            return shlex.split(value)
        return value

    @field_validator("command")
    @classmethod
    def _non_empty_command(cls, value: list[str]) -> list[str]:
        if not value or not value[0].strip():
            raise ValueError("command is empty (fix: give the script to run, like ['train.py'])")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): v if isinstance(v, str) else str(v) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _launcher_fits_resources(self) -> JobSpec:
        if self.launcher == "python" and self.resources.world_size > 1:
            raise ValueError(
                "launcher 'python' runs a single process but resources ask for "
                f"{self.resources.world_size} (fix: use launcher: torchrun, or one node and "
                "processes_per_node: 1)"
            )
        self._megatron_fits()
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(
                f"{', '.join(both)} is set in both env and secrets (fix: keep it in one of them)"
            )
        return self

    def _megatron_fits(self) -> None:
        args = recognise(self.command, self.framework)
        if args is None:
            return
        if self.launcher != "torchrun":
            raise ValueError(
                "a Megatron job runs under torchrun, but launcher is "
                f"{self.launcher!r} (fix: launcher: torchrun, or framework: none if this is "
                "not Megatron)"
            )
        if self.restart.in_place:
            raise ValueError(
                "restart.in_place is not available for Megatron jobs: torchrun would restart "
                "the workers with the launch's arguments, without --load (fix: in_place: 0; "
                "a restart relaunches with the resume arguments)"
            )
        if args.save is not None and self.checkpoint.dir is not None:
            raise ValueError(
                f"checkpoint.dir ({self.checkpoint.dir}) and the command's --save "
                f"({args.save}) both name this Megatron job's checkpoint directory (fix: keep "
                "one of them)"
            )


def parse_job_spec(data: Any, *, source: str = "") -> JobSpec:
    """Validate a mapping into a JobSpec, or raise SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError(
            [FieldIssue("", "a job spec must be a mapping of fields", "start with 'name: ...'")],
            source=source,
        )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source=source) from exc


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a YAML file into a JobSpec; `workdir` defaults to the file's directory."""
    file = Path(path)
    text = read_spec_file(file)
    data = load_yaml_text(text, source=str(file))
    spec = parse_job_spec(data, source=str(file))
    if spec.workdir is None:
        spec.workdir = str(file.resolve().parent)
    elif not Path(spec.workdir).is_absolute():
        spec.workdir = str((file.resolve().parent / spec.workdir).resolve())
    return spec
