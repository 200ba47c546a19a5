"""The gateway in front of a GPU engine's pods: requests are checked against the engine's own
parameters (vLLM's differ from llama.cpp's), `n` is forwarded, and in streams the engine's own
usage chunk is asked for, counted, and passed on only when the caller asked for it. The "pod"
is the mock OpenAI engine listening on its own loopback address at the pods' port (8000), found
by the replica supervisor through a stand-in for the cluster; the control plane is real."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn
from tests.integration.serving.conftest import Serving

from tensoryard.serving.gpu_engines import ENGINE_PORT
from tensoryard.serving.kubernetes import ServingPod
from tensoryard.serving.mock_engine import create_mock_engine
from tensoryard.store._serving import DeploymentRecord

POD_IP = "127.0.0.57"


class Cluster:
    def ensure(self, dep: DeploymentRecord, replicas: int) -> bool:
        return False

    def pods(self, dep: DeploymentRecord) -> list[ServingPod]:
        return [ServingPod("pod-0", POD_IP, True, "gpu-1", "Running", 0, None, None, "")]

    def delete(self, name: str) -> None:
        pass

    def collect(self, keep: Any) -> list[str]:
        return []


@pytest.fixture
def engine_pod() -> Iterator[None]:
    server = uvicorn.Server(
        uvicorn.Config(
            create_mock_engine(tokens=5), host=POD_IP, port=ENGINE_PORT, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, f"the mock engine did not start on {POD_IP}"
        time.sleep(0.02)
    yield
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def gpu_serving(serving_plane: Callable[..., Serving], engine_pod: None) -> Serving:
    s = serving_plane()
    assert s.plane.serving is not None
    s.plane.serving.manager.kube = Cluster()  # type: ignore[assignment]
    s.plane.store.create_deployment(
        "llama",
        team="default",
        model_ref="org/llama",
        model_path="org/llama",
        engine="vllm",
        replicas=1,
        options={"router": "prefix"},
        idle_timeout_s=None,
        created_by="admin",
    )
    s.plane.serving.manager.kick()
    s.wait_ready("llama", 1, timeout=30)
    return s


def _stream(s: Serving, body: dict[str, Any]) -> list[dict[str, Any]]:
    with s.http() as c, c.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line[5:].strip() for line in resp.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


CHAT = {"model": "llama", "messages": [{"role": "user", "content": "Hello there, engine"}]}


def test_a_stream_carries_the_engines_own_usage_only_when_asked_and_is_counted(
    gpu_serving: Serving,
) -> None:
    asked = _stream(
        gpu_serving, {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert sum(1 for c in asked if c["choices"]) == 5
    tail = asked[-1]
    assert tail["choices"] == [] and tail["usage"]["completion_tokens"] == 5
    prompt_tokens = tail["usage"]["prompt_tokens"]  # the engine's count, not the gateway's
    not_asked = _stream(gpu_serving, {**CHAT, "stream": True})
    assert all(c["choices"] for c in not_asked) and not any("usage" in c for c in not_asked)
    with gpu_serving.http() as c:
        metrics = c.get("/metrics").text
    prompt_line = next(
        line
        for line in metrics.splitlines()
        if line.startswith("tyard_serving_tokens_total{") and 'kind="prompt"' in line
    )
    assert float(prompt_line.rsplit(" ", 1)[1]) == 2 * prompt_tokens  # both streams counted


def test_the_engines_parameters_are_checked_and_n_is_forwarded(gpu_serving: Serving) -> None:
    with gpu_serving.http() as c:
        ok = c.post("/v1/chat/completions", json={**CHAT, "n": 2, "min_tokens": 1, "top_k": 5})
        assert ok.status_code == 200, ok.text
        renamed = c.post("/v1/chat/completions", json={**CHAT, "repeat_penalty": 1.1})
        assert renamed.status_code == 400
        error = renamed.json()["error"]
        assert error["param"] == "repeat_penalty" and error["code"] == "unsupported_parameter"
        assert "vllm calls it 'repetition_penalty'" in error["message"]
        best_of = c.post("/v1/chat/completions", json={**CHAT, "best_of": 3})
        assert best_of.status_code == 400 and best_of.json()["error"]["param"] == "best_of"


def test_a_gpu_engine_on_a_control_plane_without_kubernetes_is_refused_naming_engine(
    serving_plane: Callable[..., Serving],
) -> None:
    s = serving_plane()
    with s.http() as c:
        resp = c.post(
            "/api/v1/deployments", json={"model": "org/llama", "engine": "vllm", "name": "llama"}
        )
        assert resp.status_code == 422, resp.text
        (issue,) = resp.json()["detail"]
        assert issue["path"] == "engine" and "--executor kubernetes" in issue["fix"]
        assert c.get("/api/v1/deployments").json() == []  # nothing stored
