"""Kueue as the admission engine (`tyard server --admission kueue`).

    launch:  JobSet/Job created suspended, labelled kueue.x-k8s.io/queue-name=<team>
    Kueue:   Workload (owned by the JobSet) ─ QuotaReserved + Admitted ─> JobSet unsuspended,
             pods get the ResourceFlavor's node labels and tolerations, kube-scheduler binds them
    evicted: (reclaim by the lender, higher priority) Kueue suspends the JobSet again: its pods
             get SIGTERM (the runtime checkpoints); tensoryard ends the attempt as preempted,
             deletes the JobSet (Kueue would otherwise run it again under the old attempt) and
             requeues the job, whose next attempt resumes from the last checkpoint.

While the JobSet waits, a poll answers STARTING with `queued=True` and Kueue's own words (the
Workload's QuotaReserved condition: "couldn't assign flavors to pod set node: insufficient
unused quota for nvidia.com/gpu in flavor gpu-h100, 8 more needed"), which `tyard describe`
shows. Kueue gives no start estimate, so none is claimed.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from tensoryard.errors import ExecutorError
from tensoryard.executors.base import AttemptPhase, AttemptStatus
from tensoryard.executors.kubernetes.client import Kube, KubeApiError
from tensoryard.executors.kubernetes.manifests import GPU_RESOURCE, KUEUE_QUEUE_LABEL
from tensoryard.executors.kubernetes.status import Obj, get
from tensoryard.executors.kubernetes.watch import WatchCache

__all__ = ["KUEUE", "KueueAdmission"]

KUEUE = ("kueue.x-k8s.io", "v1beta2")
PREEMPTED_BY_KUEUE = "preempted by Kueue"
_QUEUES_TTL_S = 10.0
# A ClusterQueue's borrowed GPUs, for messages only: read at most this often per queue (every
# admitted attempt's message asked for it, one GET each per control cycle: 2,000 jobs in
# benchmarks/k8s_admission.py made that a steady stream of reads on a busy API server)
_BORROWED_TTL_S = 5.0
log = logging.getLogger("tensoryard.executor.kubernetes")
_NO_WORKLOAD_HINT_S = 30.0  # a JobSet this old without a Workload: say Kueue may be down


def _age_s(obj: Obj) -> float | None:
    created = get(obj, "metadata", "creationTimestamp")
    if not created:
        return None
    try:
        when = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (datetime.now(UTC) - when).total_seconds()


def _reserved_at(conditions: dict[str, Obj]) -> float | None:
    """When Kueue reserved the Workload's quota (QuotaReserved True), unix seconds."""
    reserved = _true(conditions, "QuotaReserved")
    stamp = reserved.get("lastTransitionTime") if reserved is not None else None
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _owner_uids(wl: Obj) -> list[str]:
    return [str(r.get("uid")) for r in get(wl, "metadata", "ownerReferences") or []]


def _ended(owner: Obj) -> bool:
    """The JobSet (terminalState) or Job (Complete/Failed condition) has finished."""
    if get(owner, "status", "terminalState"):
        return True
    return any(
        c.get("type") in ("Complete", "Failed", "Completed") and c.get("status") == "True"
        for c in get(owner, "status", "conditions") or []
    )


def _conditions(obj: Obj | None) -> dict[str, Obj]:
    return {str(c.get("type")): c for c in (get(obj, "status", "conditions") or [])}


def _true(conditions: dict[str, Obj], kind: str) -> Obj | None:
    c = conditions.get(kind)
    return c if c is not None and c.get("status") == "True" else None


def _eviction(conditions: dict[str, Obj]) -> Obj | None:
    """The Workload's current eviction (Preempted or Evicted True), or None. One that Kueue
    has since re-admitted (QuotaReserved True at a later time) is history, not current."""
    evicted = _true(conditions, "Preempted") or _true(conditions, "Evicted")
    reserved = _true(conditions, "QuotaReserved")
    if evicted is None or reserved is None:
        return evicted
    since = str(evicted.get("lastTransitionTime", ""))
    return None if str(reserved.get("lastTransitionTime", "")) > since else evicted


