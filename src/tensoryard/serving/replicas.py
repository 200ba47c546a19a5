"""Supervise replica processes of every deployment, and hand ready replicas to the gateway.

One supervisor thread reconciles, every ``tick_s``, the deployments stored in the database with
the processes on this machine, in numbered phases:

1. read the deployments; stop the processes of deleted ones;
2. per deployment, the target: its replica count (with ``autoscale``, what the autoscaler wants
   between that minimum and ``max_replicas``: serving/autoscale.py), or 0 once idle for
   ``idle_timeout_s`` (scale to zero) until the next request wakes it;
3. start missing replicas (the row with its port is written before the spawn) and stop surplus
   ones (a surplus replica gets no new request and is stopped once it has none in flight);
4. a process that exited is restarted after a backoff (0.5 s doubling per restart, at
   most 30 s; its row counts the restart); a starting one becomes ready
   only when the model answers a one-token generation (not when the port opens);
5. rolling update: when a deployment changes what it serves (an alias moved, a deploy step
   updated it), its ready replicas retire (slot RETIRING_SLOT + n, moved in the same
   transaction as the change) and keep answering while the new ones start; once every new
   replica is ready, each retiring one is stopped as soon as it has no request in flight (at
   most DRAIN_S later). New replicas that never become ready leave the old ones serving.

Phases 1 and 2 are the supervisor's own; phases 3 to 5 belong to the deployment's backend
(:class:`tensoryard.serving.replica_state.ReplicaBackend`): processes on this machine
(:mod:`tensoryard.serving.replicas_local`, the CPU engines) or pods on Kubernetes
(:mod:`tensoryard.serving.replicas_kube`, the GPU engines), chosen by the engine.

After a control-plane restart the rows still hold each replica's pid and port: a process that
is still alive and answers is re-attached (a retiring one as retiring), anything else is
started again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tensoryard.errors import NotFound
from tensoryard.serving.autoscale import AutoscalePolicy, Autoscaler
from tensoryard.serving.engine import GATEWAY_OPTIONS, engine_command, parse_engine_options
from tensoryard.serving.gpu_engines import GPU_ENGINES
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.replica_state import (
    CommandFor,
    DeploymentState,
    Replica,
    ReplicaBackend,
    free_port,
    terminate,
)
from tensoryard.serving.replicas_kube import KubeReplicas
from tensoryard.serving.replicas_local import LocalReplicas
from tensoryard.serving.router import ROUTERS, ReplicaLoad, Route
from tensoryard.store import Store
from tensoryard.store._serving import DeploymentRecord, ReplicaRecord

if TYPE_CHECKING:
    from tensoryard.serving.kubernetes import KubeServing

__all__ = [
    "CommandFor",
    "Replica",
    "ReplicaManager",
    "default_command",
    "free_port",
    "on_kubernetes",
]

log = logging.getLogger("tensoryard.serving")

ADOPT_TIMEOUT_S = 10.0  # a new deployment is adopted within one tick when the supervisor runs
FOLLOW_S = 2.0  # how often deployments of MODEL@ALIAS look whether their alias moved


def on_kubernetes(rec: DeploymentRecord) -> bool:
    """Whether the deployment's replicas are pods on Kubernetes (not processes here)."""
    return rec.engine in GPU_ENGINES


def default_command(dep: DeploymentRecord, port: int) -> list[str]:
    """argv for a replica of ``dep`` (the engines tensoryard knows)."""
    if dep.engine == "mock":
        import sys

        return [
            sys.executable,
            "-m",
            "tensoryard.serving.mock_engine",
            "--port",
            str(port),
            *(f"--{k}={v}" for k, v in dep.options.items() if k not in GATEWAY_OPTIONS),
        ]
    options = parse_engine_options(dep.options)
    return engine_command(Path(dep.model_path), port, options, alias=dep.name)


def _policy(rec: DeploymentRecord) -> AutoscalePolicy | None:
    auto = rec.options.get("autoscale")
    if not isinstance(auto, dict):
        return None
    return AutoscalePolicy(
        min_replicas=rec.replicas,
        max_replicas=max(rec.replicas, int(auto["max_replicas"])),
        target_queue=float(auto.get("target_queue", 2.0)),
        target_ttft_s=None if auto.get("target_ttft_s") is None else float(auto["target_ttft_s"]),
        scale_down_after_s=float(auto.get("scale_down_after_s", 60.0)),
    )


