"""The control plane's metrics of its own pods on Kubernetes (no cluster needed).

Pods here are shaped like the API server's JSON, as the executor's watch cache holds them; the
e2e_k8s test `test_pod_metrics_k8s.py` scrapes the same metrics from pods the real controllers,
kube-scheduler and kwok made."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tensoryard.errors import ExecutorError
from tensoryard.executors.kubernetes.pod_metrics import PodCollector, failed_reason, waiting_reason
from tensoryard.observability import metrics as m


def pod(
    name: str,
    phase: str,
    *,
    job: str = "42",
    team: str = "vision",
    rank: int = 0,
    node: str | None = "k1",
    deleting: bool = False,
    **status: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "labels": {
            "tensoryard.io/job-id": job,
            "tensoryard.io/team": team,
            "tensoryard.io/attempt": "1",
            "tensoryard.io/attempt-key": f"k-{job}",
        },
        "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T17:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "img:1"}]},
        "status": {"phase": phase, **status},
    }


def waiting(reason: str) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "trainer", "state": {"waiting": {"reason": reason}}}]}


def terminated(reason: str, *, restarts: int = 0, last: bool = False) -> dict[str, Any]:
    key = "lastState" if last else "state"
    state: dict[str, Any] = {key: {"terminated": {"exitCode": 137, "reason": reason}}}
    if last:
        state["state"] = {"running": {}}
    return {"containerStatuses": [{"name": "trainer", "restartCount": restarts, **state}]}


UNSCHEDULED = {
    "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4"}
    ]
}


def scrape(pods: Any) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(PodCollector(pods))
    text = generate_latest(registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(series: list[tuple[dict[str, str], float]], **labels: str) -> float:
    matches = [v for lbl, v in series if all(lbl.get(k) == x for k, x in labels.items())]
    assert len(matches) == 1, (labels, series)
    return matches[0]


PODS = [
    pod(
        "ty-42-1-node-0-0-a",
        "Running",
        rank=0,
        node="k1",
        **terminated("OOMKilled", restarts=2, last=True),
    ),
    pod("ty-42-1-node-0-1-b", "Running", rank=1, node="k2"),
    pod("ty-43-1-node-0-0-c", "Pending", job="43", node=None, **UNSCHEDULED),
    pod("ty-44-1-node-0-0-d", "Pending", job="44", team="nlp", **waiting("ErrImagePull")),
    pod("ty-45-1-node-0-0-e", "Pending", job="45", **waiting("ImagePullBackOff")),
    pod("ty-46-1-node-0-0-f", "Pending", job="46", **waiting("SomethingNew")),
    pod("ty-47-1-node-0-0-g", "Failed", job="47", **terminated("OOMKilled")),
    pod("ty-48-1-node-0-0-h", "Failed", job="48", reason="Evicted"),
    pod("ty-49-1-node-0-0-i", "Succeeded", job="49", **terminated("Completed")),
    pod("ty-50-1-node-0-0-j", "Running", job="50", deleting=True),
]


def test_every_live_pod_maps_to_its_job_team_rank_and_node():
    out = scrape(lambda: PODS)
    info = out["tyard_k8s_pod_info"]
    live = {lbl["pod"]: lbl for lbl, v in info if v == 1.0}
    assert set(live) == {
        "ty-42-1-node-0-0-a",
        "ty-42-1-node-0-1-b",
        "ty-43-1-node-0-0-c",
        "ty-44-1-node-0-0-d",
        "ty-45-1-node-0-0-e",
        "ty-46-1-node-0-0-f",
    }  # ended and terminating pods have no per-pod series
    assert live["ty-42-1-node-0-1-b"] == {
        "job": "42",
        "team": "vision",
        "attempt": "1",
        "rank": "1",
        "namespace": "ml",
        "pod": "ty-42-1-node-0-1-b",
        "node": "k2",
    }
    assert live["ty-43-1-node-0-0-c"]["node"] == ""
    assert value(out["tyard_k8s_pod_phase"], pod="ty-43-1-node-0-0-c") == 1.0
    assert value(out["tyard_k8s_pod_phase"], pod="ty-43-1-node-0-0-c", phase="Pending") == 1.0


def test_phases_waiting_and_failure_reasons_are_counted_from_fixed_sets():
    out = scrape(lambda: PODS)
    phases = {lbl["phase"]: v for lbl, v in out["tyard_k8s_pods"]}
    assert phases == {"Pending": 4, "Running": 3, "Succeeded": 1, "Failed": 2, "Unknown": 0}
    waiting_ = {lbl["reason"]: v for lbl, v in out["tyard_k8s_pods_waiting"]}
    assert waiting_["Unschedulable"] == 1
    assert waiting_["ErrImagePull"] == 1
    assert waiting_["ImagePullBackOff"] == 1
    assert waiting_["Other"] == 1  # an unknown reason does not become a new label value
    assert sum(waiting_.values()) == 4
    failed = {lbl["reason"]: v for lbl, v in out["tyard_k8s_pods_failed"]}
    assert failed == {"OOMKilled": 1, "Evicted": 1, "DeadlineExceeded": 0, "Error": 0, "Other": 0}


def test_restarts_and_an_in_place_oom_kill_are_per_pod():
    out = scrape(lambda: PODS)
    assert value(out["tyard_k8s_pod_container_restarts"], pod="ty-42-1-node-0-0-a") == 2
    assert value(out["tyard_k8s_pod_oom_killed"], pod="ty-42-1-node-0-0-a") == 1
    assert value(out["tyard_k8s_pod_oom_killed"], pod="ty-42-1-node-0-1-b") == 0


def test_a_scrape_answers_when_the_api_server_does_not():
    def broken() -> list[dict[str, Any]]:
        raise ExecutorError("list pods in namespace ml: connection refused")

    out = scrape(broken)
    assert out["tyard_k8s_pods_observed"] == [({}, 0.0)]
    assert "tyard_k8s_pod_info" not in out
    assert scrape(lambda: [])["tyard_k8s_pods_observed"] == [({}, 1.0)]


def test_the_series_are_declared_so_rules_and_dashboards_may_use_them():
    out = scrape(lambda: PODS)
    declared = {d.name: d for d in m.K8S_PODS}
    assert set(out) == set(declared)
    for name, series in out.items():
        for labels, _ in series:
            assert set(labels) == set(declared[name].labels), name


def test_reasons_of_single_pods():
    assert waiting_reason(pod("p", "Running")) is None
    assert waiting_reason(pod("p", "Pending", node=None)) == "Unschedulable"
    assert waiting_reason(pod("p", "Pending")) == "ContainerCreating"
    assert failed_reason(pod("p", "Running")) is None
    assert failed_reason(pod("p", "Failed", reason="DeadlineExceeded")) == "DeadlineExceeded"
    assert failed_reason(pod("p", "Failed", **terminated("Error"))) == "Error"
    assert failed_reason(pod("p", "Failed")) == "Other"
