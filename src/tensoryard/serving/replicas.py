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

After a control-plane restart the rows still hold each replica's pid and port: a process that
is still alive and answers is re-attached (a retiring one as retiring), anything else is
started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tensoryard.errors import ExecutorError, NotFound
from tensoryard.serving.autoscale import AutoscalePolicy, Autoscaler
from tensoryard.serving.engine import GATEWAY_OPTIONS, engine_command, parse_engine_options
from tensoryard.serving.gpu_engines import ENGINE_PORT, GPU_ENGINES
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.router import ROUTERS, ReplicaLoad, Route, Router
from tensoryard.store import Store
from tensoryard.store._serving import RETIRING_SLOT, DeploymentRecord, ReplicaRecord

if TYPE_CHECKING:
    from tensoryard.serving.kubernetes import KubeServing, ServingPod

__all__ = ["Replica", "ReplicaManager", "free_port"]

log = logging.getLogger("tensoryard.serving")

CommandFor = Callable[[DeploymentRecord, int], list[str]]
ADOPT_TIMEOUT_S = 10.0  # a new deployment is adopted within one tick when the supervisor runs
MAX_BACKOFF_S = 30.0  # a replica that keeps crashing is restarted at most this rarely
FOLLOW_S = 2.0  # how often deployments of MODEL@ALIAS look whether their alias moved
DRAIN_S = 60.0  # a retiring replica still busy this long after the new ones are ready is stopped
KUBE_POLL_S = 1.0  # how often a Kubernetes deployment's pods are listed (every tick when waited on)
KUBE_COLLECT_S = 10.0  # how often serving objects of deleted deployments are looked for


def on_kubernetes(rec: DeploymentRecord) -> bool:
    """Whether the deployment's replicas are pods on Kubernetes (not processes here)."""
    return rec.engine in GPU_ENGINES


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child is not alive
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class Replica:
    """A replica process as the supervisor and the gateway see it."""

    deployment: str
    slot: int
    port: int
    pid: int | None
    popen: subprocess.Popen[bytes] | None = None
    ready: bool = False
    in_flight: int = 0
    pending_chars: int = 0  # uncached prompt characters of the requests in flight
    restarts: int = 0
    retry_at: float | None = None  # set when it exited: restart no earlier than this
    host: str = "127.0.0.1"
    pod: ServingPod | None = None  # when the replica is a pod on Kubernetes

    @property
    def id(self) -> str:
        return f"{self.deployment}/{self.pod.name if self.pod is not None else self.slot}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def exited(self) -> bool:
        if self.pod is not None:
            return False  # Kubernetes restarts and replaces pods
        if self.popen is not None:
            return self.popen.poll() is not None
        return self.pid is None or not _alive(self.pid)


