"""Why an attempt's pods do not appear (a Job's FailedCreate events: an exceeded quota, an
admission webhook's refusal) is read from one listing of the namespace for every attempt that
lacks pods, not one listing per attempt (each is an API round trip on the control loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.kubernetes.executor import (
    FAILED_CREATE_EVERY_S,
    KubernetesExecutor,
    KubernetesHandle,
)
from tensoryard.executors.kubernetes.status import Obj


def _event(kind: str, name: str, at: str, message: str) -> Obj:
    return {
        "involvedObject": {"kind": kind, "name": name},
        "lastTimestamp": at,
        "message": message,
        "metadata": {"creationTimestamp": at},
    }


class _List:
    def __init__(self, items: list[Obj]) -> None:
        self.items = items


class _Core:
    def __init__(self) -> None:
        self.lists: list[tuple[str, str]] = []
        self.events: list[Obj] = [
            _event("Job", "ty-1-1-workers-0", "2026-01-01T10:00:00Z", "old:  refusal"),
            _event("Job", "ty-1-1-workers-0", "2026-01-01T10:05:00Z", 'exceeded quota:  "gpus"'),
            _event("JobSet", "ty-2-1", "2026-01-01T10:01:00Z", "webhook denied"),
            _event("Pod", "ty-3-1-workers-0-0", "2026-01-01T10:02:00Z", "not a Job"),
            _event("Job", "ty-10-1", "2026-01-01T10:03:00Z", "another job's refusal"),
        ]

    def list_namespaced_event(self, namespace: str, **kw: Any) -> _List:
        self.lists.append((namespace, kw["field_selector"]))
        return _List(list(self.events))


class _Kube:
    def __init__(self) -> None:
        self.config = KubernetesConfig(namespace="ml")
        self.core = _Core()

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    @staticmethod
    def plain(obj: Obj) -> Obj:
        return obj


def _handle(job: int, tmp_path: Path, nodes: int = 2) -> KubernetesHandle:
    name = f"ty-{job}-1"
    return KubernetesHandle(str(job), 1, name, "ml", name, "JobSet", nodes, str(tmp_path))


def test_every_attempt_without_its_pods_reads_one_listing_of_the_namespace(
    tmp_path: Path,
) -> None:
    kube = _Kube()
    executor = KubernetesExecutor(kube, kind="JobSet")  # type: ignore[arg-type]
    one, two, three = (_handle(j, tmp_path) for j in (1, 2, 3))
    assert executor._failed_create(one, []) == (
        'Job ty-1-1-workers-0 cannot create its pods (FailedCreate: exceeded quota: "gpus")'
    )
    assert executor._failed_create(two, [{}]) == (
        "JobSet ty-2-1 cannot create its pods (FailedCreate: webhook denied)"
    )
    assert executor._failed_create(three, []) is None  # a Pod's event is not a Job's refusal
    # ty-1-1 is not a prefix match of ty-10-1's objects, nor the other way round
    assert "ty-10-1" not in (executor._failed_create(one, []) or "")
    assert executor._failed_create(one, [{}, {}]) is None  # all its pods exist: nothing to read
    assert kube.core.lists == [("ml", "reason=FailedCreate")]  # one listing for all of them

    # the quota is raised: the next listing (after the interval) clears the reason
    kube.core.events = [e for e in kube.core.events if "ty-1-1" not in e["involvedObject"]["name"]]
    listed, events = executor._failed_creates["ml"]
    executor._failed_creates["ml"] = (listed - FAILED_CREATE_EVERY_S, events)
    assert executor._failed_create(one, []) is None
    assert executor._failed_create(two, []) is not None
    assert len(kube.core.lists) == 2
