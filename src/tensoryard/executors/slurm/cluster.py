"""The Slurm cluster as the platform sees it: nodes (for tensoryard's scheduler), partitions,
QOS and accounts, and the checks that refuse a job before anything is submitted."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensoryard.errors import ConfigError, ExecutorError, FieldIssue, SpecError
from tensoryard.executors.capacity import NodeCapacity
from tensoryard.executors.slurm.commands import SlurmCommands
from tensoryard.executors.slurm.config import SlurmConfig, TeamMapping
from tensoryard.spec.job import JobSpec

if TYPE_CHECKING:
    from tensoryard.executors.slurm.rest import SlurmRest

__all__ = ["Partition", "SlurmCluster", "SlurmNode", "gpu_count"]

_MIB = 1024 * 1024
_GPU = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")
# Node states that take no new jobs (a "+" flag such as DRAIN may follow the base state)
_UNAVAILABLE = ("DOWN", "DRAIN", "FAIL", "FUTURE", "NOT_RESPONDING", "POWER", "MAINT", "REBOOT")


_GPU_TYPE = re.compile(r"(?:^|,)gpu:([^:,()]+):\d+")
DEFAULT_GPU_MODEL = "gpu"  # a node whose GRES names no type ("gpu:8")


def gpu_model(gres: str) -> str:
    """The GPU type of a node's Gres string ('gpu:h100:8' -> 'h100'; 'gpu:8' -> 'gpu'): the
    scheduler's GPU flavor, on which team quotas count."""
    match = _GPU_TYPE.search(gres or "")
    return match.group(1) if match else DEFAULT_GPU_MODEL


def gpu_count(gres: str) -> int:
    """GPUs in a node's Gres string: 'gpu:4', 'gpu:h100:8(S:0-1)', 'gpu:a:2,gpu:b:2' -> 4."""
    return sum(int(m) for m in _GPU.findall(gres or ""))


@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    memory_mib: int
    gpus: int
    state: str
    partitions: tuple[str, ...]
    gpu_model: str = DEFAULT_GPU_MODEL

    @property
    def available(self) -> bool:
        return not any(word in self.state for word in _UNAVAILABLE)


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    default: bool
    up: bool