@dataclass
class _Deployment:
    record: DeploymentRecord
    router: Router
    replicas: dict[int, Replica] = field(default_factory=dict)
    last_request: float = 0.0
    asleep: bool = False  # scaled to zero after idling
    waiting: int = 0
    retiring: dict[int, Replica] = field(default_factory=dict)  # serving the previous model
    drain_from: float | None = None  # when every new replica was first seen ready
    autoscaler: Autoscaler | None = None
    target: int | None = None  # replicas wanted at the last reconcile (None: not yet)
    pod_slots: dict[str, int] = field(default_factory=dict)  # Kubernetes: pod name -> slot
    polled_at: float = float("-inf")  # Kubernetes: when its pods were last listed
    error: str = ""  # Kubernetes: why the last apply or listing failed ("" when it did not)


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
        self.kube = kube  # GPU engines' deployments run as pods through it (None: refused)
        self._collected_at = float("-inf")
        self.log_dir = log_dir
        self.metrics = metrics
        self.command_for = command_for
        self.tick_s = tick_s
        self.probe_timeout_s = probe_timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._deps: dict[str, _Deployment] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._http = httpx.Client(timeout=probe_timeout_s)
        # called with the stored deployments every FOLLOW_S (the plane sets an AliasFollower)
        self.follow: Callable[[list[DeploymentRecord]], None] | None = None
        self._followed_at = float("-inf")

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
                reps = [
                    r
                    for d in self._deps.values()
                    for r in (*d.replicas.values(), *d.retiring.values())
                    if r.pod is None  # pods outlive the control plane
                ]
            for r in reps:
                _terminate(r)
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
            if on_kubernetes(d.record):
                self._kube_delete(d.record.name)
                continue
            for r in (*d.replicas.values(), *d.retiring.values()):
                _terminate(r)
        for r in leftover:
            _terminate(r)
        if self.kube is not None and self.clock() - self._collected_at >= KUBE_COLLECT_S:
            self._collected_at = self.clock()
            try:  # objects of deployments deleted while no control plane watched
                for obj in self.kube.collect(records):
                    log.info("serving: deleted %s (its deployment no longer exists)", obj)
            except ExecutorError as exc:
                log.warning("serving: cannot look for leftover serving objects: %s", exc)
        for dep in deps:
            self._reconcile_one(dep)

    def _roll(
        self,
        old: _Deployment,
        rec: DeploymentRecord,
        rows: dict[int, ReplicaRecord],
        leftover: list[Replica],
    ) -> _Deployment:
        """The deployment after `rec` changed what it serves: ready old replicas whose rows
        the update moved to retiring slots keep serving; every other old process goes into
        `leftover` (to be stopped)."""
        router = ROUTERS[str(rec.options.get("router", "prefix"))]()
        new = _Deployment(rec, router, last_request=self.clock())
        if on_kubernetes(rec):  # Kubernetes rolls the pods over (maxUnavailable 0)
            new.replicas, new.pod_slots, new.target = old.replicas, old.pod_slots, old.target
            new.autoscaler = old.autoscaler
            return new
        for r in old.retiring.values():  # retiring since an earlier update: kept if its row is
            row = rows.get(r.slot)
            if row is not None and row.pid == r.pid and not r.exited():
                new.retiring[r.slot] = r
            else:
                leftover.append(r)
        for r in old.replicas.values():
            row = rows.get(RETIRING_SLOT + r.slot)
            if r.ready and row is not None and row.pid == r.pid and not r.exited():
                r.slot = RETIRING_SLOT + r.slot
                new.retiring[r.slot] = r
            else:
                leftover.append(r)
        return new

    def _adopt(self, rec: DeploymentRecord) -> _Deployment:
        """A deployment first seen by this process: re-attach to live replicas from the rows."""
        router = ROUTERS[str(rec.options.get("router", "prefix"))]()
        dep = _Deployment(record=rec, router=router, last_request=self.clock())
        if on_kubernetes(rec):
            return dep  # its pods are found by the first listing
        for row in self.store.list_replicas(rec.name):
            retiring = row.slot >= RETIRING_SLOT
            if row.pid is not None and _alive(row.pid) and self._answers(row.port):
                log.info("re-attached to replica %s/%d (pid %d)", rec.name, row.slot, row.pid)
                replica = Replica(
                    rec.name, row.slot, row.port, row.pid, ready=True, restarts=row.restarts
                )
                if retiring:  # a rolling update was under way: it goes on
                    dep.retiring[row.slot] = replica
                    continue
                dep.replicas[row.slot] = replica
                self.store.put_replica(
                    rec.name, row.slot, port=row.port, state="ready", pid=row.pid
                )
            else:
                if retiring and row.pid is not None and _alive(row.pid):
                    _terminate(Replica(rec.name, row.slot, row.port, row.pid))
                self.store.remove_replica(rec.name, row.slot)  # started again below
        return dep

    def _reconcile_one(self, dep: _Deployment) -> None:
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
            kube = on_kubernetes(rec)
            # surplus replicas get no new request (acquire) and stop once they have none
            surplus = (
                []
                if kube
                else [
                    dep.replicas.pop(s)
                    for s in sorted(dep.replicas)
                    if s >= target and dep.replicas[s].in_flight == 0
                ]
            )
            missing = [] if kube else [s for s in range(target) if s not in dep.replicas]
        if kube:  # 3-5 are Kubernetes' (Deployment / LeaderWorkerSet controllers)
            self._reconcile_kube(dep, target, now)
            return
        # 3. stop surplus, start missing
        for r in surplus:
            _terminate(r)
            dep.router.forget(r.id)
            self.store.remove_replica(rec.name, r.slot)
        for slot in missing:
            self._spawn(dep, slot, restarts=0)
        # 4. crashed -> restart; starting -> ready once it answers
        for r in list(dep.replicas.values()):
            if r.exited():
                if r.retry_at is None:  # just noticed: back off before the restart
                    delay = min(MAX_BACKOFF_S, 0.5 * 2 ** min(r.restarts, 10))
                    log.warning("replica %s exited; restarting it in %.1f s", r.id, delay)
                    with self._lock:
                        r.ready = False
                        r.retry_at = now + delay
                    dep.router.forget(r.id)
                    self.store.put_replica(rec.name, r.slot, port=r.port, state="failed", pid=r.pid)
                if now >= (r.retry_at or now):
                    self.metrics.restarts.labels(rec.name).inc()
                    self._spawn(dep, r.slot, restarts=r.restarts + 1)
            elif not r.ready and self._answers(r.port):
                with self._lock:
                    r.ready = True
                    dep.last_request = max(dep.last_request, self.clock())
                self.store.put_replica(rec.name, r.slot, port=r.port, state="ready", pid=r.pid)
                log.info("replica %s ready on port %d", r.id, r.port)
        # 5. rolling update: stop the previous model's replicas once the new ones all answer
        if dep.retiring:
            self._retire(dep, target, now)

    def _reconcile_kube(self, dep: _Deployment, target: int, now: float) -> None:
        """Apply the deployment's object with ``target`` replicas; its Ready pods (leaders)
        become the replicas the gateway routes to, by pod IP."""
        rec = dep.record
        if self.kube is None:
            if dep.error == "":
                dep.error = (
                    f"engine {rec.engine} runs on Kubernetes and this control plane has no "
                    "Kubernetes executor (fix: start the server with --executor kubernetes)"
                )
                log.error("deployment %s: %s", rec.name, dep.error)
            return
        try:
            changed = self.kube.ensure(rec, target)  # no API call when nothing changed
            if not changed and now - dep.polled_at < KUBE_POLL_S and dep.waiting == 0:
                return
            pods = self.kube.pods(rec)
        except (ExecutorError, ValueError) as exc:
            if str(exc) != dep.error:
                log.warning("deployment %s: %s", rec.name, exc)
            dep.error = str(exc)
            return
        dep.polled_at, dep.error = now, ""
        forget: list[str] = []
        with self._lock:
            names = {p.name for p in pods}
            for name in [n for n in dep.pod_slots if n not in names]:
                r = dep.replicas.pop(dep.pod_slots.pop(name), None)
                if r is not None:
                    forget.append(r.id)
            for p in pods:
                slot = dep.pod_slots.get(p.name)
                if slot is None:
                    used = set(dep.pod_slots.values())
                    slot = next(i for i in range(len(used) + 1) if i not in used)
                    dep.pod_slots[p.name] = slot
                r = dep.replicas.get(slot)
                if r is None:
                    r = dep.replicas[slot] = Replica(rec.name, slot, ENGINE_PORT, None)
                if p.ready and not r.ready:
                    log.info("replica %s/%s ready at %s", rec.name, p.name, p.ip)
                    dep.last_request = max(dep.last_request, self.clock())
                r.pod, r.host, r.ready, r.restarts = p, p.ip or "", p.ready, p.restarts
        for replica_id in forget:
            dep.router.forget(replica_id)

    def _kube_delete(self, name: str) -> None:
        if self.kube is None:
            return
        try:
            self.kube.delete(name)
            log.info("serving: deleted the Kubernetes objects of deployment %s", name)
        except ExecutorError as exc:  # collect() retries
            log.warning("serving: cannot delete deployment %s's objects: %s", name, exc)

    def error(self, name: str) -> str:
        """Why the last reconcile of a Kubernetes deployment failed ("" when it did not)."""
        with self._lock:
            dep = self._deps.get(name)
            return dep.error if dep is not None else ""

    def _retire(self, dep: _Deployment, target: int, now: float) -> None:
        with self._lock:
            ready = sum(1 for r in dep.replicas.values() if r.ready)
            if ready < target:
                dep.drain_from = None  # (a new replica crashed meanwhile: keep serving)
                done: list[Replica] = [r for r in dep.retiring.values() if r.exited()]
            else:
                if dep.drain_from is None:
                    dep.drain_from = now
                    log.info(
                        "deployment %s: %d new replica(s) ready, retiring %d",
                        dep.record.name,
                        ready,
                        len(dep.retiring),
                    )
                late = now - dep.drain_from > DRAIN_S
                done = [r for r in dep.retiring.values() if r.in_flight == 0 or late]
            for r in done:
                dep.retiring.pop(r.slot, None)
        for r in done:
            _terminate(r)
            dep.router.forget(r.id)
            self.store.remove_replica(dep.record.name, r.slot)

    def _spawn(self, dep: _Deployment, slot: int, *, restarts: int) -> None:
        rec = dep.record
        port = free_port()
        # intent first: a control plane dying after this line finds the row and restarts it
        self.store.put_replica(rec.name, slot, port=port, state="starting", restarted=restarts > 0)
        argv = self.command_for(rec, port)
        logs = self.log_dir / rec.name
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"replica-{slot}.log").open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        replica = Replica(rec.name, slot, port, popen.pid, popen, restarts=restarts)
        with self._lock:  # known in memory before anything else can fail: stop() finds it
            dep.replicas[slot] = replica
        try:
            self.store.put_replica(rec.name, slot, port=port, state="starting", pid=popen.pid)
        except NotFound:  # the deployment was deleted while this replica started
            log.info(
                "deployment %s was deleted while replica %d started: stopping it", rec.name, slot
            )
            with self._lock:
                if dep.replicas.get(slot) is replica:
                    del dep.replicas[slot]
            _terminate(replica)

    def _answers(self, port: int) -> bool:
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


def _terminate(r: Replica, grace_s: float = 5.0) -> None:
    """SIGTERM the replica's process group, SIGKILL after the grace period."""
    if r.pid is None:
        return
    try:
        os.killpg(r.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if r.popen is not None:
            if r.popen.poll() is not None:
                return
        elif not _alive(r.pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(r.pid, signal.SIGKILL)
    if r.popen is not None:
        r.popen.wait(timeout=5)
