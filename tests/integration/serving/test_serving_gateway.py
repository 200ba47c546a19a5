"""The gateway and the replica supervisor end to end, over real HTTP and real processes.

The replicas here run the mock engine (``tensoryard.serving.mock_engine``), a real process on a
real port: these tests are about routing, supervision and errors, not the model. The llama.cpp
engine with SmolLM2 is covered by test_serving_llama.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def _deploy(s: Any, name: str = "echo", **fields: Any) -> dict[str, Any]:
    body = {"model": "mock", "name": name, "engine": "mock", "replicas": 1, **fields}
    with s.http() as c:
        resp = c.post("/api/v1/deployments", json=body)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())


def _events(resp: httpx.Response) -> list[Any]:
    out: list[Any] = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chat_streaming_usage_models_and_metrics(serving_plane: Callable[..., Any]) -> None:
    s = serving_plane()
    _deploy(s, replicas=2, options={"tokens": 5})
    dep = s.wait_ready("echo", 2)
    assert {r["state"] for r in dep["replica_states"]} == {"ready"}
    with s.http() as c:
        models = c.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["echo"]
        answer = c.post("/v1/chat/completions", json=CHAT)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"].strip()
        body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        with c.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            events = _events(resp)
        assert events[-1] == "[DONE]"
        usage = events[-2]["usage"]
        assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] > 0
        assert events[-2]["choices"] == []
        metrics = c.get("/metrics").text
    for name in ("ttft_seconds", "itl_seconds", "e2e_seconds", "queue_seconds",
                 "running_requests", "waiting_requests", "prefix_hit_ratio"):  # fmt: skip
        assert f"tyard_serving_{name}" in metrics
    assert 'tyard_serving_ttft_seconds_count{deployment="echo"} 2.0' in metrics
    assert (
        'tyard_serving_tokens_total{deployment="echo",kind="completion",team="default",'
        'user="admin"} 8.0'
    ) in metrics


def test_bad_requests_get_openai_errors(serving_plane: Callable[..., Any]) -> None:
    s = serving_plane()
    _deploy(s)
    s.wait_ready("echo", 1)
    with s.http() as c:
        unknown = c.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        dropped = c.post("/v1/chat/completions", json={**CHAT, "n": 3})
        assert dropped.status_code == 400 and dropped.json()["error"]["param"] == "n"
        broken = c.post(
            "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    with httpx.Client(base_url=s.url) as anon:
        denied = anon.post("/v1/chat/completions", json=CHAT)
        assert denied.status_code == 401
        assert denied.json()["error"]["type"] == "authentication_error"
    store = s.plane.store
    store.ensure_team("other")
    store.ensure_user("bob")
    store.set_member("other", "bob", "member")
    bob = store.create_token("bob", name="t").token
    with s.http(bob) as c:
        assert c.get("/v1/models").json()["data"] == []
        forbidden = c.post("/v1/chat/completions", json=CHAT)
        assert forbidden.status_code == 403
        assert forbidden.json()["error"]["type"] == "permission_error"
        scale = c.post("/api/v1/deployments/echo/scale", json={"replicas": 3})
        assert scale.status_code == 403


def test_an_engine_crash_mid_stream_closes_the_stream_and_the_replica_is_replaced(
    serving_plane: Callable[..., Any],
) -> None:
    s = serving_plane()
    _deploy(s, options={"tokens": 6, "crash_after": 2})
    before = s.wait_ready("echo", 1)["replica_states"][0]
    with (
        s.http() as c,
        c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as resp,
    ):
        events = _events(resp)
    assert len([e for e in events if isinstance(e, dict) and e.get("choices")]) == 2
    assert events[-2]["error"]["code"] == "engine_crashed"
    assert events[-1] == "[DONE]"
    deadline = time.monotonic() + 60
    while True:
        rep = s.wait_ready("echo", 1)["replica_states"][0]
        if rep["restarts"] >= 1 and rep["pid"] != before["pid"]:
            break
        assert time.monotonic() < deadline, rep
        time.sleep(0.2)
    with s.http() as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # not streamed: ok


def test_idle_deployments_scale_to_zero_and_the_next_request_is_held_not_failed(
    serving_plane: Callable[..., Any],
) -> None:
    s = serving_plane()
    _deploy(s, idle_timeout_s=1.0)
    pid = s.wait_ready("echo", 1)["replica_states"][0]["pid"]
    deadline = time.monotonic() + 30
    with s.http() as c:
        while c.get("/api/v1/deployments/echo").json()["replica_states"]:
            assert time.monotonic() < deadline, "did not scale to zero"
            time.sleep(0.2)
        assert not _alive(pid)
        woke = c.post("/v1/chat/completions", json=CHAT)
        assert woke.status_code == 200, woke.text
        metrics = c.get("/metrics").text
    assert 'tyard_serving_queue_seconds_count{deployment="echo"} 1.0' in metrics
    # the wait for the replica to start is queue time, not the gateway's overhead
    assert _sample(metrics, "tyard_serving_gateway_overhead_seconds_sum") < 0.5 * _sample(
        metrics, "tyard_serving_queue_seconds_sum"
    )


def _sample(metrics: str, name: str, deployment: str = "echo") -> float:
    prefix = f'{name}{{deployment="{deployment}"}} '
    [line] = [x for x in metrics.splitlines() if x.startswith(prefix)]
    return float(line[len(prefix) :])


def test_the_gateway_overhead_is_its_own_time_without_the_engines(
    serving_plane: Callable[..., Any],
) -> None:
    """The engine takes 4 x 100 ms: end to end counts it, the overhead histogram does not
    (streamed: up to the response's headers, which the mock engine sends at once)."""
    s = serving_plane()
    _deploy(s, options={"tokens": 4, "token_ms": 100})
    s.wait_ready("echo", 1)
    with s.http() as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            assert len([e for e in _events(resp) if isinstance(e, dict) and e.get("choices")]) == 4
        metrics = c.get("/metrics").text
    assert _sample(metrics, "tyard_serving_gateway_overhead_seconds_count") == 2
    assert _sample(metrics, "tyard_serving_e2e_seconds_sum") >= 0.8
    assert 0 < _sample(metrics, "tyard_serving_gateway_overhead_seconds_sum") < 0.3


def test_a_restarted_control_plane_reattaches_to_running_replicas(
    serving_plane: Callable[..., Any],
) -> None:
    first = serving_plane()
    _deploy(first)
    pid = first.wait_ready("echo", 1)["replica_states"][0]["pid"]
    assert first.plane.serving is not None
    first.plane.serving.manager.stop(stop_replicas=False)  # as if the control plane died
    second = serving_plane()
    rep = second.wait_ready("echo", 1)["replica_states"][0]
    assert rep["pid"] == pid and rep["restarts"] == 0
    with second.http() as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert c.delete("/api/v1/deployments/echo").status_code == 204
    deadline = time.monotonic() + 20
    while _alive(pid):
        assert time.monotonic() < deadline, "a deleted deployment's replica kept running"
        time.sleep(0.1)


def test_cli_serve_list_scale_delete_json(
    serving_plane: Callable[..., Any], monkeypatch: Any
) -> None:
    s = serving_plane()
    monkeypatch.setenv("TYARD_SERVER", s.url)
    monkeypatch.setenv("TYARD_TOKEN", s.token)
    run = CliRunner()
    made = run.invoke(cli, ["serve", "mock", "--name", "echo", "--engine", "mock", "--json"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.output.splitlines()[-1])["ready_replicas"] == 1
    listed = run.invoke(cli, ["deployments", "list", "--json"])
    assert [d["name"] for d in json.loads(listed.output)] == ["echo"]
    scaled = run.invoke(cli, ["deployments", "scale", "echo", "0", "--json"])
    assert json.loads(scaled.output)["replicas"] == 0
    again = run.invoke(cli, ["serve", "mock", "--name", "echo", "--engine", "mock"])
    assert again.exit_code == 2 and "exists already" in again.output
    bad = run.invoke(cli, ["serve", "/no/such.gguf"])
    assert bad.exit_code == 2 and "no such file" in bad.output
    gone = run.invoke(cli, ["deployments", "delete", "echo", "--json"])
    assert gone.exit_code == 0
    missing = run.invoke(cli, ["deployments", "describe", "echo"])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    auto = run.invoke(
        cli,
        ["serve", "mock", "--name", "auto", "--engine", "mock", "--max-replicas", "3",
         "--target-ttft", "2.5", "--json"],
    )  # fmt: skip
    assert auto.exit_code == 0, auto.output
    settings = json.loads(auto.output.splitlines()[-1])["autoscale"]
    assert settings == {"max_replicas": 3, "target_queue": 2.0, "target_ttft_s": 2.5,
                        "scale_down_after_s": 60.0}  # fmt: skip
    shown = run.invoke(cli, ["deployments", "describe", "auto"])
    assert "autoscale: 1..3 replicas" in shown.output and "p90 TTFT <= 2.5 s" in shown.output
    lone = run.invoke(
        cli, ["serve", "mock", "--name", "x", "--engine", "mock", "--target-ttft", "1"]
    )
    assert lone.exit_code == 2 and "--max-replicas" in lone.output


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_autoscaling_adds_replicas_under_queueing_and_removes_them_after_the_window(
    serving_plane: Callable[..., Any],
) -> None:
    """Queue depth scales a deployment from 1 to 3 replicas while slow requests pile up, every
    request is answered (none lost to a replica being stopped), and once the load is gone the
    deployment returns to its minimum after `scale_down_after_s`."""
    s = serving_plane()
    auto = {"max_replicas": 3, "target_queue": 1, "scale_down_after_s": 2}
    made = _deploy(s, options={"tokens": 40, "token_ms": 50}, autoscale=auto)
    assert made["autoscale"]["max_replicas"] == 3 and made["desired_replicas"] == 1
    s.wait_ready("echo", 1)
    body = {"model": "echo", "prompt": "x", "max_tokens": 40}
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(_complete, s, body) for _ in range(6)]
        peak: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(f.done() for f in futures):
            with s.http() as c:
                dep = c.get("/api/v1/deployments/echo").json()
            if dep["desired_replicas"] > peak.get("desired_replicas", 0):
                peak = dep
            time.sleep(0.1)
        answers = [f.result() for f in futures]
    assert all(a == 40 for a in answers), answers  # every request got all its tokens
    assert peak["desired_replicas"] == 3, peak
    assert peak["autoscale_reason"].startswith("up:"), peak
    with s.http() as c:
        metrics = c.get("/metrics").text
    assert 'tyard_serving_desired_replicas{deployment="echo"}' in metrics
    deadline = time.monotonic() + 30
    while True:
        with s.http() as c:
            dep = c.get("/api/v1/deployments/echo").json()
        if dep["desired_replicas"] == 1 and len(dep["replica_states"]) == 1:
            break
        assert time.monotonic() < deadline, dep
        time.sleep(0.2)
    assert dep["autoscale_reason"].startswith("down:")


def _complete(s: Any, body: dict[str, Any]) -> int:
    with s.http() as c:
        resp = c.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        return int(resp.json()["usage"]["completion_tokens"])


def test_autoscaling_settings_are_checked_and_scale_respects_the_maximum(
    serving_plane: Callable[..., Any],
) -> None:
    s = serving_plane()
    with s.http() as c:
        bad = c.post(
            "/api/v1/deployments",
            json={"model": "mock", "name": "echo", "engine": "mock", "replicas": 2,
                  "autoscale": {"max_replicas": 1}},
        )  # fmt: skip
        assert bad.status_code == 422, bad.text
        assert "max_replicas" in bad.text and "lower replicas" in bad.text
    _deploy(s, autoscale={"max_replicas": 2})
    with s.http() as c:
        over = c.post("/api/v1/deployments/echo/scale", json={"replicas": 3})
        assert over.status_code == 422, over.text
        assert "autoscale.max_replicas" in over.text
        ok = c.post("/api/v1/deployments/echo/scale", json={"replicas": 2})
        assert ok.status_code == 200 and ok.json()["replicas"] == 2


def test_usage_is_stored_per_team_and_user_and_survives_a_restart(
    serving_plane: Callable[..., Any], monkeypatch: Any
) -> None:
    s = serving_plane()
    _deploy(s, options={"tokens": 5})
    s.wait_ready("echo", 1)
    monkeypatch.setenv("TYARD_SERVER", s.url)
    monkeypatch.setenv("TYARD_TOKEN", s.token)
    run = CliRunner()
    assert run.invoke(cli, ["teams", "create", "nlp"]).exit_code == 0
    made = run.invoke(cli, ["users", "create", "alice", "--team", "nlp", "--json"])
    alice = json.loads(made.output)["token"]
    with s.http() as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert c.post("/v1/completions", json={"model": "echo", "prompt": "hi",
                                               "max_tokens": 3}).status_code == 200  # fmt: skip
        body = {**CHAT, "stream": True}  # no usage asked for: counted after the stream
        with c.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert _events(resp)[-1] == "[DONE]"
        deadline = time.monotonic() + 10
        while True:  # the stream's prompt is counted in the background
            got = c.get("/api/v1/usage", params={"by": "team,user,deployment"}).json()
            row = got["rows"][0]
            counted_late = row["prompt_tokens"] > 0 and row["requests"] == 3
            if counted_late or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [(r["team"], r["user"], r["deployment"]) for r in got["rows"]] == [
            ("default", "admin", "echo")
        ]
        assert row["requests"] == 3 and row["completion_tokens"] == 4 + 3 + 4
        assert row["prompt_tokens"] > 0 and got["total"]["total_tokens"] == row["total_tokens"]
        bad = c.get("/api/v1/usage", params={"by": "team,colour"})
        assert bad.status_code == 422 and "by" in bad.text and "deployment" in bad.text
        bad = c.get("/api/v1/usage", params={"since": "last tuesday"})
        assert bad.status_code == 422 and "since" in bad.text and "7d" in bad.text
    with s.http(alice) as c:  # alice is in nlp only: she sees none of default's usage
        assert c.get("/api/v1/usage").json()["rows"] == []
        assert c.get("/api/v1/usage", params={"team": "default"}).status_code == 403
    shown = run.invoke(cli, ["usage", "--by", "team,user", "--since", "24h"])
    assert shown.exit_code == 0 and "admin" in shown.output and "total" in shown.output
    as_json = run.invoke(cli, ["usage", "--by", "deployment,day", "--json"])
    assert json.loads(as_json.output)["rows"][0]["requests"] == 3
    wrong = run.invoke(cli, ["usage", "--by", "colour"])
    assert wrong.exit_code == 2 and "by" in wrong.output

    s.plane.serving.stop()  # a control plane that stops flushes its counts; a new one reads them
    again = serving_plane()
    with again.http() as c:
        rows = c.get("/api/v1/usage", params={"by": "deployment"}).json()["rows"]
    assert rows[0]["deployment"] == "echo" and rows[0]["requests"] == 3
