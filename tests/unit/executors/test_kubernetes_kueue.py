"""Kueue admission mode without a cluster: what a poll says while Kueue holds an attempt's
JobSet suspended, the start-up checks, the rendered JobSet/Job and the command-line option.

The Kubernetes client is a fake (`FakeKube`): it serves Workloads, LocalQueues and
ClusterQueues from dicts shaped like the API server's JSON, and turns a client ApiException
into KubeApiError through the real `Kube.translated`. tests/e2e_k8s/test_kueue_admission.py
runs the same paths against a real Kueue."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner

from tensoryard.cli.k8s import kubernetes_config
from tensoryard.cli.main import app
from tensoryard.errors import ExecutorError, SpecError
from tensoryard.executors.base import AttemptPhase, LaunchRequest
from tensoryard.executors.kubernetes.client import Kube, KubeApiError
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.kubernetes.executor import KubernetesExecutor, workload_for
from tensoryard.executors.kubernetes.kueue import KUEUE, KueueAdmission
from tensoryard.executors.kubernetes.manifests import (
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    AttemptWorkload,
    render_indexed_job,
    render_jobset,
)
from tensoryard.server.controller import PREEMPTED
from tensoryard.spec.job import parse_job_spec

NAMESPACE = "research"
OWNER_UID = "6f1c-jobset-uid"
WAITING_MESSAGE = (
    "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu "
    "in flavor gpu-h100, 8 more needed"
)


# ---- the fake client ---------------------------------------------------------------------------


@dataclass
class FakeCustom:
    """CustomObjectsApi serving Kueue objects; an ApiException where one is set."""

    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # plural -> items
    cluster_queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, ApiException] = field(default_factory=dict)  # plural -> raised
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, **kwargs: Any
    ) -> dict[str, Any]:
        self.calls.append(("list", group, version, namespace, plural))
        if plural in self.errors:
            raise self.errors[plural]
        return {"items": list(self.objects.get(plural, []))}

    def list_cluster_custom_object(
        self, group: str, version: str, plural: str, **kwargs: Any
    ) -> dict[str, Any]:
        self.calls.append(("list", group, version, plural))
        if plural in self.errors:
            raise self.errors[plural]
        return {"items": list(self.objects.get(plural, []))}

    def get_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, **kwargs: Any
    ) -> dict[str, Any]:
        self.calls.append(("get", group, version, plural, name))
        if plural in self.errors:
            raise self.errors[plural]
        if name not in self.cluster_queues:
            raise ApiException(status=404, reason="Not Found")
        return self.cluster_queues[name]


@dataclass
class FakeKube:
    """What KueueAdmission uses of `Kube`: `call` (with the real error translation), `custom`."""

    custom: FakeCustom = field(default_factory=FakeCustom)
    server: str = "https://k8s.test:6443"
    config: KubernetesConfig = field(default_factory=lambda: KubernetesConfig(namespace=NAMESPACE))

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with Kube.translated(self, what):  # type: ignore[arg-type]
            return fn(*args, _request_timeout=(1, 1), **kwargs)


def admission(kube: FakeKube) -> KueueAdmission:
    return KueueAdmission(kube, NAMESPACE)  # type: ignore[arg-type]


def owner(*, suspended: bool = True, age_s: float | None = 5.0) -> dict[str, Any]:
    """A JobSet as the owner cache holds it, labelled for LocalQueue nlp."""
    meta: dict[str, Any] = {
        "name": "ty-42-1",
        "namespace": NAMESPACE,
        "uid": OWNER_UID,
        "labels": {KUEUE_QUEUE_LABEL: "nlp"},
    }
    if age_s is not None:
        created = datetime.now(UTC) - timedelta(seconds=age_s)
        meta["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"kind": "JobSet", "metadata": meta, "spec": {"suspend": suspended}}


def cond(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, str]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
    }


def workload_object(
    *conditions: dict[str, str], uid: str = OWNER_UID, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"jobset-ty-42-1-{uid[:5]}",
            "namespace": NAMESPACE,
            "ownerReferences": [{"kind": "JobSet", "name": "ty-42-1", "uid": uid}],
        },
        "status": {"conditions": list(conditions), **status},
    }


def kube_with(*workloads: dict[str, Any], **custom: Any) -> FakeKube:
    return FakeKube(FakeCustom(objects={"workloads": list(workloads)}, **custom))


A_FOREIGN_WORKLOAD = workload_object(
    cond("QuotaReserved", True), cond("Admitted", True), uid="someone-else"
)


# ---- held: the status of a suspended JobSet ----------------------------------------------------


def test_a_jobset_that_is_not_suspended_is_not_held_and_costs_no_api_call() -> None:
    kube = kube_with(workload_object(cond("QuotaReserved", False, message=WAITING_MESSAGE)))
    assert admission(kube).held("k", owner(suspended=False)) is None
    assert kube.custom.calls == []


@pytest.mark.parametrize(
    ("age_s", "hinted"),
    [(5.0, False), (25.0, False), (120.0, True), (None, False)],
    ids=["just created", "under 30 s", "two minutes old", "no creationTimestamp"],
)
def test_a_suspended_jobset_without_a_workload_waits_and_hints_at_kueue_only_when_old(
    age_s: float | None, hinted: bool
) -> None:
    status = admission(kube_with(A_FOREIGN_WORKLOAD)).held("k", owner(age_s=age_s))
    assert status is not None
    assert (status.phase, status.queued) == (AttemptPhase.STARTING, True)
    assert status.reason.startswith("waiting for Kueue to create its Workload (LocalQueue nlp)")
    assert ("is the Kueue controller running" in status.reason) is hinted
    if hinted:
        # the threshold, not the age: a reason that changed every poll would be an event each
        assert "; none after 30s: is the Kueue controller running" in status.reason
        assert "kubectl get pods -n kueue-system" in status.reason


def test_a_workload_waiting_for_quota_is_queued_with_kueues_own_words() -> None:
    kube = kube_with(
        A_FOREIGN_WORKLOAD,
        workload_object(cond("QuotaReserved", False, "Pending", WAITING_MESSAGE)),
    )
    status = admission(kube).held("k", owner())
    assert status is not None
    assert (status.phase, status.queued) == (AttemptPhase.STARTING, True)
    assert status.reason == f"waiting for Kueue admission in LocalQueue nlp: {WAITING_MESSAGE}"
    assert not status.finished
    assert ("list", *KUEUE, NAMESPACE, "workloads") in kube.custom.calls


def test_a_workload_kueue_has_not_looked_at_yet_is_queued() -> None:
    status = admission(kube_with(workload_object())).held("k", owner())
    assert status is not None and status.queued
    assert status.reason.endswith("LocalQueue nlp: Kueue has not considered it yet")


PREEMPTED_MESSAGE = (
    "Preempted to accommodate a workload (UID: 1c7e) due to reclamation within the cohort"
)


@pytest.mark.parametrize(
    ("conditions", "reason"),
    [
        (
            [
                cond("Evicted", True, "Preempted", PREEMPTED_MESSAGE),
                cond("Preempted", True, "InCohortReclamation", PREEMPTED_MESSAGE),
                cond("QuotaReserved", False, "Pending", "Preempted"),
                cond("Admitted", False, "NoReservation", "The workload has no reservation"),
            ],
            f"preempted by Kueue (InCohortReclamation): {PREEMPTED_MESSAGE}",
        ),
        (
            [cond("Evicted", True, "PodsReadyTimeout", "Exceeded the PodsReady timeout")],
            "preempted by Kueue (PodsReadyTimeout): Exceeded the PodsReady timeout",
        ),
    ],
    ids=["preempted for a reclaiming cohort member", "evicted without a Preempted condition"],
)
def test_an_evicted_workload_ends_the_attempt_as_preempted_by_kueue(
    conditions: list[dict[str, str]], reason: str
) -> None:
    kueue = admission(kube_with(workload_object(*conditions)))
    kueue._admitted["k"] = "ClusterQueue nlp"  # admitted before: forgotten on eviction
    status = kueue.held("k", owner())
    assert status is not None
    assert status.phase is AttemptPhase.CANCELLED and status.finished
    assert status.reason == reason
    assert not status.queued
    # the controller requeues (without counting a restart) exactly the reasons that start so
    assert status.reason.startswith(PREEMPTED)
    assert "k" not in kueue._admitted


def test_an_eviction_is_not_final_while_kueue_still_holds_quota_for_the_workload() -> None:
    """Between Evicted=True and Kueue releasing the quota the attempt is not ended yet."""
    kube = kube_with(
        workload_object(
            cond("Evicted", True, "Preempted", PREEMPTED_MESSAGE),
            cond("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue nlp"),
        )
    )
    status = admission(kube).held("k", owner())
    assert status is not None and status.phase is AttemptPhase.STARTING


ADMISSION = {
    "clusterQueue": "nlp",
    "podSetAssignments": [{"name": "node", "flavors": {"nvidia.com/gpu": "gpu-h100"}, "count": 2}],
}


def cluster_queue(borrowed: str | int) -> dict[str, Any]:
    return {
        "metadata": {"name": "nlp"},
        "status": {
            "flavorsUsage": [
                {
                    "name": "gpu-h100",
                    "resources": [
                        {"name": "cpu", "total": "64", "borrowed": "32"},
                        {"name": "nvidia.com/gpu", "total": "16", "borrowed": borrowed},
                    ],
                }
            ]
        },
    }


def test_an_admitted_workload_is_starting_not_queued_and_says_how_it_was_admitted() -> None:
    kube = kube_with(
        workload_object(
            cond("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue nlp"),
            cond("Admitted", True, "Admitted", "The workload is admitted"),
            admission=ADMISSION,
        ),
        cluster_queues={"nlp": cluster_queue("8")},
    )
    status = admission(kube).held("k", owner())
    assert status is not None
    assert (status.phase, status.queued) == (AttemptPhase.STARTING, False)
    assert status.reason == (
        "admitted by Kueue: ClusterQueue nlp, flavor gpu-h100, the ClusterQueue borrows 8 "
        "nvidia.com/gpu from its cohort; starting its pods"
    )
    assert ("get", *KUEUE, "clusterqueues", "nlp") in kube.custom.calls


def test_polls_of_held_attempts_read_a_cluster_queues_borrowing_once_a_while() -> None:
    """Every poll of an admitted, still suspended attempt describes its admission; the
    ClusterQueue's borrowing behind that message is read once per few seconds, not once per
    attempt and poll. The message of a running attempt (once per attempt) reads it anew."""
    wl = workload_object(cond("QuotaReserved", True), cond("Admitted", True), admission=ADMISSION)
    kube = kube_with(wl, cluster_queues={"nlp": cluster_queue("8")})
    kueue = admission(kube)
    get_cq = ("get", *KUEUE, "clusterqueues", "nlp")
    for _ in range(20):
        held = kueue.held("k", owner())
        assert held is not None and "borrows 8 nvidia.com/gpu" in held.reason
    assert kube.custom.calls.count(get_cq) == 1
    kueue.admitted("k", owner(suspended=False))
    assert kube.custom.calls.count(get_cq) == 2


def test_the_admission_time_is_kueues_quota_reservation_for_the_goodput_account() -> None:
    reserved = {**cond("QuotaReserved", True), "lastTransitionTime": "2026-12-03T03:20:10Z"}
    wl = workload_object(reserved, cond("Admitted", True), admission=ADMISSION)
    kueue = admission(kube_with(wl, cluster_queues={"nlp": cluster_queue(0)}))
    when = datetime(2026, 12, 3, 3, 20, 10, tzinfo=UTC).timestamp()
    held = kueue.held("k", owner())
    assert held is not None and held.admitted_at == when  # admitted, pods starting
    kueue.admitted("k", owner(suspended=False))  # running
    assert kueue.admitted_at("k") == when
    kueue.forget("k")
    assert kueue.admitted_at("k") is None
    waiting = workload_object(cond("QuotaReserved", False, "Pending", WAITING_MESSAGE))
    queued = admission(kube_with(waiting)).held("k", owner())
    assert queued is not None and queued.queued and queued.admitted_at is None


def test_borrowing_is_left_out_when_there_is_none_or_the_clusterqueue_cannot_be_read() -> None:
    wl = workload_object(cond("QuotaReserved", True), cond("Admitted", True), admission=ADMISSION)
    kueue = admission(kube_with(wl, cluster_queues={"nlp": cluster_queue(0)}))
    assert kueue._borrowed_gpus("nlp") == 0
    assert kueue.admitted("k", owner()) == "ClusterQueue nlp, flavor gpu-h100"
    forbidden = kube_with(wl, errors={"clusterqueues": ApiException(status=403, reason="no")})
    assert admission(forbidden)._borrowed_gpus("nlp") == 0
    assert admission(kube_with(wl))._borrowed_gpus("missing") == 0  # 404


def test_how_a_running_attempt_was_admitted_is_read_once() -> None:
    wl = workload_object(cond("QuotaReserved", True), cond("Admitted", True), admission=ADMISSION)
    kube = kube_with(wl, cluster_queues={"nlp": cluster_queue("4")})
    kueue = admission(kube)
    first = kueue.admitted("k", owner(suspended=False))
    assert first.endswith("the ClusterQueue borrows 4 nvidia.com/gpu from its cohort")
    calls = len(kube.custom.calls)
    assert kueue.admitted("k", owner(suspended=False)) == first
    assert len(kube.custom.calls) == calls
    kueue.forget("k")
    kueue.admitted("k", owner(suspended=False))
    assert len(kube.custom.calls) > calls


# ---- start-up and submission checks ----------------------------------------------------------


def test_a_cluster_without_kueue_is_refused_at_start() -> None:
    kube = FakeKube(FakeCustom(errors={"localqueues": ApiException(status=404, reason="NF")}))
    with pytest.raises(ExecutorError, match="Kueue is not installed on this cluster") as err:
        admission(kube).check_installed()
    assert "kueue.x-k8s.io/v1beta2 is not served" in str(err.value)
    assert "install Kueue" in str(err.value)


def test_a_refused_list_of_localqueues_is_not_mistaken_for_a_missing_kueue() -> None:
    kube = FakeKube(FakeCustom(errors={"localqueues": ApiException(status=403, reason="no")}))
    with pytest.raises(KubeApiError) as err:
        admission(kube).check_installed()
    assert err.value.status == 403
    assert "not installed" not in str(err.value) and "rbac.yaml" in str(err.value)


def test_a_namespace_without_localqueues_is_refused_naming_it() -> None:
    with pytest.raises(ExecutorError, match=f"namespace {NAMESPACE} has no Kueue LocalQueue"):
        admission(FakeKube()).check_installed()
    with_queue = FakeKube(FakeCustom(objects={"localqueues": [{"metadata": {"name": "nlp"}}]}))
    admission(with_queue).check_installed()
    assert with_queue.custom.calls == [("list", *KUEUE, NAMESPACE, "localqueues")]


def test_the_executor_checks_for_kueue_only_in_kueue_mode() -> None:
    missing = ApiException(status=404, reason="NF")
    kube = FakeKube(FakeCustom(errors={"localqueues": missing}))
    plain = KubernetesExecutor(kube, kind="JobSet")  # type: ignore[arg-type]
    assert plain.kueue is None and not plain.external_admission
    assert kube.custom.calls == []
    kube.config = KubernetesConfig(namespace=NAMESPACE, admission="kueue")
    with pytest.raises(ExecutorError, match="Kueue is not installed"):
        KubernetesExecutor(kube, kind="JobSet")  # type: ignore[arg-type]
    kube.custom = FakeCustom(objects={"localqueues": [{"metadata": {"name": "nlp"}}]})
    assert KubernetesExecutor(kube, kind="JobSet").external_admission  # type: ignore[arg-type]


def test_a_team_without_a_localqueue_is_told_which_queues_exist() -> None:
    queues = [{"metadata": {"name": n}} for n in ("vision", "nlp")]
    kueue = admission(FakeKube(FakeCustom(objects={"localqueues": queues})))
    assert kueue.check_queue("nlp") is None
    missing = kueue.check_queue("speech")
    assert missing is not None
    problem, fix = missing
    assert problem == (
        f"no Kueue LocalQueue 'speech' in namespace {NAMESPACE} (jobs wait in the LocalQueue "
        "named after their team; there are: nlp, vision)"
    )
    assert "kueue/kueue.yaml" in fix
    empty = admission(FakeKube()).check_queue("nlp")
    assert empty is not None and empty[0].endswith("there are: none)")


# ---- the rendered JobSet / Job ------------------------------------------------------------------


def attempt_workload(**overrides: Any) -> AttemptWorkload:
    fields: dict[str, Any] = {
        "job_id": "42",
        "attempt": 1,
        "attempt_key": "42-1-0123456789ab",
        "image": "ghcr.io/example/trainer:1.0",
        "command": ["python", "train.py"],
        "env": {},
        "token_secret": "ty-42-1-token",
        "namespace": NAMESPACE,
        "nodes": 2,
        "gpus_per_node": 8,
        "team": "nlp",
    }
    fields.update(overrides)
    return AttemptWorkload(**fields)


RENDERERS = pytest.mark.parametrize(
    "render", [render_jobset, render_indexed_job], ids=["JobSet", "Indexed Job"]
)


@RENDERERS
def test_a_kueue_attempt_is_created_suspended_in_its_teams_localqueue(render: Any) -> None:
    obj = render(attempt_workload(kueue_queue="nlp"))
    assert obj["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "nlp"
    assert KUEUE_PRIORITY_LABEL not in obj["metadata"]["labels"]
    assert obj["spec"]["suspend"] is True
    prioritized = render(attempt_workload(kueue_queue="nlp", kueue_priority_class="high"))
    assert prioritized["metadata"]["labels"][KUEUE_PRIORITY_LABEL] == "high"


@RENDERERS
def test_an_attempt_tensoryard_admitted_carries_no_queue_label_and_is_not_suspended(
    render: Any,
) -> None:
    obj = render(attempt_workload(kueue_priority_class="high"))
    assert KUEUE_QUEUE_LABEL not in obj["metadata"]["labels"]
    assert KUEUE_PRIORITY_LABEL not in obj["metadata"]["labels"]  # only with a queue
    assert "suspend" not in obj["spec"]


@pytest.mark.parametrize("name", ["kueue_queue", "kueue_priority_class"])
def test_a_kueue_label_value_kubernetes_would_refuse_is_refused_naming_the_field(
    name: str,
) -> None:
    with pytest.raises(ExecutorError, match=f"AttemptWorkload.{name}: 'not a label!'"):
        attempt_workload(**{name: "not a label!"})
    with pytest.raises(ExecutorError, match=name):
        attempt_workload(**{name: "q" * 64})


def launch_request(team: str) -> LaunchRequest:
    spec = parse_job_spec(
        {"name": "t", "team": team, "image": "img:1", "command": ["python", "train.py"]}
    )
    return LaunchRequest(
        job_id="42",
        attempt=1,
        spec=spec,
        run_dir=Path("/runs/job-42"),
        env={"TYARD_JOB_ID": "42", "TYARD_JOB_TOKEN": "secret"},
        placement={},
        attempt_key="42-1-0123456789ab",
    )


def test_in_kueue_mode_the_localqueue_is_the_jobs_team() -> None:
    kueue = workload_for(launch_request("vision"), KubernetesConfig(admission="kueue"))
    assert kueue.kueue_queue == "vision"
    assert render_jobset(kueue)["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "vision"
    assert workload_for(launch_request("vision"), KubernetesConfig()).kueue_queue is None


def _wpc(name: str, value: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "value": value}


def test_a_jobs_priority_maps_to_the_highest_class_at_or_below_it_else_the_lowest() -> None:
    kube = kube_with()
    kube.custom.objects["workloadpriorityclasses"] = [
        _wpc("high", 1000),
        _wpc("low", 100),
        _wpc("normal", 500),
    ]
    a = admission(kube)
    assert [a.priority_class_for(p) for p in (-5, 0, 100, 499, 500, 999, 1000)] == [
        "low",
        "low",
        "low",
        "low",
        "normal",
        "normal",
        "high",
    ]
    assert sum(1 for c in kube.custom.calls if c[-1] == "workloadpriorityclasses") == 1  # cached


def test_without_priority_classes_or_the_right_to_list_them_a_job_gets_none() -> None:
    assert admission(kube_with()).priority_class_for(500) is None
    refused = kube_with(errors={"workloadpriorityclasses": ApiException(status=403)})
    assert admission(refused).priority_class_for(500) is None


def test_in_kueue_mode_a_gangs_topology_becomes_a_topology_aware_scheduling_request() -> None:
    def gang(topology: str, nodes: int = 2) -> LaunchRequest:
        req = launch_request("vision")
        spec = req.spec.model_copy(
            update={
                "resources": req.spec.resources.model_copy(update={"nodes": nodes}),
                "scheduling": req.spec.scheduling.model_copy(update={"topology": topology}),
            }
        )
        return dataclasses.replace(req, spec=spec)

    config = KubernetesConfig(admission="kueue", switch_label="example.com/leaf")
    w = workload_for(gang("required"), config, kueue_priority_class="high")
    jobset = render_jobset(w)
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["kueue.x-k8s.io/podset-required-topology"] == "example.com/leaf"
    preferred = render_jobset(workload_for(gang("preferred"), config))
    ann = preferred["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
    assert ann["annotations"]["kueue.x-k8s.io/podset-preferred-topology"] == "example.com/leaf"
    for req, cfg in (
        (gang("none"), config),  # no request asked
        (gang("required", nodes=1), config),  # one pod: nothing to keep together
        (gang("required"), KubernetesConfig()),  # tensoryard places it itself
    ):
        w = workload_for(req, cfg, kueue_priority_class="high")
        assert w.kueue_topology is None
        assert cfg.admission == "kueue" or w.kueue_priority_class is None


# ---- the command line -------------------------------------------------------------------------


def test_an_unknown_admission_mode_is_refused_naming_the_option() -> None:
    with pytest.raises(SpecError) as err:
        kubernetes_config(admission="bogus")
    (issue,) = err.value.issues
    assert issue.path == "--admission"
    assert (
        issue.render()
        == "--admission: 'bogus' is not an admission mode (fix: use tensoryard or kueue)"
    )
    assert kubernetes_config(admission="kueue").admission == "kueue"
    assert kubernetes_config().admission == "tensoryard"


def test_kueue_admission_without_the_kubernetes_executor_is_refused() -> None:
    result = CliRunner().invoke(app, ["server", "--admission", "kueue"])
    assert result.exit_code == 2
    assert "only with --executor kubernetes" in result.output


def test_an_eviction_records_its_intent_first_and_a_crash_before_the_delete_is_finished_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kueue evicted the attempt: the executor records the outcome as an intent, deletes the
    JobSet (so Kueue cannot run it again), then records it as final. When the delete fails (a
    control plane killed there), the next poll finds the intent and finishes without
    looking at Kueue again, instead of calling the attempt LOST or cancelled by the user."""
    from tensoryard.executors.kubernetes.executor import KubernetesHandle

    evicted = workload_object(
        cond("Evicted", True, "InCohortReclamation", "Preempted to accommodate a workload"),
        cond("QuotaReserved", False),
    )
    kube = FakeKube(
        FakeCustom(objects={"workloads": [evicted], "localqueues": [{"metadata": {"name": "nlp"}}]})
    )
    kube.config = KubernetesConfig(namespace=NAMESPACE, admission="kueue")
    executor = KubernetesExecutor(kube, kind="JobSet")  # type: ignore[arg-type]
    handle = KubernetesHandle(
        job_id="7", attempt=1, attempt_key="j7-a1-k", namespace=NAMESPACE, name="ty-7-1",
        kind="JobSet", nodes=1, attempt_dir=str(tmp_path / "attempt-1"),
    ).to_dict()  # fmt: skip
    monkeypatch.setattr(executor, "_observe", lambda h: (owner(), []))
    deleted: list[float] = []

    def killed_here(handle: dict[str, Any], *, grace_s: float) -> None:
        raise ExecutorError("the control plane died here")

    monkeypatch.setattr(executor, "cancel", killed_here)
    with pytest.raises(ExecutorError):
        executor.poll(handle)
    assert (tmp_path / "attempt-1" / "evicted.json").exists()
    assert not (tmp_path / "attempt-1" / "exit.json").exists()

    monkeypatch.setattr(executor, "_observe", lambda h: pytest.fail("Kueue is not asked again"))
    monkeypatch.setattr(executor, "cancel", lambda handle, *, grace_s: deleted.append(grace_s))
    status = executor.poll(handle)
    assert status.phase is AttemptPhase.CANCELLED
    assert status.reason.startswith("preempted by Kueue (InCohortReclamation)")
    assert deleted == [executor.grace_s]  # with the pods' grace period: they checkpoint
    assert executor.poll(handle) == status  # final now, from the attempt dir
    assert deleted == [executor.grace_s]


