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
