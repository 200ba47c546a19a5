"""What the shim runs for one attempt: the command line and environment (launch.json)."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensoryard.agent.gpus import cuda_visible_devices
from tensoryard.errors import ExecutorError
from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.local.layout import AttemptLayout
from tensoryard.executors.local.procs import ATTEMPT_KEY_ENV

__all__ = [
    "DEFAULT_ENV_ALLOW",
    "RANK_WRAPPER",
    "LaunchPlan",
    "allowed_env",
    "build_plan",
    "python_path_with",
]

# What a job inherits from the control plane's environment: locale, paths, and the knobs of
# the GPU/NCCL stack that an operator sets machine-wide. Never tokens, cloud credentials,
# database URLs or TYARD_* settings of the control plane; a job gets its own from spec.env.
DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TERM",
    "TMPDIR",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "NCCL_*",
    "NVIDIA_*",
    "OPENBLAS_*",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)

RANK_WRAPPER = Path(__file__).with_name("rank.py")
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True)
class LaunchPlan:
    """The workload of one attempt, as the shim starts it."""

    launcher: str  # "torchrun" | "python"
    argv: list[str]
    env: dict[str, str]  # the complete environment of the workload
    cwd: str
    world_size: int
    attempt_key: str
    default_grace_s: float = DEFAULT_GRACE_S  # when the shim is SIGTERMed without a request

    def to_dict(self) -> dict[str, Any]:
        return {
            "launcher": self.launcher,
            "argv": self.argv,
            "env": self.env,
            "cwd": self.cwd,
            "world_size": self.world_size,
            "attempt_key": self.attempt_key,
            "default_grace_s": self.default_grace_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchPlan:
        try:
            return cls(
                launcher=str(data["launcher"]),
                argv=[str(a) for a in data["argv"]],
                env={str(k): str(v) for k, v in data["env"].items()},
                cwd=str(data["cwd"]),
                world_size=int(data["world_size"]),
                attempt_key=str(data["attempt_key"]),
                default_grace_s=float(data.get("default_grace_s", DEFAULT_GRACE_S)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ExecutorError(f"launch.json is incomplete or malformed: {exc!r}") from exc


def build_plan(
    request: LaunchRequest,
    layout: AttemptLayout,
    *,
    python: str,
    attempt_key: str,
    base_env: Mapping[str, str],
) -> LaunchPlan:
    """Turn a launch request into the exact command line and environment to run."""
    spec = request.spec
    if spec.resources.nodes != 1:
        raise ExecutorError(
            f"job {request.job_id}: the local executor runs single-node jobs but "
            f"resources.nodes={spec.resources.nodes} (fix: use nodes: 1, or a cluster executor)"
        )
    cwd = Path(spec.workdir) if spec.workdir else Path(request.run_dir)
    if not cwd.is_dir():
        raise ExecutorError(
            f"job {request.job_id}: workdir {cwd} does not exist on this machine "
            "(fix: set workdir to an existing directory)"
        )
    world = spec.resources.world_size
    if spec.launcher == "torchrun":
        argv = [
            python, "-m", "torch.distributed.run",
            "--nnodes", "1",
            "--nproc-per-node", str(spec.resources.procs),
            "--standalone",
            "--max-restarts", "0",  # restarts belong to the control plane (from checkpoints)
            "--log-dir", str(layout.torchrun_dir),
            str(RANK_WRAPPER), str(layout.dir),
            *spec.command,
        ]  # fmt: skip
    else:
        argv = [python, *spec.command]
    env = _job_env(request, base_env, attempt_key)
    return LaunchPlan(spec.launcher, argv, env, str(cwd.resolve()), world, attempt_key)


def _job_env(request: LaunchRequest, base: Mapping[str, str], attempt_key: str) -> dict[str, str]:
    """The allowed base environment, then spec.env, then the TYARD_* contract vars, then
    our own markers."""
    env = {**base, **request.spec.env, **request.env}
    env.setdefault("TYARD_JOB_ID", str(request.job_id))
    env.setdefault("TYARD_ATTEMPT", str(request.attempt))
    env.setdefault("TYARD_RUN_DIR", str(request.run_dir))
    env.setdefault("PYTHONUNBUFFERED", "1")  # rank logs are tailed live
    env[ATTEMPT_KEY_ENV] = attempt_key
    devices = cuda_visible_devices(request.placement, request.spec.resources.gpus_per_node)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env


def allowed_env(env: Mapping[str, str], allow: Sequence[str]) -> dict[str, str]:
    """The variables of `env` whose names match one of the `allow` patterns."""
    return {k: v for k, v in env.items() if any(fnmatch.fnmatchcase(k, p) for p in allow)}


def python_path_with(src_root: Path, env: Mapping[str, str] = os.environ) -> str:
    """PYTHONPATH with `src_root` first, so the shim imports this very tensoryard."""
    rest = env.get("PYTHONPATH", "")
    return f"{src_root}{os.pathsep}{rest}" if rest else str(src_root)