@pytest.mark.parametrize(
    "status",
    [
        {"terminalState": "Completed"},
        {"conditions": [{"type": "Complete", "status": "True"}]},
        {"conditions": [{"type": "Failed", "status": "True"}]},
    ],
    ids=["jobset completed", "job complete", "job failed"],
)
@pytest.mark.parametrize("suspended", [True, False], ids=["suspended", "resumed"])
def test_an_attempt_that_ended_while_kueue_evicted_it_is_preempted_not_succeeded(
    status: dict[str, Any], suspended: bool
) -> None:
    """Seen on the benchmark: Kueue evicted a workload whose pods ended just as the suspension
    took effect. A real runtime exits 0 after the eviction's SIGTERM (it checkpoints and stops
    early), so an ended attempt with the eviction on its Workload is requeued (it resumes from
    its last checkpoint; one that had in fact finished ends at once), never called succeeded;
    without an eviction, its own status decides."""
    evicted = workload_object(
        cond("QuotaReserved", True),
        cond("Evicted", True, "Preempted", "Preempted to accommodate a workload"),
        cond("Finished", True, "Succeeded", "jobset completed successfully"),
    )
    done = {**owner(suspended=suspended), "status": status}
    held = admission(kube_with(evicted)).held("j42-a1-k", done)
    assert held is not None and held.phase is AttemptPhase.CANCELLED
    assert held.reason.startswith(f"{PREEMPTED} by Kueue (Preempted): ")
    assert held.reason.endswith(
        "it ended while being evicted, so it resumes from its last checkpoint"
    )
    finished = workload_object(cond("QuotaReserved", True), cond("Finished", True))
    assert admission(kube_with(finished)).held("j42-a1-k", done) is None


def test_an_eviction_kueue_has_since_readmitted_is_history() -> None:
    """Kueue evicted the workload and re-admitted it (QuotaReserved again, later) before a poll
    saw the eviction: the attempt runs on under the same JobSet, and its normal end is a
    success, not a preemption."""

    def at(c: dict[str, str], when: str) -> dict[str, str]:
        return {**c, "lastTransitionTime": when}

    readmitted = workload_object(
        at(cond("Evicted", True, "Preempted", "Preempted to accommodate"), "2026-12-03T03:19:53Z"),
        at(cond("QuotaReserved", True), "2026-12-03T03:20:10Z"),
        cond("Finished", True),
    )
    done = {**owner(suspended=False), "status": {"terminalState": "Completed"}}
    assert admission(kube_with(readmitted)).held("k", done) is None
    still = workload_object(
        at(cond("Evicted", True, "Preempted", "Preempted to accommodate"), "2026-12-03T03:19:53Z"),
        at(cond("QuotaReserved", True), "2026-12-03T03:19:40Z"),
    )
    held = admission(kube_with(still)).held("k", owner())
    assert held is not None and held.reason.startswith("being preempted by Kueue (Preempted)")
