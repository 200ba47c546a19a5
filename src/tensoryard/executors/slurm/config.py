"""Settings of the Slurm executor: which cluster, how jobs are submitted, and the per-team
partition / QOS / account mapping.

Plain data (no subprocess, no Slurm import), so the server config and the CLI hold it cheaply.
`load_slurm_config` reads the YAML file given to `tyard server --slurm-config`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from tensoryard.errors import ConfigError

__all__ = ["SlurmAccounting", "SlurmAdmission", "SlurmConfig", "TeamMapping", "load_slurm_config"]

SlurmAdmission = Literal["tensoryard", "slurm"]
SlurmAccounting = Literal["auto", "sacct", "off"]


@dataclass(frozen=True, kw_only=True)
class TeamMapping:
    """Where one team's jobs go in Slurm (None: sbatch's default / the user's default)."""

    partition: str | None = None
    qos: str | None = None
    account: str | None = None


@dataclass(frozen=True, kw_only=True)
class SlurmConfig:
    """Where and how attempts run on a Slurm cluster. Every field has a default."""

    slurm_conf: Path | None = None
    """slurm.conf the client commands read (SLURM_CONF); None: theirs (/etc/slurm/slurm.conf
    or $SLURM_CONF of the control plane)."""
    bin_dir: Path | None = None
    """Directory holding sbatch, squeue, scancel, sinfo, scontrol (None: found on PATH)."""
    command_timeout_s: float = 15.0
    """Limit of every client command: they retry for minutes when slurmctld is down."""
    admission: SlurmAdmission = "tensoryard"
    """Who places jobs: "tensoryard" (its scheduler decides and pins `--nodelist`) or "slurm"
    (the platform enforces team quotas, Slurm's scheduler chooses the nodes)."""
    teams: Mapping[str, TeamMapping] = field(default_factory=dict)
    """Team name -> partition / QOS / account; the entry "*" serves every team not named."""
    python: str = sys.executable
    """The interpreter of the job on the compute nodes (torchrun runs under it)."""
    signal_lead_s: int = 120
    """Slurm signals the job this long before its time limit (`--signal=B:USR1@LEAD`); the
    batch script turns it into SIGTERM for the workers, which checkpoint and stop."""
    rendezvous_ports: tuple[int, int] = (29400, 29499)
    """torchrun's master port is taken from this range by Slurm job id (first node's address)."""
    queue_ttl_s: float = 1.0
    """How long one `squeue --json` listing serves polls before it is read again."""
    nodes_ttl_s: float = 10.0
    """How long one listing of nodes and partitions serves checks and the scheduler."""
    extra_sbatch_args: tuple[str, ...] = ()
    """Passed to every sbatch as they are (e.g. "--constraint=h100"); sbatch mode only."""
    accounting: SlurmAccounting = "auto"
    """Where the end of a job that has left squeue is read: "auto" (from `sacct --json` when
    `scontrol show config` says AccountingStorageType is not accounting_storage/none), "sacct"
    (always from sacct), "off" (never: the batch script's files in the attempt directory)."""
    rest_url: str | None = None
    """slurmrestd's address (e.g. "http://slurm-head:6820"): jobs are submitted, listed and
    cancelled through Slurm's REST API instead of sbatch/squeue/scancel. None: sbatch mode."""
    rest_user: str | None = None
    """The Slurm user the REST calls act as (X-SLURM-USER-NAME); None: the server's own user."""
    rest_token_file: Path | None = None
    """A file holding the user's JWT (`scontrol token` prints one), read at every call so a
    refreshed token is picked up; None: the environment variable `rest_token_env`."""
    rest_token_env: str = "SLURM_JWT"
    """The environment variable holding the JWT when `rest_token_file` is not set (either
    the bare token or `scontrol token`'s "SLURM_JWT=..." line)."""
    rest_api_version: str | None = None
    """The OpenAPI version to speak (e.g. "v0.0.38"); None: the newest one that slurmrestd
    announces and tensoryard speaks."""

    @property
    def rest(self) -> bool:
        """Whether attempts go through slurmrestd (else sbatch)."""
        return self.rest_url is not None

    def team(self, name: str) -> TeamMapping | None:
        """The mapping of team `name` ("*" when it has none of its own; None: neither)."""
        return self.teams.get(name) or self.teams.get("*")


_MAPPING_KEYS = {"partition", "qos", "account"}