class KueueAdmission:
    """Reads Kueue's Workloads for the executor's JobSets/Jobs (one namespace)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self._cache: WatchCache | None = None
        self._admitted: dict[str, str] = {}  # attempt key -> how Kueue admitted it
        self._admitted_at: dict[str, float | None] = {}  # attempt key -> QuotaReserved time
        self._queues: tuple[float, set[str]] = (float("-inf"), set())  # (read at, names)
        self._classes: tuple[float, list[tuple[str, int]]] = (float("-inf"), [])
        self._borrowed: dict[str, tuple[float, int]] = {}  # ClusterQueue -> (read at, GPUs)

    # -- checks -------------------------------------------------------------------------------

    def check_installed(self) -> None:
        """ExecutorError unless Kueue's Workload API is served and the namespace has at least
        one LocalQueue (nothing is created either way)."""
        try:
            queues = self._list("localqueues")
        except KubeApiError as exc:
            if exc.status == 404:
                raise ExecutorError(
                    "--admission kueue: Kueue is not installed on this cluster (the API "
                    f"{KUEUE[0]}/{KUEUE[1]} is not served; fix: install Kueue >= 0.17, or run "
                    "without --admission kueue)"
                ) from exc
            raise
        if not queues:
            raise ExecutorError(
                f"--admission kueue: namespace {self.namespace} has no Kueue LocalQueue (fix: "
                "apply the kueue/kueue.yaml that `tyard cluster plan` wrote, with the "
                "inventory's cluster.namespace set to this namespace)"
            )

    def priority_classes(self) -> list[tuple[str, int]]:
        """The cluster's WorkloadPriorityClasses (name, value), lowest first, re-read at most
        every _QUEUES_TTL_S; [] when none exist or this identity may not list them."""
        read_at, classes = self._classes
        if time.monotonic() - read_at < _QUEUES_TTL_S:
            return classes
        k = self.kube
        try:
            result: Any = k.call(
                f"list workloadpriorityclasses.{KUEUE[0]}",
                k.custom.list_cluster_custom_object,
                *KUEUE,
                "workloadpriorityclasses",
            )
            classes = sorted(
                (
                    (str(get(c, "metadata", "name")), int(c.get("value") or 0))
                    for c in result.get("items") or []
                ),
                key=lambda c: (c[1], c[0]),
            )
        except KubeApiError as exc:
            if exc.status not in (403, 404):
                raise
            log.warning("Kueue priority classes not read (%s): jobs get none", exc)
            classes = []
        self._classes = (time.monotonic(), classes)
        return classes

    def priority_class_for(self, priority: int) -> str | None:
        """The WorkloadPriorityClass of a job's priority: the highest class whose value is at
        most the priority, else the lowest class (so a higher-priority job never gets a lower
        class than another); None when the cluster has none."""
        classes = self.priority_classes()
        if not classes:
            return None
        fitting = [name for name, value in classes if value <= priority]
        return fitting[-1] if fitting else classes[0][0]

    def local_queues(self) -> set[str]:
        """LocalQueue names of the namespace, re-read at most every _QUEUES_TTL_S (a batch
        of submissions checks them once)."""
        read_at, names = self._queues
        now = time.monotonic()
        if now - read_at > _QUEUES_TTL_S:
            names = {str(get(q, "metadata", "name")) for q in self._list("localqueues")}
            self._queues = (now, names)
        return names

    def check_queue(self, team: str) -> tuple[str, str] | None:
        """None when the team's LocalQueue exists, else (problem, fix) for the `team` field."""
        queues = self.local_queues()
        if team not in queues:
            self._queues = (float("-inf"), set())  # just created? read again, once
            queues = self.local_queues()
        if team in queues:
            return None
        return (
            f"no Kueue LocalQueue {team!r} in namespace {self.namespace} (jobs wait in the "
            f"LocalQueue named after their team; there are: {', '.join(sorted(queues)) or 'none'})",
            "submit as a team that has a LocalQueue, or add the team to the inventory's quotas "
            "and apply the kueue/kueue.yaml `tyard cluster plan` writes",
        )

    # -- watch --------------------------------------------------------------------------------

    def start_watch(self) -> None:
        k = self.kube
        self._cache = WatchCache(
            k,
            f"kueue workloads in {self.namespace}",
            k.custom.list_namespaced_custom_object,
            *KUEUE,
            self.namespace,
            "workloads",
            index=_owner_uids,
        ).start()

    def stop(self) -> None:
        if self._cache is not None:
            self._cache.stop()

    # -- status -------------------------------------------------------------------------------

    def workload_of(self, owner: Obj) -> Obj | None:
        """The Workload Kueue made for `owner` (by owner reference uid)."""
        uid = get(owner, "metadata", "uid")
        cache = self._cache
        if cache is not None and cache.ready():
            found = cache.indexed(str(uid))
            return found[0] if found else None
        for wl in self._list("workloads"):
            for ref in get(wl, "metadata", "ownerReferences") or []:
                if ref.get("uid") == uid:
                    return wl
        return None

    def held(self, attempt_key: str, owner: Obj) -> AttemptStatus | None:
        """The attempt's status while Kueue holds its JobSet/Job suspended (waiting, or
        evicted: CANCELLED with a 'preempted by Kueue' reason); None when it is not held."""
        suspended, ended = bool(get(owner, "spec", "suspend")), _ended(owner)
        if not suspended and not ended:
            return None  # running as Kueue admitted it: its own status says how
        queue = (get(owner, "metadata", "labels") or {}).get(KUEUE_QUEUE_LABEL, "?")
        wl = self.workload_of(owner)
        if ended:
            # It ended. If Kueue was evicting it, its pods may have exited 0 on the eviction's
            # SIGTERM after a checkpoint (the runtime stops early): that is no success. Requeue
            # it; an attempt that had in fact finished resumes at its last step and ends.
            evicted = _eviction(_conditions(wl))
            if evicted is None:
                return None
            self._admitted.pop(attempt_key, None)
            return AttemptStatus(
                AttemptPhase.CANCELLED,
                reason=f"{PREEMPTED_BY_KUEUE} ({evicted.get('reason', '')}): "
                f"{evicted.get('message', '')}; it ended while being evicted, so it resumes "
                "from its last checkpoint",
            )
        if wl is None:
            age = _age_s(owner)
            hint = (
                f"; none after {_NO_WORKLOAD_HINT_S:.0f}s: is the Kueue controller running "
                "(kubectl get pods -n kueue-system)?"
                if age is not None and age > _NO_WORKLOAD_HINT_S
                else ""
            )
            return AttemptStatus(
                AttemptPhase.STARTING,
                reason=f"waiting for Kueue to create its Workload (LocalQueue {queue}){hint}",
                queued=True,
            )
        conds = _conditions(wl)
        evicted = _eviction(conds)
        if evicted is not None and not _true(conds, "QuotaReserved"):
            self._admitted.pop(attempt_key, None)
            return AttemptStatus(
                AttemptPhase.CANCELLED,
                reason=f"{PREEMPTED_BY_KUEUE} ({evicted.get('reason', '')}): "
                f"{evicted.get('message', '')}",
            )
        if evicted is not None:  # still holding its quota while its pods stop
            return AttemptStatus(
                AttemptPhase.STARTING,
                reason=f"being preempted by Kueue ({evicted.get('reason', '')}): "
                f"{evicted.get('message', '')}; its pods are stopping",
            )
        if _true(conds, "QuotaReserved") or _true(conds, "Admitted"):
            return AttemptStatus(
                AttemptPhase.STARTING,
                reason=f"admitted by Kueue: {self._describe_admission(wl)}; starting its pods",
                admitted_at=_reserved_at(conds),
            )
        reserved = conds.get("QuotaReserved")
        why = str(reserved.get("message")) if reserved else "Kueue has not considered it yet"
        return AttemptStatus(
            AttemptPhase.STARTING,
            reason=f"waiting for Kueue admission in LocalQueue {queue}: {why}",
            queued=True,
        )

    def admitted(self, attempt_key: str, owner: Obj) -> str:
        """How Kueue admitted a running attempt ("ClusterQueue nlp, flavor gpu-h100, borrowing
        8 nvidia.com/gpu from its cohort"); computed once per attempt."""
        known = self._admitted.get(attempt_key)
        if known is not None:
            return known
        wl = self.workload_of(owner)
        text = self._describe_admission(wl, fresh=True) if wl is not None else ""
        self._admitted[attempt_key] = text
        self._admitted_at[attempt_key] = _reserved_at(_conditions(wl)) if wl is not None else None
        return text

    def admitted_at(self, attempt_key: str) -> float | None:
        """When Kueue reserved the quota of an attempt `admitted` described (None: unknown)."""
        return self._admitted_at.get(attempt_key)

    def forget(self, attempt_key: str) -> None:
        self._admitted.pop(attempt_key, None)
        self._admitted_at.pop(attempt_key, None)

    def _describe_admission(self, wl: Obj, *, fresh: bool = False) -> str:
        """'ClusterQueue nlp, flavor gpu-h100, ...'; the borrowing read anew when ``fresh`` (once
        per attempt, when it runs), else at most every _BORROWED_TTL_S (each poll held)."""
        admission = get(wl, "status", "admission") or {}
        cq = str(admission.get("clusterQueue", "?"))
        flavors = sorted(
            {
                str(f)
                for ps in admission.get("podSetAssignments") or []
                for f in (ps.get("flavors") or {}).values()
            }
        )
        parts = [f"ClusterQueue {cq}"] + ([f"flavor {', '.join(flavors)}"] if flavors else [])
        borrowed = self._borrowed_gpus(cq, fresh=fresh)
        if borrowed:
            parts.append(f"the ClusterQueue borrows {borrowed} {GPU_RESOURCE} from its cohort")
        return ", ".join(parts)

    def _borrowed_gpus(self, cluster_queue: str, *, fresh: bool = False) -> int:
        known = self._borrowed.get(cluster_queue)
        now = time.monotonic()
        if not fresh and known is not None and now - known[0] < _BORROWED_TTL_S:
            return known[1]
        total = self._read_borrowed_gpus(cluster_queue)
        self._borrowed[cluster_queue] = (now, total)
        return total

    def _read_borrowed_gpus(self, cluster_queue: str) -> int:
        try:
            cq = self.kube.call(
                f"get clusterqueue {cluster_queue}",
                self.kube.custom.get_cluster_custom_object,
                *KUEUE,
                "clusterqueues",
                cluster_queue,
            )
        except ExecutorError:
            return 0  # only for the message: no `get clusterqueues` right, no borrowing shown
        total = 0
        for flavor in get(cq, "status", "flavorsUsage") or []:
            for r in flavor.get("resources") or []:
                if r.get("name") == GPU_RESOURCE:
                    total += _count(r.get("borrowed"))
        return total

    def _list(self, plural: str) -> list[Obj]:
        k, ns = self.kube, self.namespace
        result: Any = k.call(
            f"list {plural}.{KUEUE[0]} in namespace {ns}",
            k.custom.list_namespaced_custom_object,
            *KUEUE,
            ns,
            plural,
        )
        return list(result.get("items") or [])


def _count(value: Any) -> int:
    try:
        return int(str(value or 0))
    except ValueError:
        return 0
