"""The last log lines of an ended attempt's pods are kept in its folder (rank-K.log), a gang's
pods read concurrently (each read is an API round trip on the control loop's thread)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tensoryard.errors import ExecutorError
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.kubernetes.executor import KubernetesExecutor, KubernetesHandle
from tensoryard.executors.kubernetes.manifests import COMPLETION_INDEX_ANNOTATION
from tensoryard.executors.kubernetes.status import Obj


class _Core:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.read: list[str] = []

    def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> str:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.1)  # the API server's round trip
        with self.lock:
            self.now -= 1
            self.read.append(name)
        return f"last lines of {name} (tail {kw['tail_lines']})\n"


class _Kube:
    def __init__(self) -> None:
        self.config = KubernetesConfig(namespace="ml")
        self.core = _Core()

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if args[0] == "pod-3":
            raise ExecutorError(f"cannot {what}: HTTP 404 not found")
        return fn(*args, **kwargs)


def _pod(rank: int) -> Obj:
    return {
        "metadata": {
            "name": f"pod-{rank}",
            "annotations": {COMPLETION_INDEX_ANNOTATION: str(rank)},
        }
    }


def test_a_gangs_pod_logs_are_read_concurrently_and_kept_once(tmp_path: Path) -> None:
    kube = _Kube()
    executor = KubernetesExecutor(kube, kind="JobSet")  # type: ignore[arg-type]
    handle = KubernetesHandle("7", 1, "ty-7-1", "ml", "ty-7-1", "JobSet", 8, str(tmp_path))
    (tmp_path / "rank-5.log").write_text("kept before\n")
    pods: list[Obj] = [*map(_pod, range(8)), {"metadata": {"name": "no-index"}}]
    executor._keep_logs(handle, pods)
    assert kube.core.most > 1  # not one after the other
    assert sorted(kube.core.read) == [f"pod-{r}" for r in (0, 1, 2, 4, 6, 7)]
    assert (tmp_path / "rank-0.log").read_text() == "last lines of pod-0 (tail 500)\n"
    assert "the log of pod pod-3 could not be read" in (tmp_path / "rank-3.log").read_text()
    assert (tmp_path / "rank-5.log").read_text() == "kept before\n"  # never overwritten
    executor._keep_logs(handle, pods)  # again: every rank file exists, nothing is read
    assert len(kube.core.read) == 6
