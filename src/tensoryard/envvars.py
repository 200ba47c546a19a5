"""The ``TYARD_*`` environment contract, declared once.

Every environment variable tensoryard sets or reads is declared here: its name, its type, its
default, who sets it, who reads it and one line of what it means. Code reads a variable through
its typed accessor (``envvars.HOME.get()``) and sets one by its name (``{envvars.NODE.name:
...}``) instead of spelling ``"TYARD_..."`` in a string; a unit test fails on a ``TYARD_`` string
literal anywhere else in the package, and ``docs/environment.md`` is generated from this module
(``python -m tensoryard.envvars --markdown``).

This module sits at the bottom of the import graph: it imports only the standard library and
:mod:`tensoryard.errors`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from tensoryard.errors import ConfigError, TensoryardError

__all__ = [
    "DEFAULT_PORT",
    "PREFIX",
    "PREFIXES",
    "VARIABLES",
    "EnvVar",
    "default_home",
    "markdown",
]

T = TypeVar("T")

DEFAULT_PORT = 8642
"""The control plane's default port (``tyard server``; clients fall back to it on loopback)."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

PREFIX = "TYARD_"
"""Every variable of the contract starts with it; a job's own ``env`` may not (spec/job.py)."""


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One variable of the contract.

    ``get(environ)`` reads it (``os.environ`` by default): unset or blank gives ``default``;
    a value that does not parse, or is below ``minimum``, raises ``error`` (ConfigError unless
    the caller names another, e.g. the in-job runtime's RuntimeSetupError) naming the variable
    and the fix."""

    name: str
    kind: str  # str | int | float | bool | path
    default: T | None
    set_by: str
    read_by: str
    doc: str
    minimum: float | None = None

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The text as set (stripped), or None when unset or blank."""
        value = (os.environ if environ is None else environ).get(self.name, "").strip()
        return value or None

    def present(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.raw(environ) is not None

    def get(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        error: type[TensoryardError] = ConfigError,
    ) -> T | None:
        text = self.raw(environ)
        if text is None:
            return self.default
        return self._parse(text, error)  # type: ignore[return-value]

    def value(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        error: type[TensoryardError] = ConfigError,
    ) -> T:
        """Like :meth:`get`, for a variable that must be there: unset and without a default
        raises ``error``."""
        got = self.get(environ, error=error)
        if got is None:
            raise error(f"{self.name} is not set (fix: {self.set_by} sets it; {self.doc})")
        return got

    def _parse(self, text: str, error: type[TensoryardError]) -> object:
        name, low = self.name, self.minimum
        if self.kind == "int":
            try:
                number: float = int(text)
            except ValueError as exc:
                raise error(
                    f"{name}={text!r} is not an integer (fix: set {name} to a whole number"
                    + (f" >= {low:g})" if low is not None else ")")
                ) from exc
        elif self.kind == "float":
            try:
                number = float(text)
            except ValueError as exc:
                raise error(
                    f"{name}={text!r} is not a number (fix: set {name} to a number"
                    + (f" >= {low:g})" if low is not None else ")")
                ) from exc
        elif self.kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise error(f"{name}={text!r} is not a boolean (fix: set {name} to 1 or 0)")
        elif self.kind == "path":
            return Path(text).expanduser()
        else:
            return text
        if low is not None and not number >= low:  # also rejects NaN
            shown = f"{number:g}" if self.kind == "float" else str(number)
            raise error(f"{name}={shown} is below {low:g} (fix: set {name} >= {low:g})")
        return number


VARIABLES: dict[str, EnvVar[Any]] = {}
PREFIXES: dict[str, str] = {}  # name prefix -> doc, for families like TYARD_INPUT_<NAME>


def _var(
    name: str,
    kind: str,
    default: T | None = None,
    *,
    set_by: str,
    read_by: str,
    doc: str,
    minimum: float | None = None,
) -> EnvVar[T]:
    full = PREFIX + name
    if full in VARIABLES:
        raise AssertionError(f"{full} is declared twice")
    var: EnvVar[T] = EnvVar(full, kind, default, set_by, read_by, doc, minimum)
    VARIABLES[full] = var
    return var


_PLANE = "control plane (launch)"
_RUNTIME = "in-job runtime"

# --- the user's side: CLI, SDK, control plane process ------------------------------------------

HOME: EnvVar[Path] = _var(
    "HOME",
    "path",
    set_by="user",
    read_by="server, CLI, SDK",
    doc="State directory of the embedded control plane: database, admin token, run dirs "
    "(default ~/.tyard).",
)
SERVER: EnvVar[str] = _var(
    "SERVER",
    "str",
    set_by="user",
    read_by="CLI, SDK",
    doc="URL of the control plane (default: the local one, http://127.0.0.1:8642).",
)
TOKEN: EnvVar[str] = _var(
    "TOKEN",
    "str",
    set_by="user",
    read_by="CLI, SDK",
    doc="API token sent as the bearer credential.",
)
DB_URL: EnvVar[str] = _var(
    "DB_URL",
    "str",
    set_by="user / Deployment",
    read_by="tyard server",
    doc="SQLAlchemy URL of the database (default SQLite in the state directory).",
)
SCHEDULER_CONFIG: EnvVar[Path] = _var(
    "SCHEDULER_CONFIG",
    "path",
    set_by="user / Deployment",
    read_by="tyard server",
    doc="Scheduler settings file (queues, cohorts, policy).",
)
ARTIFACTS: EnvVar[str] = _var(
    "ARTIFACTS",
    "str",
    set_by="user / Deployment",
    read_by="tyard server, tyard models",
    doc="Artifact store URL (s3://bucket/prefix or a directory; default: the state directory).",
)
IMAGE_MATRIX: EnvVar[Path] = _var(
    "IMAGE_MATRIX",
    "path",
    set_by="user",
    read_by="tyard images, image resolution",
    doc="The site's image matrix file (its own registry's images and pins).",
)
IMAGE_REGISTRY: EnvVar[str] = _var(
    "IMAGE_REGISTRY",
    "str",
    "localhost/tensoryard",
    set_by="user",
    read_by="tyard images",
    doc="Registry prefix of the images tensoryard builds.",
)
IMAGES_CACHE: EnvVar[Path] = _var(
    "IMAGES_CACHE",
    "path",
    set_by="user",
    read_by="image builder",
    doc="Cache directory of image builds (default under ~/.cache/tensoryard).",
)
SHARED_DIR: EnvVar[Path] = _var(
    "SHARED_DIR",
    "path",
    set_by="user",
    read_by="tyard sim",
    doc="Folder of the shared reference data (traces); default ../shared beside the repository.",
)
HOOK_SECRET: EnvVar[str] = _var(
    "HOOK_SECRET",
    "str",
    set_by="user",
    read_by="registry webhooks",
    doc="Conventional name of a webhook's signing secret (`secret_env:` names any variable).",
)

# --- crash points (tests of crash safety) ------------------------------------------------------

CRASH_AT: EnvVar[str] = _var(
    "CRASH_AT",
    "str",
    set_by="crash-safety tests",
    read_by="faults.py",
    doc="Crash point at which the process kills itself.",
)
CRASH_SIGNAL: EnvVar[str] = _var(
    "CRASH_SIGNAL",
    "str",
    "SIGKILL",
    set_by="crash-safety tests",
    read_by="faults.py",
    doc="Signal sent at the crash point (SIGSTOP: stop instead of dying).",
)
CRASH_ONCE: EnvVar[Path] = _var(
    "CRASH_ONCE",
    "path",
    set_by="crash-safety tests",
    read_by="faults.py",
    doc="Crash only while this file does not exist (created just before the crash).",
)

# --- launch: the control plane and executors -> every rank of a job (docs/contracts.md) --------

JOB_ID: EnvVar[str] = _var(
    "JOB_ID",
    "str",
    set_by=_PLANE,
    read_by=_RUNTIME,
    doc="The job's id.",
)
ATTEMPT: EnvVar[int] = _var(
    "ATTEMPT",
    "int",
    1,
    set_by=f"{_PLANE}; rank wrapper on in-place restarts",
    read_by=_RUNTIME,
    doc="Attempt number, 1-based.",
    minimum=1,
)
LAUNCH_ATTEMPT: EnvVar[int] = _var(
    "LAUNCH_ATTEMPT",
    "int",
    1,
    set_by="rank wrapper, gang rounds",
    read_by=_RUNTIME,
    doc="The attempt the control plane launched, when workers restarted in place report as a "
    "later one.",
    minimum=1,
)
IN_PLACE_RESTARTS: EnvVar[int] = _var(
    "IN_PLACE_RESTARTS",
    "int",
    0,
    set_by=_PLANE,
    read_by=_RUNTIME,
    doc="In-place restarts granted (restart.in_place) to a pod's own torchrun.",
    minimum=0,
)
RESTART_ROUND: EnvVar[int] = _var(
    "RESTART_ROUND",
    "int",
    set_by="rank wrapper (gangs)",
    read_by="runtime (dist init)",
    doc="In-place restart round of a gang, the same on every node (default: torchrun's count).",
    minimum=0,
)
ATTEMPT_KEY: EnvVar[str] = _var(
    "ATTEMPT_KEY",
    "str",
    set_by="executors",
    read_by="executors, runtime (gang rounds)",
    doc="Unique key of the attempt; marks every process of it, so leftovers can be found.",
)
RUN_DIR: EnvVar[str] = _var(
    "RUN_DIR",
    "str",
    set_by=_PLANE,
    read_by=f"{_RUNTIME}, tyard chaos",
    doc="The job's run directory (metrics.jsonl, checkpoints, outputs.json).",
)
SERVER_URL: EnvVar[str] = _var(
    "SERVER_URL",
    "str",
    set_by=_PLANE,
    read_by=f"{_RUNTIME} (reporter)",
    doc="Control-plane URL the job reports to; unset: offline, metrics.jsonl only.",
)
JOB_TOKEN: EnvVar[str] = _var(
    "JOB_TOKEN",
    "str",
    set_by=_PLANE,
    read_by=f"{_RUNTIME} (reporter)",
    doc="The job's report token (scoped to its own report endpoint).",
)
HEARTBEAT_S: EnvVar[float] = _var(
    "HEARTBEAT_S",
    "float",
    5.0,
    set_by="user (spec.env)",
    read_by=f"{_RUNTIME} (reporter)",
    doc="A report is sent at least this often, even without new rows.",
    minimum=0.05,
)
CHECKPOINT_DIR: EnvVar[str] = _var(
    "CHECKPOINT_DIR",
    "str",
    set_by=_PLANE,
    read_by=f"{_RUNTIME} (Checkpointer)",
    doc="The job's checkpoint directory (default $TYARD_RUN_DIR/checkpoints).",
)
CHECKPOINT_INTERVAL: EnvVar[int] = _var(
    "CHECKPOINT_INTERVAL",
    "int",
    50,
    set_by=_PLANE,
    read_by=f"{_RUNTIME} (Checkpointer)",
    doc="Steps between checkpoints.",
    minimum=1,
)
CHECKPOINT_KEEP: EnvVar[int] = _var(
    "CHECKPOINT_KEEP",
    "int",
    3,
    set_by=_PLANE,
    read_by=f"{_RUNTIME} (Checkpointer)",
    doc="Checkpoints the job keeps itself (0: the control plane applies retention).",
    minimum=0,
)
CHECKPOINT_LAYOUT: EnvVar[str] = _var(
    "CHECKPOINT_LAYOUT",
    "str",
    "auto",
    set_by=_PLANE,
    read_by=f"{_RUNTIME} (Checkpointer)",
    doc="Checkpoint layout: auto, full or sharded.",
)
CHECKPOINT_ASYNC: EnvVar[int] = _var(
    "CHECKPOINT_ASYNC",
    "int",
    0,
    set_by=_PLANE,
    read_by=f"{_RUNTIME} (Checkpointer)",
    doc="1: save checkpoints in the background.",
    minimum=0,
)
MEGATRON_SAVE: EnvVar[str] = _var(
    "MEGATRON_SAVE",
    "str",
    set_by=_PLANE,
    read_by="Megatron monitor (shim, follow)",
    doc="Absolute save directory of a Megatron job.",
)
IMAGE_EXPECT: EnvVar[str] = _var(
    "IMAGE_EXPECT",
    "str",
    set_by="Kubernetes executor",
    read_by="image preflight in the pod",
    doc="What the job's image matrix entry pins (torch, CUDA, NCCL), checked at start.",
)
STACKS_DIR: EnvVar[str] = _var(
    "STACKS_DIR",
    "str",
    set_by="executors",
    read_by=_RUNTIME,
    doc="Where a rank dumps its threads' stacks on SIGUSR2 (hang diagnosis).",
)
RANK_DONE_FILE: EnvVar[str] = _var(
    "RANK_DONE_FILE",
    "str",
    set_by="rank wrapper",
    read_by=_RUNTIME,
    doc="File a rank writes when it finished cleanly.",
)
RANK_STATS_EVERY_MS: EnvVar[int] = _var(
    "RANK_STATS_EVERY_MS",
    "int",
    1000,
    set_by="user (spec.env)",
    read_by=_RUNTIME,
    doc="How often a rank writes its step statistics (straggler detection).",
    minimum=10,
)
COLLECTIVE_PROBE_EVERY: EnvVar[int] = _var(
    "COLLECTIVE_PROBE_EVERY",
    "int",
    0,
    set_by="user (spec.env)",
    read_by=_RUNTIME,
    doc="Steps between collective-bandwidth probes (0: off).",
    minimum=0,
)
COLLECTIVE_PROBE_MB: EnvVar[int] = _var(
    "COLLECTIVE_PROBE_MB",
    "int",
    64,
    set_by="user (spec.env)",
    read_by=_RUNTIME,
    doc="Size of the probe's all-reduce, in MB.",
    minimum=0,
)
NODE: EnvVar[str] = _var(
    "NODE",
    "str",
    set_by="local gangs, Slurm script",
    read_by="rank wrapper, tyard chaos",
    doc="The (network-namespace or Slurm) node a rank runs on.",
)
NODE_COUNT: EnvVar[int] = _var(
    "NODE_COUNT",
    "int",
    set_by="Slurm batch script",
    read_by="Slurm batch script",
    doc="Nodes of the Slurm allocation.",
)
GANG: EnvVar[bool] = _var(
    "GANG",
    "bool",
    False,
    set_by="local executor (gangs)",
    read_by="rank wrapper",
    doc="1: number in-place restarts by round (multi-node gang).",
)
ROUNDS_DIR: EnvVar[str] = _var(
    "ROUNDS_DIR",
    "str",
    set_by="user / executor",
    read_by="runtime (gang rounds)",
    doc="Directory of a gang's restart-round files (default: a private per-user directory).",
)
ARTIFACT_STORE: EnvVar[str] = _var(
    "ARTIFACT_STORE",
    "str",
    set_by="serving (Kubernetes)",
    read_by="weights loader in the pod",
    doc="The control plane's artifact store URL, to pull a model's weights from.",
)
CODE_REVISION: EnvVar[str] = _var(
    "CODE_REVISION",
    "str",
    set_by="user (spec.env)",
    read_by="model registry (lineage)",
    doc="The code revision a job ran, recorded on the versions it registers.",
)
DATA_MANIFEST: EnvVar[str] = _var(
    "DATA_MANIFEST",
    "str",
    set_by="user (spec.env)",
    read_by="model registry (lineage)",
    doc="The dataset manifest a job read, recorded on the versions it registers.",
)
DATA_CACHE_DIR: EnvVar[Path] = _var(
    "DATA_CACHE_DIR",
    "path",
    set_by="user / node setup",
    read_by="data loader (node cache)",
    doc="Node-local directory of the data cache.",
)
DATA_CACHE_BYTES: EnvVar[int] = _var(
    "DATA_CACHE_BYTES",
    "int",
    64 << 30,
    set_by="user / node setup",
    read_by="data loader (node cache)",
    doc="Size limit of the node-local data cache.",
)
DATA_FETCH_SERVICE: EnvVar[str] = _var(
    "DATA_FETCH_SERVICE",
    "str",
    "auto",
    set_by="user / node setup",
    read_by="data loader (node cache)",
    doc="auto: the node's fetch service where the store's client is costly per process "
    "(boto3's credential chain, HDFS, fsspec), not for S3 with static keys; 1: always; "
    "0: each rank and worker fetches remote data itself.",
)
DATA_S3_CLIENT: EnvVar[str] = _var(
    "DATA_S3_CLIENT",
    "str",
    "auto",
    set_by="user / node setup",
    read_by="data loader (node cache, fetch service)",
    doc="auto: S3 reads over the standard library when AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY are set (no profile), boto3 otherwise; boto3: always boto3.",
)

INPUT_PREFIX = PREFIX + "INPUT_"
PREFIXES[INPUT_PREFIX] = (
    "set by the pipeline advancer on a step's job: its `inputs`, one variable each "
    "(TYARD_INPUT_<NAME>)"
)


def default_home() -> Path:
    """`$TYARD_HOME`, else `~/.tyard`: the database, admin token and job run dirs live here."""
    return HOME.get() or (Path.home() / ".tyard")


def markdown() -> str:
    """docs/environment.md: the contract as a table (a unit test keeps the file current)."""
    rows = [
        "# The TYARD_* environment contract",
        "",
        "Generated from `src/tensoryard/envvars.py` by `python -m tensoryard.envvars --write "
        "docs/environment.md`; do not edit by hand. Code reads each variable through its typed "
        "accessor there (`envvars.CHECKPOINT_INTERVAL.get(env)`); a bad value is refused with "
        "the variable's name and the fix.",
        "",
        "| variable | type | default | set by | read by | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for var in VARIABLES.values():
        default = "" if var.default is None else f"`{var.default}`"
        if var.minimum is not None:
            default += f" (>= {var.minimum:g})"
        rows.append(
            f"| `{var.name}` | {var.kind} | {default} | {var.set_by} | {var.read_by} | {var.doc} |"
        )
    for prefix, doc in PREFIXES.items():
        rows.append(f"| `{prefix}<NAME>` | str | | {doc} | the job | |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    """``--write PATH`` writes the doc; ``--check PATH`` exits 1 when PATH is not current."""
    if len(argv) != 2 or argv[0] not in ("--write", "--check"):
        sys.stderr.write("usage: python -m tensoryard.envvars --write|--check PATH\n")
        return 2
    path = Path(argv[1])
    if argv[0] == "--write":
        path.write_text(markdown())
        return 0
    current = path.read_text() if path.exists() else ""
    if current != markdown():
        sys.stderr.write(
            f"{path} is not current (fix: python -m tensoryard.envvars --write {path})\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