class ReplicaManager:
    """Keeps each stored deployment's replicas running; the gateway's source of replicas."""

    def __init__(
        self,
        store: Store,
        *,
        log_dir: Path,
        metrics: ServingMetrics,
        command_for: CommandFor = default_command,
        tick_s: float = 0.25,
        probe_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        kube: KubeServing | None = None,
    ) -> None:
        self.store = store
        self.log_dir = log_dir
        self.metrics = metrics
        self.command_for = command_for
        self.tick_s = tick_s
        self.probe_timeout_s = probe_timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._deps: dict[str, DeploymentState] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._http = httpx.Client(timeout=probe_timeout_s)
        # called with the stored deployments every FOLLOW_S (the plane sets an AliasFollower)
        self.follow: Callable[[list[DeploymentRecord]], None] | None = None
        self._followed_at = float("-inf")
        # where each deployment's replicas run, by its engine: GPU engines as pods on
        # Kubernetes (refused without it), every other engine as processes here
        self._local = LocalReplicas(self)
        self._kube = KubeReplicas(self, kube)
        self._backends: dict[str, ReplicaBackend] = dict.fromkeys(GPU_ENGINES, self._kube)

    @property
    def lock(self) -> threading.Lock:
        """Guards every deployment's state (the gateway reads it from request threads)."""
        return self._lock

    @property
    def kube(self) -> KubeServing | None:
        """The cluster GPU engines' deployments run on (None: they are refused)."""
        return self._kube.kube

    @kube.setter
    def kube(self, kube: KubeServing | None) -> None:
        self._kube.kube = kube

    def backend(self, rec: DeploymentRecord) -> ReplicaBackend:
        """Where this deployment's replicas run."""
        return self._backends.get(rec.engine, self._local)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tyard-serving", daemon=True)
        self._thread.start()

    def stop(self, *, stop_replicas: bool = True) -> None:
        """Stop supervising; with ``stop_replicas`` also stop every replica process (else they
        keep running and a restarted control plane re-attaches to them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if stop_replicas:
            with self._lock:
                deps = list(self._deps.values())
            for d in deps:
                self.backend(d.record).shutdown([d])
        self._http.close()

    def kick(self) -> None:
        """Reconcile now (after a create, scale or delete)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception:  # keep supervising; the next tick retries
                log.exception("serving reconcile failed")
            self._wake.wait(self.tick_s)
            self._wake.clear()

    # -- the gateway's side --------------------------------------------------------------------

    def deployments(self) -> list[DeploymentRecord]:
        with self._lock:
            return [d.record for d in self._deps.values()]

    def replicas(self, name: str) -> list[Replica]:
        with self._lock:
            dep = self._deps.get(name)
            return [*dep.replicas.values(), *dep.retiring.values()] if dep else []

    def record(self, name: str) -> DeploymentRecord:
        with self._lock:
            dep = self._deps.get(name)
        if dep is None:
            return self.store.get_deployment(name)  # NotFound with the fix
        return dep.record

    async def acquire(self, name: str, prompt: str, *, timeout_s: float) -> tuple[Replica, Route]:
        """A ready replica for this prompt, chosen by the router; waits (does not fail) while
        the deployment scales from zero or its replicas start. Call :meth:`release` after."""
        start = self.clock()
        waited_from: float | None = None  # when it first found no replica to route to
        while True:  # a deployment created a moment ago: wait for the supervisor to adopt it
            with self._lock:
                found = self._deps.get(name)
            if found is not None:
                break
            waited_from = start if waited_from is None else waited_from
            self.store.get_deployment(name)  # NotFound when it does not exist at all
            self._wake.set()
            if self.clock() - start > min(timeout_s, ADOPT_TIMEOUT_S):
                raise TimeoutError(
                    f"deployment {name!r} was not picked up by the replica supervisor within "
                    f"{ADOPT_TIMEOUT_S:.0f} s (is it running? see the control plane's log)"
                )
            await asyncio.sleep(0.02)
        dep = found
        with self._lock:
            dep.last_request = start
            if dep.asleep:
                dep.asleep = False
                self._wake.set()
            if dep.record.replicas == 0:
                raise NotFound(
                    f"deployment {name!r} is scaled to 0 replicas "
                    f"(fix: `tyard deployments scale {name} 1`)"
                )
            dep.waiting += 1
        self.metrics.waiting.labels(name).inc()
        try:
            while True:
                with self._lock:
                    # the new model's replicas; during a rolling update, until one of them
                    # is ready, the previous model's
                    ready = [r for r in dep.replicas.values() if r.ready]
                    if dep.target is not None and any(r.slot < dep.target for r in ready):
                        ready = [r for r in ready if r.slot < dep.target]  # not the surplus
                    ready = ready or [
                        r for r in dep.retiring.values() if r.ready and not r.exited()
                    ]
                    if ready:
                        loads = [ReplicaLoad(r.id, r.in_flight, r.pending_chars) for r in ready]
                        route = dep.router.pick(prompt, loads)
                        chosen = next(r for r in ready if r.id == route.replica)
                        chosen.in_flight += 1
                        chosen.pending_chars += route.uncached_chars
                        dep.last_request = self.clock()
                        break
                    if name not in self._deps:
                        raise NotFound(f"deployment {name!r} was deleted")
                    waited_from = self.clock() if waited_from is None else waited_from
                if self.clock() - start > timeout_s:
                    raise TimeoutError(
                        f"no replica of {name!r} became ready within {timeout_s:.0f} s"
                    )
                await asyncio.sleep(0.02)
        finally:
            with self._lock:
                dep.waiting -= 1
            self.metrics.waiting.labels(name).dec()
        self.metrics.queue.labels(name).observe(self.clock() - start)
        self.metrics.running.labels(name).inc()
        self.metrics.routed(name, route.matched_chars, route.prompt_chars)
        if waited_from is not None:
            route = replace(route, queued_s=max(0.0, self.clock() - waited_from))
        return chosen, route

    def observe_ttft(self, name: str, seconds: float) -> None:
        """A time to first token the gateway measured (the autoscaler's TTFT signal)."""
        with self._lock:
            dep = self._deps.get(name)
            if dep is not None and dep.autoscaler is not None:
                dep.autoscaler.observe_ttft(self.clock(), seconds)

    def target(self, name: str, record: DeploymentRecord) -> tuple[int, str]:
        """The replica count the supervisor aims for now, and the autoscaler's last reason."""
        with self._lock:
            dep = self._deps.get(name)
            if dep is None or dep.target is None:
                return record.replicas, ""
            return dep.target, dep.autoscaler.reason if dep.autoscaler is not None else ""

    def release(
        self, replica: Replica, *, failed: bool = False, route: Route | None = None
    ) -> None:
        """A request acquired with ``route`` is done (or ``failed``)."""
        with self._lock:
            replica.in_flight = max(0, replica.in_flight - 1)
            if route is not None:
                replica.pending_chars = max(0, replica.pending_chars - route.uncached_chars)
            dep = self._deps.get(replica.deployment)
            if dep is not None:
                dep.last_request = self.clock()
        self.metrics.running.labels(replica.deployment).dec()
        if failed:
            self._wake.set()  # a crashed replica is noticed at once

    # -- reconcile -----------------------------------------------------------------------------

    def reconcile(self) -> None:
        """One pass of the numbered phases in the module docstring."""
        # 0. deployments of an alias that moved are updated (then rolled over below)
        if self.follow is not None and self.clock() - self._followed_at >= FOLLOW_S:
            self._followed_at = self.clock()
            try:
                self.follow(self.store.list_deployments())
            except Exception:  # the alias check must never stop the supervision
                log.exception("following moved aliases failed")
        # 1. stored deployments; forget deleted ones
        records = {d.name: d for d in self.store.list_deployments()}
        rows: dict[str, dict[int, ReplicaRecord]] = {}
        for name, rec in records.items():  # the replica rows of deployments that changed
            known = self._deps.get(name)
            if known is not None and _serves_differently(known.record, rec):
                rows[name] = {r.slot: r for r in self.store.list_replicas(name)}
        leftover: list[Replica] = []
        with self._lock:
            gone = [self._deps.pop(n) for n in list(self._deps) if n not in records]
            for name, rec in records.items():
                if name not in self._deps:
                    self._deps[name] = self._adopt(rec)
                elif _serves_differently(self._deps[name].record, rec):
                    log.info("deployment %s changed (%s): rolling update", name, rec.model_ref)
                    old = self._deps.pop(name)
                    self._deps[name] = self._roll(old, rec, rows.get(name, {}), leftover)
                else:
                    self._deps[name].record = rec
            deps = list(self._deps.values())
        for d in gone:
            self.backend(d.record).forget(d)
        for r in leftover:
            terminate(r)
        for backend in (self._local, self._kube):
            backend.sweep(records)
        for dep in deps:
            self._reconcile_one(dep)

    def _roll(
        self,
        old: DeploymentState,
        rec: DeploymentRecord,
        rows: dict[int, ReplicaRecord],
        leftover: list[Replica],
    ) -> DeploymentState:
        """The deployment after `rec` changed what it serves; its backend decides what of
        ``old`` keeps serving, and puts the replicas to stop into `leftover`."""
        router = ROUTERS[str(rec.options.get("router", "prefix"))]()
        new = DeploymentState(rec, router, last_request=self.clock())
        self.backend(rec).roll(old, new, rows, leftover)
        return new

    def _adopt(self, rec: DeploymentRecord) -> DeploymentState:
        """A deployment first seen by this process: re-attach to live replicas from the rows."""
        router = ROUTERS[str(rec.options.get("router", "prefix"))]()
        dep = DeploymentState(record=rec, router=router, last_request=self.clock())
        self.backend(rec).adopt(dep)
        return dep

    def _reconcile_one(self, dep: DeploymentState) -> None:
        rec = dep.record
        now = self.clock()
        # 2. target replica count (scale to zero when idle)
        with self._lock:
            busy = dep.waiting > 0 or any(
                r.in_flight or not r.ready for r in dep.replicas.values()
            )  # a starting replica is not idle: the idle time counts from readiness
            idle = rec.idle_timeout_s is not None and now - dep.last_request > rec.idle_timeout_s
            if idle and not busy and dep.replicas:
                log.info(
                    "deployment %s idle for %.0f s: scaling to zero",
                    rec.name,
                    now - dep.last_request,
                )
                dep.asleep = True
            wanted = rec.replicas
            policy = _policy(rec)
            if policy is None:
                dep.autoscaler = None
            else:
                if dep.autoscaler is None or dep.autoscaler.policy != policy:
                    before = dep.autoscaler.desired if dep.autoscaler else rec.replicas
                    dep.autoscaler = Autoscaler(policy)
                    dep.autoscaler.desired = max(
                        policy.min_replicas, min(policy.max_replicas, before)
                    )
                load = dep.waiting + sum(r.in_flight for r in dep.replicas.values())
                starting = sum(1 for r in dep.replicas.values() if not r.ready)
                wanted = dep.autoscaler.decide(now, load, len(dep.replicas), starting)
            target = 0 if dep.asleep else wanted
            if dep.target != target:
                self.metrics.desired.labels(rec.name).set(target)
            dep.target = target
        # 3-5: the backend's (processes here, or Kubernetes' controllers for pods)
        self.backend(rec).reconcile(dep, target, now)

    def error(self, name: str) -> str:
        """Why the last reconcile of a Kubernetes deployment failed ("" when it did not)."""
        with self._lock:
            dep = self._deps.get(name)
            return dep.error if dep is not None else ""

    def answers(self, port: int) -> bool:
        """Readiness: the model generates one token (a process with an open port is not enough)."""
        try:
            resp = self._http.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={"prompt": "Hi", "max_tokens": 1, "temperature": 0},
                timeout=2.0,
            )
        except httpx.HTTPError:
            return False
        return resp.status_code == 200 and bool(resp.json().get("choices"))


def _serves_differently(old: DeploymentRecord, new: DeploymentRecord) -> bool:
    """True when the replicas of ``old`` cannot serve ``new`` (other weights, engine or
    engine options); a new replica count alone is a scale, done without a restart."""
    return (old.model_path, old.model_ref, old.engine, old.options) != (
        new.model_path,
        new.model_ref,
        new.engine,
        new.options,
    )
