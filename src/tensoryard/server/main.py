"""Assemble and run one control plane: store, executor, scheduler loop, REST API."""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from tensoryard.errors import (
    ConfigError,
    ExecutorError,
    FieldIssue,
    SpecError,
    StoreUnreachable,
)
from tensoryard.executors.base import Executor
from tensoryard.registry import ArtifactConfig, ArtifactStore, open_blobs
from tensoryard.registry.webhooks import WebhookDispatcher
from tensoryard.server.app import create_app
from tensoryard.server.auth import bootstrap_admin, ensure_secret
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import Controller, NodeSync
from tensoryard.server.housekeeping import Housekeeper, HousekeepingMetrics
from tensoryard.server.metrics import LoopMetrics, StateCollector
from tensoryard.server.scheduling import CorePolicy, KueuePolicy, NodeCapacity
from tensoryard.serving.deploy import Deployer
from tensoryard.serving.plane import ServingPlane
from tensoryard.spec.job import JobSpec, mounts_overlap
from tensoryard.store import NodeRecord, Store
from tensoryard.store._db import safe_url

__all__ = ["ControlPlane", "build_control_plane", "run_server"]

log = logging.getLogger("tensoryard.server")


@dataclass
class ControlPlane:
    config: ServerConfig
    store: Store
    executor: Executor
    controller: Controller
    admin_token: str
    registry: CollectorRegistry
    fits: Callable[[JobSpec], None] = lambda spec: None
    serving: ServingPlane | None = None
    webhooks: WebhookDispatcher | None = None
    housekeeper: Housekeeper | None = None

    def app(self) -> FastAPI:
        return create_app(
            store=self.store,
            executor=self.executor,
            runs_dir=self.config.runs_dir,
            secrets=self.controller.secrets,
            artifacts=ArtifactStore(
                open_blobs(self.config.artifact_store_url),
                config=ArtifactConfig(gc_grace_s=self.config.artifact_gc_grace_s),
            ),
            webhooks=self.webhooks,
            registry=self.registry,
            kick=self.controller.kick,
            loop_status=lambda: {
                "leader": self.controller.leading_now(),
                "epoch": self.controller.epoch if self.controller.leading_now() else None,
                "holder": self.controller.holder,
            },
            max_body_bytes=self.config.max_body_bytes,
            rate_limit_per_s=self.config.rate_limit_per_s,
            rate_limit_burst=self.config.rate_limit_burst,
            fits=self.fits,
            restarted=self.controller.metrics.restarted,
            extra_routes=self.serving.mount if self.serving is not None else None,
            capacity=self.controller.capacity,
        )


def _local_capacity(config: ServerConfig) -> tuple[NodeCapacity, ...]:
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
class _Backend:
    executor: Executor
    capacity: Callable[[], tuple[NodeCapacity, ...]]
    fits: Callable[[JobSpec], None]
    node_sync: NodeSync | None = None
    kube: Any = None  # the connected Kube client (Kubernetes executor): GPU serving uses it


def _local_backend(config: ServerConfig) -> _Backend:
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
    nodes = _local_capacity(config)
    return _Backend(executor, lambda: nodes, _without_volumes("local"))


