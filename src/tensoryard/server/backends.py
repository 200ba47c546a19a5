"""The executor backends a control plane can run on: local processes (with the local
agent's inventory as capacity), Kubernetes (optionally with Kueue admitting) or Slurm. Each
builder returns the executor, the capacity it reports and the cluster checks it offers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensoryard.errors import (
    ConfigError,
    ExecutorError,
    FieldIssue,
    SpecError,
)
from tensoryard.executors.base import Executor
from tensoryard.executors.capacity import NodeCapacity
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import NodeSync
from tensoryard.spec.job import JobSpec, mounts_overlap
from tensoryard.store import NodeRecord

__all__ = ["Backend", "kubernetes_backend", "kueue_admits", "local_backend", "slurm_backend"]


def local_capacity(config: ServerConfig) -> tuple[NodeCapacity, ...]:
    from tensoryard.agent.inventory import collect_inventory

    inv = collect_inventory()
    cpu = config.cpu_slots if config.cpu_slots is not None else float(inv.cpu_slots)
    model = inv.healthy_gpus[0].model if inv.healthy_gpus else None
    names = config.local_nodes or (inv.hostname,)
    return tuple(
        NodeCapacity(
            name=name,
            cpu_slots=cpu / len(names),
            memory_bytes=inv.memory_bytes // len(names),
            gpu_indices=tuple(g.index for g in inv.healthy_gpus) if i == 0 else (),
            gpu_model=model if i == 0 else None,
        )
        for i, name in enumerate(names)
    )


@dataclass
class Backend:
    executor: Executor
    capacity: Callable[[], tuple[NodeCapacity, ...]]
    fits: Callable[[JobSpec], None]
    node_sync: NodeSync | None = None
    kube: Any = None  # the connected Kube client (Kubernetes executor): GPU serving uses it


def local_backend(config: ServerConfig) -> Backend:
    from tensoryard.executors.local import LocalExecutor
    from tensoryard.executors.local.plan import DEFAULT_ENV_ALLOW

    netns = None
    if config.node_netns:
        from tensoryard.executors.local.netns import NetnsNodes, netns_unavailable

        if len(config.local_nodes) < 2:
            raise ConfigError("--node-netns needs --local-nodes with at least two names")
        why = netns_unavailable()
        if why:
            raise ConfigError(f"--node-netns: {why}")
        netns = NetnsNodes(config.local_nodes)
        try:
            netns.setup()
        except ExecutorError as exc:
            raise ConfigError(f"--node-netns: {exc}") from exc
    executor = LocalExecutor(
        env_allow=config.job_env_allow or DEFAULT_ENV_ALLOW,
        run_as_submitter=config.run_jobs_as_submitter,
        netns=netns,
    )
    nodes = local_capacity(config)
    return Backend(executor, lambda: nodes, without_volumes("local"))


def without_volumes(
    executor: str, then: Callable[[JobSpec], None] = lambda spec: None
) -> Callable[[JobSpec], None]:
    """`fits` of an executor that has no volume claims to mount (local, Slurm): a job naming
    some is refused, not run without its data."""

    def fits(spec: JobSpec) -> None:
        if spec.volumes:
            fix = (
                "remove `volumes:` (this control plane runs jobs on this machine's files) or "
                "submit to a control plane started with --executor kubernetes"
            )
            if executor == "slurm":
                fix = (
                    "remove `volumes:` and read the data from the cluster's shared file system "
                    "(its path in `command` or `env`), or submit to a Kubernetes control plane"
                )
            issue = FieldIssue(
                "volumes",
                f"PersistentVolumeClaims need Kubernetes; this is the {executor} executor",
                fix,
            )
            raise SpecError([issue])
        then(spec)

    return fits


def kubernetes_backend(config: ServerConfig) -> Backend:
    """Connect and check (reachable, namespace, RBAC, nodes) before anything is created."""
    from tensoryard.executors.kubernetes.client import check_volumes, connect
    from tensoryard.executors.kubernetes.cluster import KubernetesCluster
    from tensoryard.executors.kubernetes.executor import KubernetesExecutor
    from tensoryard.executors.kubernetes.nodes import NodeCordoner, NodeIntent
    from tensoryard.images import ImageRefError, resolve_image

    try:
        kube = connect(config.kubernetes)
        cluster = KubernetesCluster(kube)
        cluster.check_labels()
        for team, volumes in sorted(config.kubernetes.team_volumes.items()):
            for _, problem, fix in check_volumes(kube, [claim for claim, _, _ in volumes]):
                raise ExecutorError(f"--team-volume {team}: {problem} (fix: {fix})")
        executor = KubernetesExecutor(kube, grace_s=config.cancel_grace_s)
        if config.kubernetes.watch:
            cluster.start_watches()
            executor.start_watches()
    except ExecutorError as exc:
        raise ConfigError(f"--executor kubernetes: {exc}") from exc

    def fits(spec: JobSpec) -> None:
        image = spec.image or config.kubernetes.default_image
        if not image:
            fix = "set `image:` to the training image (or start the server with --default-image)"
            raise SpecError([FieldIssue("image", "jobs on Kubernetes need an image", fix)])
        try:  # a matrix name (`cpu`) or a full reference; refused before anything is created
            resolve_image(image)
        except ImageRefError as exc:
            raise SpecError([FieldIssue("image", f"{exc.value!r} {exc.problem}", exc.fix)]) from exc
        cluster.check_fits(spec)
        for i, v in enumerate(spec.volumes):
            for claim, mount, _ in config.kubernetes.team_volumes.get(spec.team, ()):
                if mounts_overlap(v.mount, mount):
                    raise SpecError(
                        [
                            FieldIssue(
                                f"volumes.{i}.mount",
                                f"{v.mount} overlaps team {spec.team}'s volume {claim} at "
                                f"{mount} (the server's --team-volume)",
                                "mount it elsewhere, or use the team's volume",
                            )
                        ]
                    )
        try:
            unmountable = check_volumes(kube, [v.claim for v in spec.volumes])
        except ExecutorError as exc:
            issue = FieldIssue("volumes", f"cannot read the volume claims: {exc}", "retry")
            raise SpecError([issue]) from exc
        if unmountable:
            raise SpecError([FieldIssue(f"volumes.{i}.claim", p, f) for i, p, f in unmountable])
        if executor.kueue is not None:
            try:
                missing = executor.kueue.check_queue(spec.team)
            except ExecutorError as exc:
                issue = FieldIssue("team", f"cannot read Kueue's LocalQueues: {exc}", "retry")
                raise SpecError([issue]) from exc
            if missing:
                raise SpecError([FieldIssue("team", *missing)])

    node_sync: NodeSync | None = None
    if config.kubernetes.cordon_nodes:
        cordoner = NodeCordoner(kube, cluster.node_objects, cached=cluster.nodes_cached)

        def node_sync(states: Mapping[str, NodeRecord]) -> object:
            intents = {n: NodeIntent(n, r.state, r.reason) for n, r in states.items()}
            return cordoner.sync(intents)

    return Backend(executor, cluster.capacity, fits, node_sync, kube)


def slurm_backend(config: ServerConfig) -> Backend:
    """Check the cluster (slurmctld answers, the team mapping's partitions, QOS and accounts
    exist) before anything is submitted."""
    from tensoryard.executors.local.plan import DEFAULT_ENV_ALLOW
    from tensoryard.executors.slurm.executor import SlurmExecutor

    executor = SlurmExecutor(config.slurm, env_allow=config.job_env_allow or DEFAULT_ENV_ALLOW)
    executor.cluster.check_config()
    fits = without_volumes("slurm", executor.cluster.check_fits)
    return Backend(executor, executor.cluster.capacity, fits)


def kueue_admits(config: ServerConfig) -> bool:
    return config.executor == "kubernetes" and config.kubernetes.admission == "kueue"