def _team_mapping(team: str, raw: Any) -> TeamMapping:
    if raw is None:
        return TeamMapping()
    if not isinstance(raw, Mapping) or not set(raw) <= _MAPPING_KEYS:
        raise ConfigError(
            f"slurm config: teams.{team} must be a mapping with keys partition, qos, account "
            f"(got {raw!r})"
        )
    return TeamMapping(**{k: (str(v) if v is not None else None) for k, v in raw.items()})


def slurm_config_from(data: Mapping[str, Any], base: SlurmConfig | None = None) -> SlurmConfig:
    """A SlurmConfig from plain data (a parsed YAML file); unknown keys are refused."""
    base = base or SlurmConfig()
    known = {f.name for f in fields(SlurmConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"slurm config: unknown setting(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known))})"
        )
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "teams":
            if not isinstance(value, Mapping):
                raise ConfigError(
                    "slurm config: teams must map team names to partition/qos/account"
                )
            values[key] = {str(t): _team_mapping(str(t), m) for t, m in value.items()}
        elif key in ("slurm_conf", "bin_dir", "rest_token_file"):
            values[key] = Path(str(value)).expanduser() if value else None
        elif key == "admission":
            if value not in ("tensoryard", "slurm"):
                raise ConfigError(f"slurm config: admission {value!r}: use 'tensoryard' or 'slurm'")
            values[key] = value
        elif key == "accounting":
            if value is False:  # YAML reads a bare `off` as false
                value = "off"
            if value not in ("auto", "sacct", "off"):
                raise ConfigError(
                    f"slurm config: accounting {value!r}: use 'auto' (sacct when the cluster "
                    "keeps accounting), 'sacct' or 'off'"
                )
            values[key] = value
        elif key == "rendezvous_ports":
            try:
                low, high = (int(p) for p in value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    "slurm config: rendezvous_ports must be [LOW, HIGH], e.g. [29400, 29499]"
                ) from exc
            if not 0 < low <= high < 65536:
                raise ConfigError(
                    f"slurm config: rendezvous_ports {low}..{high} is not a port range"
                )
            values[key] = (low, high)
        elif key == "extra_sbatch_args":
            values[key] = tuple(str(a) for a in value)
        elif key in ("command_timeout_s", "queue_ttl_s", "nodes_ttl_s"):
            values[key] = _positive(key, value)
        elif key == "signal_lead_s":
            values[key] = int(_positive(key, value))
        elif key == "rest_url":
            values[key] = _rest_url(value)
        elif key == "rest_api_version":
            values[key] = _api_version(value)
        else:
            values[key] = str(value) if value is not None else None
    config = SlurmConfig(**{**{f.name: getattr(base, f.name) for f in fields(base)}, **values})
    if config.rest and config.extra_sbatch_args:
        raise ConfigError(
            "slurm config: extra_sbatch_args are sbatch options and rest_url submits through "
            "slurmrestd, which cannot take them (fix: remove extra_sbatch_args, or rest_url to "
            "submit with sbatch)"
        )
    return config


def _rest_url(value: Any) -> str | None:
    if not value:
        return None
    url = str(value).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"slurm config: rest_url {value!r} must start with http:// or https:// "
            "(e.g. http://slurm-head:6820, where slurmrestd listens)"
        )
    return url


def _api_version(value: Any) -> str | None:
    if not value:
        return None
    text = str(value)
    version = text if text.startswith("v") else f"v{text}"
    if not re.fullmatch(r"v\d+\.\d+\.\d+", version):
        raise ConfigError(
            f"slurm config: rest_api_version {value!r} is not an OpenAPI version such as "
            "v0.0.38 (fix: remove it to use the newest one slurmrestd announces)"
        )
    return version


def _positive(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"slurm config: {key} must be a number, got {value!r}") from exc
    if number <= 0:
        raise ConfigError(f"slurm config: {key} must be above 0, got {value!r}")
    return number


def load_slurm_config(path: Path | None, **overrides: Any) -> SlurmConfig:
    """The YAML file `path` (None: defaults), then `overrides` (CLI options that were given)."""
    data: dict[str, Any] = {}
    if path is not None:
        import yaml

        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"--slurm-config {path}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"--slurm-config {path}: not valid YAML ({exc})") from exc
        if loaded is not None and not isinstance(loaded, Mapping):
            raise ConfigError(f"--slurm-config {path}: expected a mapping of settings")
        data.update(loaded or {})
    data.update({k: v for k, v in overrides.items() if v is not None})
    return slurm_config_from(data)