def _without_volumes(
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


def _kubernetes_backend(config: ServerConfig) -> _Backend:
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

    return _Backend(executor, cluster.capacity, fits, node_sync, kube)


def _slurm_backend(config: ServerConfig) -> _Backend:
    """Check the cluster (slurmctld answers, the team mapping's partitions, QOS and accounts
    exist) before anything is submitted."""
    from tensoryard.executors.local.plan import DEFAULT_ENV_ALLOW
    from tensoryard.executors.slurm.executor import SlurmExecutor

    executor = SlurmExecutor(config.slurm, env_allow=config.job_env_allow or DEFAULT_ENV_ALLOW)
    executor.cluster.check_config()
    fits = _without_volumes("slurm", executor.cluster.check_fits)
    return _Backend(executor, executor.cluster.capacity, fits)


def _kueue_admits(config: ServerConfig) -> bool:
    return config.executor == "kubernetes" and config.kubernetes.admission == "kueue"


def _open_store(config: ServerConfig, *, retry_s: float = 2.0) -> Store:
    """The store, migrated; a database that cannot be reached yet is retried for
    `config.db_wait_s` (each failure logged), then its error is raised."""
    deadline = time.monotonic() + config.db_wait_s
    while True:
        try:
            return Store.open(config.database_url)
        except StoreUnreachable as exc:
            if time.monotonic() + retry_s > deadline:
                raise
            log.warning("waiting for the database (--db-wait %.0fs): %s", config.db_wait_s, exc)
            time.sleep(retry_s)


def build_control_plane(config: ServerConfig) -> ControlPlane:
    """Open the store (migrating it), make the platform admin and its token file (first start
    only), build executor and controller."""
    backend = _kubernetes_backend(config) if config.executor == "kubernetes" else None
    if config.executor == "slurm":
        backend = _slurm_backend(config)
    config.home.mkdir(parents=True, exist_ok=True)
    config.runs_dir.mkdir(parents=True, exist_ok=True)
    store = _open_store(config)
    store.ensure_team("default", description="created on first start")
    token = bootstrap_admin(store, config.token_path, user=config.admin_user)
    job_key = ensure_secret(config.job_key_path)
    backend = backend or _local_backend(config)
    executor, capacity = backend.executor, backend.capacity
    registry = CollectorRegistry(auto_describe=True)
    registry.register(
        StateCollector(store, total_gpus=lambda: sum(len(n.gpu_indices) for n in capacity()))
    )
    observed_pods = getattr(executor, "observed_pods", None)
    if observed_pods is not None:  # Kubernetes: the platform's pods, joinable to DCGM series
        from tensoryard.executors.kubernetes.pod_metrics import PodCollector

        registry.register(PodCollector(observed_pods))
    holder = f"{socket.gethostname()}:{config.port}:{config.home}"  # same after a restart
    controller = Controller(
        store=store,
        executor=executor,
        policy=KueuePolicy() if _kueue_admits(config) else CorePolicy(config.scheduler),
        capacity=capacity,
        config=config,
        job_key=job_key,
        holder=holder,
        metrics=LoopMetrics(registry),
        node_sync=backend.node_sync,
    )
    # Routes events to the outbox even with no hook configured (then: none); started by
    # run_server, so a plane built for a test or a one-off command sends nothing by itself.
    webhooks = WebhookDispatcher(store, config.webhooks, owner=holder)
    kube_serving = None
    if backend.kube is not None:  # vLLM / SGLang deployments run as pods on the cluster
        from tensoryard.serving.kubernetes import KubeServing

        kube_serving = KubeServing(
            backend.kube,
            loader_image=config.kubernetes.loader_image,
            artifact_store_url=config.artifact_store_url,
        )
    serving = ServingPlane.build(
        store,
        registry,
        log_dir=config.home / "serving",
        artifacts=ArtifactStore(open_blobs(config.artifact_store_url)),
        kube=kube_serving,
    )
    # pipelines' deploy steps create deployments through the same serving plane
    controller.pipelines.deployer = Deployer(
        store, serving.weights, serving.manager, gateway_url=config.report_url
    )
    housekeeper = Housekeeper(
        store,
        ArtifactStore(
            open_blobs(config.artifact_store_url),
            config=ArtifactConfig(gc_grace_s=config.artifact_gc_grace_s),
        ),
        is_leader=lambda: controller.is_leader,
        metrics=HousekeepingMetrics(registry),
        artifact_gc_interval_s=config.artifact_gc_interval_s,
        webhook_keep_s=config.webhook_keep_s,
    )
    return ControlPlane(
        config,
        store,
        executor,
        controller,
        token,
        registry,
        backend.fits,
        serving,
        webhooks,
        housekeeper,
    )


def _listen_sockets(config: ServerConfig) -> list[socket.socket] | None:
    """With network-namespace nodes, the API also listens on the bridge address (their ranks'
    loopback is their own); None: uvicorn binds config.host itself."""
    if not config.node_netns or config.host in ("0.0.0.0", "::"):
        return None
    from tensoryard.executors.local.netns import HOST_IP

    out = []
    for host in (config.host, HOST_IP):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, config.port))
        out.append(sock)
    return out


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port}: {exc.strerror} "
                "(fix: stop the other server or pass --port)"
            ) from exc


@contextmanager
def _server_file(config: ServerConfig) -> Iterator[None]:
    """`home/server.json` tells the CLI where this control plane listens."""
    path = config.home / "server.json"
    info = {"url": f"http://{config.host}:{config.port}", "pid": os.getpid()}
    path.write_text(json.dumps(info) + "\n", encoding="utf-8")
    try:
        yield
    finally:
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass


def _setup_logging(home: Path, level: str) -> None:
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger("tensoryard")
    root.setLevel(level.upper())
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(home / "server.log")):
        handler.setFormatter(fmt)
        root.addHandler(handler)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_server(config: ServerConfig, *, log_level: str = "info") -> None:
    """Run until interrupted: recover running jobs, start the loop, serve the API."""
    _check_port_free(config.host, config.port)
    plane = build_control_plane(config)
    _setup_logging(config.home, log_level)
    log.info("database %s; state in %s", safe_url(plane.store.url), config.home)
    plane.controller.start()  # takes the leader lease (or waits for it), recovers, loops
    if plane.serving is not None:
        plane.serving.start()  # re-attaches to or restarts replicas, then supervises
    if plane.webhooks is not None:
        plane.webhooks.start()  # sends what the outbox holds, from before a restart too
    if plane.housekeeper is not None:
        plane.housekeeper.start()  # scheduled artifact GC and outbox pruning (leader only)
    server = uvicorn.Server(
        uvicorn.Config(
            plane.app(),
            host=config.host,
            port=config.port,
            log_level="warning" if log_level == "info" else log_level,
            access_log=False,
        )
    )
    # Everything allocated so far (modules, the app, the plane) lives as long as the process:
    # out of the garbage collector's full passes, which otherwise stall the event loop for
    # tens of milliseconds as the heap grows (the gateway's p99).
    gc.collect()
    gc.freeze()
    # uvicorn handles SIGTERM by shutting the HTTP server down, then restores the handler it
    # found and raises the signal again. Left at the default, that second SIGTERM killed the
    # process before the `finally` below ran: serving replicas, the webhook sender and the
    # control loop were never stopped (replica processes leaked). With this handler found
    # instead, the re-raised signal ends server.run() with SystemExit and the cleanup runs.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with _server_file(config):
            server.run(sockets=_listen_sockets(config))
    finally:
        if plane.serving is not None:
            plane.serving.stop()
        if plane.webhooks is not None:
            plane.webhooks.stop()
        if plane.housekeeper is not None:
            plane.housekeeper.stop()
        plane.controller.stop()
        plane.store.close()
