"""WatchCache's secondary index: a poll per attempt finds its objects without scanning them all
(the Kueue benchmark's reconcile phase took 10-30 s with 500 attempts before it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tensoryard.executors.kubernetes.watch import WatchCache


def pod(name: str, key: str | None, rv: int) -> dict[str, Any]:
    labels = {"tensoryard.io/attempt-key": key} if key else {}
    return {"metadata": {"name": name, "labels": labels, "resourceVersion": str(rv)}}


def by_key(obj: dict[str, Any]) -> list[str]:
    key = obj["metadata"]["labels"].get("tensoryard.io/attempt-key")
    return [key] if key else []


def names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_the_index_follows_relists_adds_relabels_and_deletes() -> None:
    listing = {"items": [pod("a-0", "a", 1), pod("a-1", "a", 2), pod("b-0", "b", 3)],
               "metadata": {"resourceVersion": "3"}}  # fmt: skip
    kube = SimpleNamespace(timeout=(1, 1), plain=lambda x: x)
    cache = WatchCache(kube, "pods", lambda **kw: listing, index=by_key)  # type: ignore[arg-type]
    cache._relist()
    assert names(cache.indexed("a")) == ["a-0", "a-1"] and names(cache.indexed("b")) == ["b-0"]
    cache._apply("ADDED", pod("a-2", "a", 4))
    cache._apply("MODIFIED", pod("b-0", "c", 5))  # its key changed: moved, not duplicated
    cache._apply("DELETED", pod("a-0", "a", 6))
    cache._apply("MODIFIED", pod("x", None, 7))  # no key: not indexed
    assert names(cache.indexed("a")) == ["a-1", "a-2"]
    assert cache.indexed("b") == [] and names(cache.indexed("c")) == ["b-0"]
    assert names(cache.items()) == ["a-1", "a-2", "b-0", "x"]
    assert cache.select("tensoryard.io/attempt-key", "a") == cache.indexed("a")
    listing["items"] = [pod("d-0", "d", 8)]
    cache._relist()  # a relist (410 Gone) replaces the index with the objects
    assert cache.indexed("a") == [] and names(cache.indexed("d")) == ["d-0"]


def test_lists_and_events_are_taken_as_json_without_client_models() -> None:
    import json

    from tensoryard.executors.kubernetes.watch import _json_of, raw_watch

    listing = {"items": [pod("a-0", "a", 1)], "metadata": {"resourceVersion": "1"}}
    raw_response = SimpleNamespace(data=json.dumps(listing).encode())
    assert _json_of(raw_response, kube=None) == listing  # _preload_content=False: the body
    line = json.dumps({"type": "MODIFIED", "object": pod("a-0", "a", 2)})
    event = raw_watch().unmarshal_event(line, None)
    assert event["raw_object"] == pod("a-0", "a", 2)
    assert event["object"] is event["raw_object"]  # no V1Pod built from it
    from kubernetes import client

    assert raw_watch().get_return_type(client.CoreV1Api().list_namespaced_pod) is None


def test_a_change_names_its_job_to_the_control_loop() -> None:
    """The executor listens to its pod and JobSet caches: each event names the job (label
    tensoryard.io/job-id) so the loop reconciles just it; a relist names no job (all)."""
    from tensoryard.executors.kubernetes.executor import KubernetesExecutor

    listing = {"items": [], "metadata": {"resourceVersion": "1"}}
    kube = SimpleNamespace(timeout=(1, 1), plain=lambda x: x)
    pods = WatchCache(kube, "pods", lambda **kw: listing, index=by_key)  # type: ignore[arg-type]
    owners = WatchCache(kube, "jobsets", lambda **kw: listing)  # type: ignore[arg-type]
    executor = KubernetesExecutor.__new__(KubernetesExecutor)  # no cluster: only the seam
    executor._changed, executor._pod_cache, executor._owner_cache = None, pods, owners
    told: list[int | None] = []
    assert executor.report_changes(told.append) is True
    assert executor.report_changes(told.append) is True  # listening once per cache
    assert len(pods.listeners) == len(owners.listeners) == 1
    labelled = pod("j7-0", "k7", 2)
    labelled["metadata"]["labels"]["tensoryard.io/job-id"] = "7"
    pods._apply("MODIFIED", labelled)
    owners._apply("ADDED", {"metadata": {"name": "js", "resourceVersion": "3",
                                         "labels": {"tensoryard.io/job-id": "9"}}})  # fmt: skip
    pods._apply("MODIFIED", pod("stray", None, 4))
    pods._relist()
    assert told == [7, 9, None, None]
    assert executor.reports_starts
