"""What the shim runs for one attempt: the command line and environment (launch.json)."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensoryard import envvars
from tensoryard.errors import ExecutorError
from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.local.gang import gang_argv
from tensoryard.executors.local.gpus import cuda_visible_devices
from tensoryard.executors.local.layout import AttemptLayout
from tensoryard.executors.local.netns import NetnsNodes
from tensoryard.runtime.stacks import STACKS_ENV

__all__ = [
    "DEFAULT_ENV_ALLOW",
    "RANK_WRAPPER",
    "LaunchPlan",
    "RunAs",
    "allowed_env",
    "build_plan",
    "python_path_with",
    "run_as_for",
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
class RunAs:
    """A Unix account to run a workload as (when the control plane runs as root)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def lookup(cls, name: str) -> RunAs | None:
        """The account called `name`, or None when this machine has none."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        groups = tuple(os.getgrouplist(name, entry.pw_gid))
        return cls(name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "uid": self.uid,
            "gid": self.gid,
            "groups": list(self.groups),
            "home": self.home,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunAs:
        return cls(
            str(data["name"]),
            int(data["uid"]),
            int(data["gid"]),
            tuple(int(g) for g in data.get("groups", ())),
            str(data.get("home", "/")),
        )


def run_as_for(user: str, *, enabled: bool) -> RunAs | None:
    """Whom a job of platform user `user` runs as on this machine.

    Only a control plane running as root can choose: then a job runs as the Unix account of the
    same name when one exists (never as root for somebody else's account); without such an
    account it runs as the control plane's own user, and the executor says so. A control
    plane running as an ordinary user runs every job as itself."""
    if not enabled or os.geteuid() != 0:
        return None
    account = RunAs.lookup(user)
    if account is None or account.uid == 0:
        return None
    return account


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
    run_as: RunAs | None = None  # the Unix account the workload runs as (None: the shim's)

    def to_dict(self) -> dict[str, Any]:
        return {
            "launcher": self.launcher,
            "argv": self.argv,
            "env": self.env,
            "cwd": self.cwd,
            "world_size": self.world_size,
            "attempt_key": self.attempt_key,
            "default_grace_s": self.default_grace_s,
            "run_as": None if self.run_as is None else self.run_as.to_dict(),
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
                run_as=RunAs.from_dict(data["run_as"]) if data.get("run_as") else None,
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
    run_as: RunAs | None = None,
    netns: NetnsNodes | None = None,
) -> LaunchPlan:
    """Turn a launch request into the exact command line and environment to run; a
    multi-node job needs ``netns`` (its nodes' network namespaces: one torchrun per node)."""
    spec = request.spec
    if spec.resources.nodes != 1 and netns is None:
        raise ExecutorError(
            f"job {request.job_id}: the local executor runs single-node jobs but "
            f"resources.nodes={spec.resources.nodes} (fix: use nodes: 1, a cluster executor, or "
            "`tyard server --local-nodes A,B --node-netns` for network-namespace nodes)"
        )
    cwd = Path(spec.workdir) if spec.workdir else Path(request.run_dir)
    if not cwd.is_dir():
        raise ExecutorError(
            f"job {request.job_id}: workdir {cwd} does not exist on this machine "
            "(fix: set workdir to an existing directory)"
        )
    world = spec.resources.world_size
    if spec.resources.nodes > 1:
        argv = _gang_argv(request, layout, python, netns)
    elif spec.launcher == "torchrun":
        argv = [
            python, "-m", "torch.distributed.run",
            "--nnodes", "1",
            "--nproc-per-node", str(spec.resources.procs),
            "--standalone",
            # Restarts belong to the control plane (from checkpoints), except the in-place ones
            # it granted this launch: each restarted group reports as the next attempt.
            "--max-restarts", str(max(0, request.in_place_restarts)),
            "--log-dir", str(layout.torchrun_dir),
            str(RANK_WRAPPER), str(layout.dir),
            *spec.command,
        ]  # fmt: skip
    else:
        argv = [python, *spec.command]
    env = _job_env(request, base_env, attempt_key)
    env.setdefault(STACKS_ENV, str(layout.dir))  # rank-R.stacks.txt on a hang (runtime.stacks)
    if run_as is not None:
        env.update(USER=run_as.name, LOGNAME=run_as.name, HOME=run_as.home)
    return LaunchPlan(
        spec.launcher, argv, env, str(cwd.resolve()), world, attempt_key, run_as=run_as
    )


def _gang_argv(
    request: LaunchRequest, layout: AttemptLayout, python: str, netns: NetnsNodes | None
) -> list[str]:
    """A multi-node torchrun job: one torchrun per placed node, in its namespace (gang.py)."""
    spec = request.spec
    assert netns is not None
    if spec.launcher != "torchrun":
        raise ExecutorError(
            f"job {request.job_id}: a multi-node job needs launcher: torchrun "
            f"(resources.nodes={spec.resources.nodes})"
        )
    missing = [n for n in request.placement if n not in netns]
    if missing or len(request.placement) != spec.resources.nodes:
        raise ExecutorError(
            f"job {request.job_id}: placed on {', '.join(request.placement) or 'no node'}, but "
            f"only {', '.join(netns.nodes)} are network-namespace nodes here"
        )
    plan = {
        "python": python,
        "nodes": [
            {"name": n.name, "netns": n.netns, "ip": n.ip}
            for n in (netns.nodes[name] for name in request.placement)
        ],
        "host_ip": netns.host_ip,
        # any port: it is node 0's namespace's own port space
        "master_port": 29400 + int(hashlib.sha256(layout.dir.name.encode()).hexdigest(), 16) % 500,
        "procs": spec.resources.procs,
        # in-place restarts: every node's torchrun restarts its workers together (c10d
        # rendezvous), each restarted round reporting as the next attempt (rank.py)
        "max_restarts": max(0, request.in_place_restarts),
        "rdzv_id": layout.dir.name,
        "log_dir": str(layout.torchrun_dir),
        "program": [str(RANK_WRAPPER), str(layout.dir), *spec.command],
    }
    return gang_argv(python, plan)


def _job_env(request: LaunchRequest, base: Mapping[str, str], attempt_key: str) -> dict[str, str]:
    """The allowed base environment, then spec.env, then the TYARD_* contract vars, then
    our own markers."""
    env = {**base, **request.spec.env, **request.env}
    env.setdefault(envvars.JOB_ID.name, str(request.job_id))
    env.setdefault(envvars.ATTEMPT.name, str(request.attempt))
    env.setdefault(envvars.RUN_DIR.name, str(request.run_dir))
    env.setdefault("PYTHONUNBUFFERED", "1")  # rank logs are tailed live
    env[envvars.ATTEMPT_KEY.name] = attempt_key
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
