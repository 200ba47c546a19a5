"""Prometheus metrics of the platform's own pods, read at scrape time from the executor's pod
watch cache (no API call per scrape while the watch is healthy).

Series (all gauges; Prometheus sees changes between scrapes):

    tyard_k8s_pods{phase}                          pods of platform jobs by phase
    tyard_k8s_pod_info{job,team,attempt,rank,namespace,pod,node}
                                                   1 per live pod: the pod -> job map that
                                                   recording rules join DCGM exporter series with
    tyard_k8s_pod_phase{job,team,rank,namespace,pod,phase}
                                                   1 per live pod, labelled with its phase
    tyard_k8s_pod_container_restarts{job,team,rank,namespace,pod}
                                                   restarts of the pod's containers (a counter on
                                                   the kubelet's side: use increase())
    tyard_k8s_pod_oom_killed{job,team,rank,namespace,pod}
                                                   1 when a live pod's container last ended
                                                   OOMKilled (restarted in place)
    tyard_k8s_pods_failed{reason}                  failed pods still kept by their JobSet/Job,
                                                   by why (OOMKilled, Evicted, Error, ...)
    tyard_k8s_pods_waiting{reason}                 pods not running yet, by why
                                                   (Unschedulable, ErrImagePull, ...)

`job` is tensoryard's job id, as on the control plane's other job series (Prometheus scrapes
it with honor_labels). Cardinality: per-pod series exist only for live (Pending or Running)
pods of this namespace's platform jobs, so they are bounded by the pods the cluster can hold;
a pod's series disappear when it ends. `reason` and `phase` come from small fixed sets
(anything else is "Other").
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tensoryard.errors import ExecutorError
from tensoryard.executors.kubernetes.manifests import LABEL_JOB_ID, LABEL_TEAM
from tensoryard.executors.kubernetes.status import Obj, get, pod_rank

__all__ = [
    "FAILED_REASONS",
    "PHASES",
    "WAITING_REASONS",
    "PodCollector",
    "failed_reason",
    "waiting_reason",
]

log = logging.getLogger("tensoryard.executors.kubernetes")

PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
WAITING_REASONS = (
    "Unschedulable",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "ContainerCreating",
    "PodInitializing",
    "Other",
)
FAILED_REASONS = ("OOMKilled", "Evicted", "DeadlineExceeded", "Error", "Other")
_LIVE = ("Pending", "Running")
_POD_LABELS = ["job", "team", "rank", "namespace", "pod"]


def waiting_reason(pod: Obj) -> str | None:
    """Why a Pending pod does not run yet, from the fixed WAITING_REASONS (None: not waiting)."""
    if get(pod, "status", "phase") != "Pending":
        return None
    for cond in get(pod, "status", "conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return "Unschedulable" if cond.get("reason") == "Unschedulable" else "Other"
    for status in get(pod, "status", "containerStatuses") or []:
        reason = get(status, "state", "waiting", "reason")
        if reason:
            return str(reason) if reason in WAITING_REASONS else "Other"
    if not get(pod, "spec", "nodeName"):
        return "Unschedulable"  # not yet looked at by the scheduler counts as unplaced
    return "ContainerCreating"


def failed_reason(pod: Obj) -> str | None:
    """Why a Failed pod failed, from the fixed FAILED_REASONS (None: it did not fail)."""
    if get(pod, "status", "phase") != "Failed":
        return None
    reason = get(pod, "status", "reason")
    if reason in ("Evicted", "DeadlineExceeded"):
        return str(reason)
    for status in get(pod, "status", "containerStatuses") or []:
        ended = get(status, "state", "terminated", "reason")
        if ended == "OOMKilled":
            return "OOMKilled"
        if ended:
            return "Error"
    return "Other"


def _oom_killed(pod: Obj) -> bool:
    for status in get(pod, "status", "containerStatuses") or []:
        for state in ("state", "lastState"):
            if get(status, state, "terminated", "reason") == "OOMKilled":
                return True
    return False


def _restarts(pod: Obj) -> int:
    return sum(
        int(s.get("restartCount") or 0) for s in get(pod, "status", "containerStatuses") or []
    )


class PodCollector(Collector):
    """The metrics above for the pods `pods()` returns (the executor's `observed_pods`)."""

    def __init__(self, pods: Callable[[], list[Obj]]) -> None:
        self._pods = pods

    def describe(self) -> Iterator[Metric]:
        return iter(())  # series depend on live pods: nothing to declare up front

    def collect(self) -> Iterator[Metric]:
        try:
            pods = self._pods()
        except ExecutorError as exc:  # a scrape answers even when the API server does not
            log.warning("pod metrics: %s", exc)
            pods = None
        up = GaugeMetricFamily(
            "tyard_k8s_pods_observed",
            "1 when the control plane could read its pods from Kubernetes at this scrape",
        )
        up.add_metric([], 0.0 if pods is None else 1.0)
        yield up
        if pods is None:
            return
        by_phase = GaugeMetricFamily(
            "tyard_k8s_pods", "Pods of platform jobs by phase", labels=["phase"]
        )
        info = GaugeMetricFamily(
            "tyard_k8s_pod_info",
            "1 per live pod of a platform job: joins pod-labelled series (the DCGM exporter's) "
            "to jobs and teams",
            labels=["job", "team", "attempt", "rank", "namespace", "pod", "node"],
        )
        phase = GaugeMetricFamily(
            "tyard_k8s_pod_phase",
            "1 per live pod of a platform job, labelled with its phase",
            labels=[*_POD_LABELS, "phase"],
        )
        restarts = GaugeMetricFamily(
            "tyard_k8s_pod_container_restarts",
            "Container restarts of a live pod (as the kubelet counts them)",
            labels=_POD_LABELS,
        )
        oom = GaugeMetricFamily(
            "tyard_k8s_pod_oom_killed",
            "1 when a container of a live pod last ended OOMKilled",
            labels=_POD_LABELS,
        )
        failed = GaugeMetricFamily(
            "tyard_k8s_pods_failed",
            "Failed pods of platform jobs still kept by their JobSet or Job, by why",
            labels=["reason"],
        )
        waiting = GaugeMetricFamily(
            "tyard_k8s_pods_waiting",
            "Pending pods of platform jobs by why they do not run yet",
            labels=["reason"],
        )
        phases: Counter[str] = Counter({p: 0 for p in PHASES})
        reasons: Counter[str] = Counter({r: 0 for r in WAITING_REASONS})
        failures: Counter[str] = Counter({r: 0 for r in FAILED_REASONS})
        for pod in sorted(pods, key=lambda p: str(get(p, "metadata", "name"))):
            current = str(get(pod, "status", "phase") or "Unknown")
            current = current if current in PHASES else "Unknown"
            phases[current] += 1
            why = failed_reason(pod)
            if why is not None:
                failures[why] += 1
            if current not in _LIVE or get(pod, "metadata", "deletionTimestamp"):
                continue
            labels = get(pod, "metadata", "labels") or {}
            values = [
                str(labels.get(LABEL_JOB_ID, "")),
                str(labels.get(LABEL_TEAM, "")),
                str(pod_rank(pod)),
                str(get(pod, "metadata", "namespace") or ""),
                str(get(pod, "metadata", "name")),
            ]
            info.add_metric(
                [
                    values[0],
                    values[1],
                    str(labels.get("tensoryard.io/attempt", "")),
                    values[2],
                    values[3],
                    values[4],
                    str(get(pod, "spec", "nodeName") or ""),
                ],
                1.0,
            )
            phase.add_metric([*values, current], 1.0)
            restarts.add_metric(values, float(_restarts(pod)))
            oom.add_metric(values, 1.0 if _oom_killed(pod) else 0.0)
            reason = waiting_reason(pod)
            if reason is not None:
                reasons[reason] += 1
        for name, count in phases.items():
            by_phase.add_metric([name], float(count))
        for name, count in reasons.items():
            waiting.add_metric([name], float(count))
        for name, count in failures.items():
            failed.add_metric([name], float(count))
        yield from (by_phase, info, phase, restarts, oom, waiting, failed)
