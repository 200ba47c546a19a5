"""The executor's list-then-watch cache against the real API server: it follows creations,
changes and deletions through short watch streams that it resumes from the last version.

Not covered here: the relist on 410 Gone. This API server (1.36, watch cache on) kept serving
watches from resourceVersion 1 and 2 even after an etcd compaction, so no 410 could be
provoked without a fake."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tensoryard.executors.kubernetes.client import Kube
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.kubernetes.watch import WatchCache
from tests.e2e_k8s.conftest import wait_until

pytestmark = pytest.mark.slow

LABEL = "tensoryard.io/attempt-key"


def secret(name: str, key: str = "k1") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {LABEL: key}}, "stringData": {"token": "x"}}


@pytest.fixture
def cache(api_client: Any, namespace: str) -> Iterator[WatchCache]:
    kube = Kube(api=api_client, config=KubernetesConfig(namespace=namespace), server="test")
    watched = WatchCache(
        kube,
        "secrets",
        kube.core.list_namespaced_secret,
        namespace,
        label_selector=LABEL,
        watch_timeout_s=5,  # short streams: the loop re-watches from the last version
    ).start()
    yield watched
    watched.stop()


def test_the_cache_follows_creations_changes_and_deletions(
    cache: WatchCache, core: Any, namespace: str
) -> None:
    wait_until(cache.ready, timeout=10, what="the cache listed and watching")
    assert cache.items() == [] and cache.relists == 1
    core.create_namespaced_secret(namespace, secret("a"))
    core.create_namespaced_secret(namespace, {"metadata": {"name": "unlabelled"}})
    wait_until(lambda: cache.get("a"), timeout=10, what="secret a in the cache")
    core.patch_namespaced_secret("a", namespace, {"metadata": {"labels": {LABEL: "k2"}}})
    wait_until(lambda: cache.select(LABEL, "k2"), timeout=10, what="the label change")
    assert cache.get("unlabelled") is None  # the selector holds on the server side
    core.delete_namespaced_secret("a", namespace)
    wait_until(lambda: cache.get("a") is None, timeout=10, what="secret a gone from the cache")
    assert cache.relists == 1  # no relist was needed: the watch carried everything


def test_the_cache_resumes_across_stream_ends_without_relisting(
    cache: WatchCache, core: Any, namespace: str
) -> None:
    import time

    time.sleep(6)  # longer than one watch stream (watch_timeout_s=5)
    core.create_namespaced_secret(namespace, secret("late"))
    wait_until(lambda: cache.get("late"), timeout=10, what="secret late in the cache")
    assert cache.relists == 1


def test_with_watches_a_poll_of_a_running_attempt_makes_no_api_call(
    api_client: Any, namespace: str, gpu_nodes: Any, tmp_path: Any
) -> None:
    from tensoryard.executors.base import AttemptPhase, LaunchRequest
    from tensoryard.executors.kubernetes.executor import KubernetesExecutor
    from tensoryard.spec.job import parse_job_spec
    from tests.e2e_k8s.conftest import jobset_served

    if not jobset_served(api_client):
        pytest.skip("the JobSet controller is not installed in this environment")
    nodes = gpu_nodes(2)
    annotations = {
        "pod-complete.stage.kwok.x-k8s.io/delay": "600s",
        "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "600s",
    }
    config = KubernetesConfig(namespace=namespace, pod_annotations=annotations)
    kube = Kube(api=api_client, config=config, server="test")
    executor = KubernetesExecutor(kube, kind="JobSet", grace_s=0)
    executor.start_watches()
    try:
        spec = parse_job_spec(
            {
                "name": "w",
                "image": "registry.invalid/tensoryard/trainer:test",
                "command": ["python", "train.py"],
                "resources": {"nodes": 2, "gpus_per_node": 8},
            }
        )
        request = LaunchRequest(
            job_id="5",
            attempt=1,
            spec=spec,
            run_dir=tmp_path,
            env={"TYARD_JOB_TOKEN": "t"},
            placement={n: [] for n in nodes},
            attempt_key="j5-a1-watch",
        )
        handle = executor.launch(request)
        assert executor.launch(request) == handle  # idempotent by attempt key
        wait_until(
            lambda: executor.poll(handle).phase is AttemptPhase.RUNNING,
            timeout=60,
            what="the attempt running",
        )
        before = kube.calls
        for _ in range(20):
            assert executor.poll(handle).phase is AttemptPhase.RUNNING
        assert kube.calls == before  # answered from the watch caches
        executor.cancel(handle, grace_s=0)
        wait_until(
            lambda: executor.poll(handle).phase is AttemptPhase.CANCELLED,
            timeout=60,
            what="the attempt cancelled",
        )
    finally:
        executor.close()