class SlurmCluster:
    """Nodes and partitions, listed at most every `nodes_ttl_s`; the per-job checks."""

    def __init__(
        self,
        commands: SlurmCommands,
        config: SlurmConfig,
        clock: Callable[[], float] = time.monotonic,
        rest: SlurmRest | None = None,
    ) -> None:
        self.commands = commands
        self.config = config
        self.clock = clock
        self.rest = rest  # set: nodes and partitions are read from slurmrestd
        self._lock = threading.Lock()
        self._listed_at = -math.inf
        self._nodes: tuple[SlurmNode, ...] = ()
        self._partitions: dict[str, Partition] = {}

    # -- listing ------------------------------------------------------------------------------

    def refresh(self) -> None:
        if self.rest is not None:
            self._refresh_rest(self.rest)
            return
        nodes = tuple(_node(rec) for rec in self.commands.scontrol_lines("node"))
        partitions = {}
        for rec in self.commands.scontrol_lines("partition"):
            name = rec.get("PartitionName", "")
            members = [n.name for n in nodes if name in n.partitions]
            partitions[name] = Partition(
                name, tuple(members), rec.get("Default") == "YES", rec.get("State") == "UP"
            )
        with self._lock:
            self._nodes, self._partitions, self._listed_at = nodes, partitions, self.clock()

    def _refresh_rest(self, rest: SlurmRest) -> None:
        nodes = rest.nodes()
        partitions = {
            p.name: Partition(
                p.name, tuple(n.name for n in nodes if p.name in n.partitions), p.default, p.up
            )
            for p in rest.partitions()
        }
        with self._lock:
            self._nodes, self._partitions, self._listed_at = nodes, partitions, self.clock()

    def _fresh(self) -> None:
        if self.clock() - self._listed_at > self.config.nodes_ttl_s:
            self.refresh()

    def nodes(self) -> tuple[SlurmNode, ...]:
        self._fresh()
        return self._nodes

    def partitions(self) -> dict[str, Partition]:
        self._fresh()
        return dict(self._partitions)

    def capacity(self) -> tuple[NodeCapacity, ...]:
        """The nodes tensoryard's scheduler places on: those of the partitions the team mapping
        names (every node when it names none). Down or drained nodes are cordoned."""
        try:
            nodes = self.nodes()
        except ExecutorError:
            return ()  # slurmctld unreachable: nothing is placed until it answers again
        wanted = {m.partition for m in self.config.teams.values() if m.partition}
        return tuple(
            NodeCapacity(
                name=n.name,
                cpu_slots=float(n.cpus),
                memory_bytes=n.memory_mib * _MIB,
                gpu_indices=tuple(range(n.gpus)),
                gpu_model=n.gpu_model if n.gpus else None,
                cordoned=not n.available,
                state="ready" if n.available else "cordoned",
            )
            for n in nodes
            if not wanted or wanted & set(n.partitions)
        )

    # -- checks -------------------------------------------------------------------------------

    def check_config(self) -> None:
        """At server start: slurmctld answers, and every partition, QOS and account the team
        mapping names exists. ConfigError naming the setting otherwise."""
        try:
            if self.rest is not None:
                self.rest.ping()
                self._check_rest(self.rest)
            self.refresh()
        except ExecutorError as exc:
            raise ConfigError(f"--executor slurm: {exc}") from exc
        partitions = self._partitions
        for team, mapping in self.config.teams.items():
            if mapping.partition and mapping.partition not in partitions:
                raise ConfigError(
                    f"slurm config: teams.{team}.partition {mapping.partition!r} does not exist "
                    f"(partitions: {', '.join(sorted(partitions)) or 'none'})"
                )
        qos = {m.qos for m in self.config.teams.values() if m.qos}
        accounts = {m.account for m in self.config.teams.values() if m.account}
        if not (qos or accounts):
            return
        storage = self.commands.config_value("AccountingStorageType")
        if not storage or storage.endswith("/none"):
            team = next(t for t, m in self.config.teams.items() if m.qos or m.account)
            raise ConfigError(
                f"slurm config: teams.{team} names a QOS or account, but this cluster keeps no "
                f"accounting (AccountingStorageType={storage or 'none'}): Slurm would ignore "
                "them (fix: remove qos/account from the mapping, or configure slurmdbd)"
            )
        for kind, names in (("qos", qos), ("account", accounts)):
            known = self.commands.sacctmgr_names(kind)
            for name in sorted(names - known):
                team = next(t for t, m in self.config.teams.items() if getattr(m, kind) == name)
                raise ConfigError(
                    f"slurm config: teams.{team}.{kind} {name!r} does not exist in Slurm's "
                    f"accounting (known: {', '.join(sorted(known)) or 'none'})"
                )

    def _check_rest(self, rest: SlurmRest) -> None:
        if self.config.admission == "tensoryard" and not rest.dialect.pins_nodes:
            raise ConfigError(
                f"slurm config: admission: tensoryard pins each job's nodes, which slurmrestd "
                f"{rest.dialect.version} at {rest.url} cannot do (fix: set admission: slurm, "
                "or remove rest_url to submit with sbatch, or serve v0.0.40 or later)"
            )

    def mapping(self, spec: JobSpec) -> TeamMapping:
        mapping = self.config.team(spec.team)
        if mapping is None:
            teams = ", ".join(sorted(self.config.teams))
            raise SpecError(
                [
                    FieldIssue(
                        "team",
                        f"team {spec.team!r} has no Slurm partition mapping (mapped: {teams})",
                        "ask the platform admin to add it under `teams:` in the Slurm config",
                    )
                ]
            )
        return mapping

    def check_fits(self, spec: JobSpec) -> None:
        """Refuse (SpecError) a job Slurm could never run on its partition, before submitting:
        Slurm accepts some impossible jobs and leaves them pending forever."""
        mapping = self.mapping(spec) if self.config.teams else TeamMapping()
        try:
            partitions = self.partitions()
            nodes = {n.name: n for n in self.nodes()}
        except ExecutorError as exc:
            issue = FieldIssue("team", f"cannot read Slurm's partitions: {exc}", "retry later")
            raise SpecError([issue]) from exc
        if mapping.partition:
            part = partitions.get(mapping.partition)
        else:
            part = next((p for p in partitions.values() if p.default), None)
        if part is None:
            raise SpecError(
                [
                    FieldIssue(
                        "team",
                        f"Slurm partition {mapping.partition or '(default)'!r} does not exist",
                        "ask the platform admin to fix the team's partition in the Slurm config",
                    )
                ]
            )
        members = [nodes[n] for n in part.nodes if n in nodes]
        res = spec.resources
        issues = []
        if res.nodes > len(members):
            issues.append(
                FieldIssue(
                    "resources.nodes",
                    f"{res.nodes} nodes asked, partition {part.name!r} has {len(members)}",
                    f"ask for at most {len(members)}",
                )
            )
        most_gpus = max((n.gpus for n in members), default=0)
        if res.gpus_per_node > most_gpus:
            issues.append(
                FieldIssue(
                    "resources.gpus_per_node",
                    f"{res.gpus_per_node} GPUs per node asked, no node of partition "
                    f"{part.name!r} has more than {most_gpus}",
                    f"ask for at most {most_gpus}",
                )
            )
        most_cpus = max((n.cpus for n in members), default=0)
        if math.ceil(res.cpu) > most_cpus:
            issues.append(
                FieldIssue(
                    "resources.cpu",
                    f"{res.cpu:g} CPUs per node asked, no node of partition {part.name!r} has "
                    f"more than {most_cpus}",
                    f"ask for at most {most_cpus}",
                )
            )
        most_mib = max((n.memory_mib for n in members), default=0)
        if math.ceil(res.memory / _MIB) > most_mib:
            issues.append(
                FieldIssue(
                    "resources.memory",
                    f"{res.memory / _MIB:.0f} MiB per node asked, no node of partition "
                    f"{part.name!r} has more than {most_mib} MiB",
                    f"ask for at most {most_mib}Mi",
                )
            )
        if issues:
            raise SpecError(issues)


def _node(rec: dict[str, str]) -> SlurmNode:
    def integer(key: str) -> int:
        try:
            return int(rec.get(key, "0"))
        except ValueError:
            return 0

    return SlurmNode(
        name=rec.get("NodeName", ""),
        cpus=integer("CPUTot"),
        memory_mib=integer("RealMemory"),
        gpus=gpu_count(rec.get("Gres", "")),
        state=rec.get("State", "UNKNOWN"),
        partitions=tuple(p for p in rec.get("Partitions", "").split(",") if p),
        gpu_model=gpu_model(rec.get("Gres", "")),
    )
