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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from tensoryard.errors import (
    ConfigError,
    StoreUnreachable,
)
from tensoryard.executors.base import Executor
from tensoryard.registry import ArtifactConfig, ArtifactStore, open_blobs
from tensoryard.registry.webhooks import WebhookDispatcher
from tensoryard.server.app import create_app
from tensoryard.server.auth import bootstrap_admin, ensure_secret
from tensoryard.server.backends import (
    kubernetes_backend,
    kueue_admits,
    local_backend,
    slurm_backend,
)
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import Controller
from tensoryard.server.housekeeping import Housekeeper, HousekeepingMetrics
from tensoryard.server.metrics import LoopMetrics, StateCollector
from tensoryard.server.scheduling import CorePolicy, KueuePolicy
from tensoryard.serving.deploy import Deployer
from tensoryard.serving.plane import ServingPlane
from tensoryard.spec.job import JobSpec
from tensoryard.store import Store
from tensoryard.store._db import safe_url

__all__ = ["ControlPlane", "build_control_plane", "run_server", "tune_process"]

log = logging.getLogger("tensoryard.server")

# How long a thread may hold the GIL before another that waits gets it (CPython's default:
# 5 ms). A request thread gives the GIL up at every database call and socket write and then
# waited up to 5 ms each time behind the control loop's scheduling pass: a POST /jobs needing
# a dozen such turns took 50-100 ms whenever it landed in a pass (the p99 at 20,000 pending).
_SWITCH_INTERVAL_S = 0.0005


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
    backend = kubernetes_backend(config) if config.executor == "kubernetes" else None
    if config.executor == "slurm":
        backend = slurm_backend(config)
    config.home.mkdir(parents=True, exist_ok=True)
    config.runs_dir.mkdir(parents=True, exist_ok=True)
    store = _open_store(config)
    store.ensure_team("default", description="created on first start")
    token = bootstrap_admin(store, config.token_path, user=config.admin_user)
    job_key = ensure_secret(config.job_key_path)
    backend = backend or local_backend(config)
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
        policy=KueuePolicy() if kueue_admits(config) else CorePolicy(config.scheduler),
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


def tune_process() -> None:
    """Ready the process that runs a control plane, once the plane is built: what `tyard
    server` does, and what a benchmark or embedding that runs the plane in its own process
    should do too to measure what users get.

    Everything allocated so far (modules, the app, the plane) lives as long as the process, so
    it leaves the garbage collector's full passes, which otherwise stall the event loop for
    tens of milliseconds as the heap grows (the gateway's p99). Threads take the GIL from each
    other after `_SWITCH_INTERVAL_S`, not CPython's 5 ms: request and launch threads give it
    up at every database call and socket read, and each such turn otherwise waits behind the
    control loop's scheduling pass.
    """
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(_SWITCH_INTERVAL_S)


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
    tune_process()
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
