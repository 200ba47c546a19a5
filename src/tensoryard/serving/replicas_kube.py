"""Replicas as pods on Kubernetes: the backend of the GPU engines (vLLM, SGLang).

The supervisor's target count becomes the replica count of the deployment's object (a
Deployment, or a LeaderWorkerSet for a multi-node replica) through
:class:`tensoryard.serving.kubernetes.KubeServing`; Kubernetes' controllers start, restart and
roll the pods over (phases 3 to 5 are theirs). Its Ready pods (leaders) become the replicas the
gateway routes to, by pod IP. Pods outlive the control plane; a new one finds them by listing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tensoryard.errors import ExecutorError
from tensoryard.serving.gpu_engines import ENGINE_PORT
from tensoryard.serving.replica_state import DeploymentState, Replica, Supervisor
from tensoryard.store._serving import ReplicaRecord

if TYPE_CHECKING:
    from tensoryard.serving.kubernetes import KubeServing

__all__ = ["KUBE_COLLECT_S", "KUBE_POLL_S", "KubeReplicas"]

log = logging.getLogger("tensoryard.serving")

KUBE_POLL_S = 1.0  # how often a Kubernetes deployment's pods are listed (every tick when waited on)
KUBE_COLLECT_S = 10.0  # how often serving objects of deleted deployments are looked for


class KubeReplicas:
    """The :class:`~tensoryard.serving.replica_state.ReplicaBackend` of pods. ``kube`` None:
    this control plane has no Kubernetes executor, and such deployments report why."""

    def __init__(self, sup: Supervisor, kube: KubeServing | None) -> None:
        self.sup = sup
        self.kube = kube
        self._collected_at = float("-inf")

    def adopt(self, dep: DeploymentState) -> None:
        """Nothing to read back: its pods are found by the first listing."""

    def roll(
        self,
        old: DeploymentState,
        new: DeploymentState,
        rows: dict[int, ReplicaRecord],
        leftover: list[Replica],
    ) -> None:
        """Kubernetes rolls the pods over (maxUnavailable 0): the new state keeps the pods."""
        new.replicas, new.pod_slots, new.target = old.replicas, old.pod_slots, old.target
        new.autoscaler = old.autoscaler

    def reconcile(self, dep: DeploymentState, target: int, now: float) -> None:
        """Apply the deployment's object with ``target`` replicas; list its pods."""
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
        with self.sup.lock:
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
                    dep.last_request = max(dep.last_request, self.sup.clock())
                r.pod, r.host, r.ready, r.restarts = p, p.ip or "", p.ready, p.restarts
        for replica_id in forget:
            dep.router.forget(replica_id)

    def forget(self, dep: DeploymentState) -> None:
        if self.kube is None:
            return
        try:
            self.kube.delete(dep.record.name)
            log.info("serving: deleted the Kubernetes objects of deployment %s", dep.record.name)
        except ExecutorError as exc:  # sweep() retries
            log.warning("serving: cannot delete deployment %s's objects: %s", dep.record.name, exc)

    def sweep(self, deployments: Iterable[str]) -> None:
        """Every KUBE_COLLECT_S: delete objects of deployments deleted while no control plane
        watched."""
        if self.kube is None or self.sup.clock() - self._collected_at < KUBE_COLLECT_S:
            return
        self._collected_at = self.sup.clock()
        try:
            for obj in self.kube.collect(deployments):
                log.info("serving: deleted %s (its deployment no longer exists)", obj)
        except ExecutorError as exc:
            log.warning("serving: cannot look for leftover serving objects: %s", exc)

    def shutdown(self, deps: Iterable[DeploymentState]) -> None:
        """Nothing: pods outlive the control plane, and the next one finds them."""
