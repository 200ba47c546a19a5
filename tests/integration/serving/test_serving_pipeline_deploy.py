"""A pipeline train -> register -> deploy -> call, through the real control plane over HTTP:
the jobs run as processes on the local executor, the deploy step creates a deployment whose
replicas run the mock engine (real processes on real ports), and the last job calls the
gateway with the deploy step's outputs. A bad deploy step is a 422 naming the field. The
SmolLM2 example runs on real llama.cpp replicas where the engine is installed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli
from tensoryard.errors import ConfigError
from tensoryard.serving.engine import engine_available
from tensoryard.serving.source import ensure_smollm2

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pipelines" / "serve-smollm2.yaml"

TRAIN = """
import os, pathlib
from tensoryard.runtime.report import Reporter
ckpt = pathlib.Path(os.environ["TYARD_RUN_DIR"]) / "ckpt"
ckpt.mkdir()
(ckpt / "model.bin").write_bytes(b"tiny weights" * 100)
reporter = Reporter.from_env()
reporter.report(1, loss=1.25)
reporter.checkpoint(1, ckpt, 1200)
assert reporter.flush(30), "the control plane did not take the report"
reporter.close()
"""

CALL = """
import json, os, sys, urllib.request
endpoint, model = sys.argv[1], sys.argv[2]
body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
request = urllib.request.Request(
    endpoint + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["GATEWAY_TOKEN"],
             "Content-Type": "application/json"},
)
answer = json.load(urllib.request.urlopen(request, timeout=60))
text = answer["choices"][0]["message"]["content"]
with open(os.path.join(os.environ["TYARD_RUN_DIR"], "outputs.json"), "w") as fh:
    json.dump({"answer": text, "served_by": answer["model"]}, fh)
"""


EVAL_SET = [
    {"prompt": "Say tok.", "expected": "tok"},
    {"messages": [{"role": "user", "content": "hi"}], "expected": ["TOK", "tak"]},
    {"prompt": "The capital of France is", "expected": "Paris"},
]


def pipeline(
    scripts: Path, token: str, eval_set: Path | None = None, **deploy: Any
) -> dict[str, Any]:
    def job(script: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        return {"launcher": "python", "command": [script, *args], "workdir": str(scripts),
                "resources": {"cpu": 1, "memory": "512Mi"}, "env": env or {}}  # fmt: skip

    return {
        "name": "ship",
        "steps": [
            {"name": "train", "cache": False, "job": job("train.py")},
            {"name": "register", "kind": "register",
             "register": {"model": "tiny", "from_step": "train", "aliases": ["candidate"],
                          "metrics": {"loss": "${{ steps.train.outputs.loss }}"}}},
            {"name": "deploy", "kind": "deploy",
             "if": "${{ steps.train.outputs.loss < 2 }}",
             "deploy": {"model": "tiny:${{ steps.register.outputs.version }}",
                        "name": "tiny-chat", "engine": "mock", "replicas": 1,
                        "options": {"tokens": 3}, **deploy}},
            {"name": "call", "job": job("call.py", "${{ steps.deploy.outputs.endpoint }}",
                                        "${{ steps.deploy.outputs.gateway_model }}",
                                        env={"GATEWAY_TOKEN": token})},
            {"name": "eval", "kind": "eval",
             "eval": {"deployment": "${{ steps.deploy.outputs.deployment }}",
                      "dataset": str(eval_set or scripts / "eval.jsonl"), "max_tokens": 3}},
        ],
    }  # fmt: skip


def test_train_register_deploy_and_call_the_gateway_through_the_server(
    serving_plane: Callable[..., Any], tmp_path: Path
) -> None:
    s = serving_plane()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "train.py").write_text(TRAIN)
    (scripts / "call.py").write_text(CALL)
    (scripts / "eval.jsonl").write_text("".join(json.dumps(c) + "\n" for c in EVAL_SET))
    (scripts / "broken.jsonl").write_text('{"prompt": "x"}\nnot json\n')
    s.plane.controller.start()
    try:
        with s.http() as c:
            bad = c.post(
                "/api/v1/pipelines",
                json={"spec": pipeline(scripts, s.token, engine="vllm")},
            )
            assert bad.status_code == 422, bad.text
            assert {
                "path": "steps.2.deploy.engine",
                "message": "vllm runs on GPU nodes of a Kubernetes cluster and this control "
                "plane has no Kubernetes executor",
                "fix": "start the server with --executor kubernetes, or serve a GGUF file "
                "with engine llama.cpp on this machine",
            } in bad.json()["detail"]
            for eval_set, message in (
                (scripts / "missing.jsonl", "cannot read"),
                (scripts / "broken.jsonl", "`expected` is missing or empty"),
            ):
                refused = c.post(
                    "/api/v1/pipelines", json={"spec": pipeline(scripts, s.token, eval_set)}
                )
                assert refused.status_code == 422, refused.text
                paths = {d["path"]: d["message"] for d in refused.json()["detail"]}
                assert any(
                    p.startswith("steps.4.eval.dataset") and message in m for p, m in paths.items()
                ), paths
            assert c.get("/api/v1/pipelines").json() == []

            made = c.post("/api/v1/pipelines", json={"spec": pipeline(scripts, s.token)})
            assert made.status_code == 201, made.text
            pid = made.json()["id"]
            deadline = time.monotonic() + 180
            while True:
                record = c.get(f"/api/v1/pipelines/{pid}").json()
                if record["state"] != "RUNNING":
                    break
                assert time.monotonic() < deadline, record
                time.sleep(0.3)
            steps = {st["name"]: st for st in record["steps"]}
            assert record["state"] == "SUCCEEDED", (record["reason"], steps)
            deploy = steps["deploy"]
            assert deploy["state"] == "SUCCEEDED", deploy["reason"]
            assert deploy["outputs"]["deployment"] == "tiny-chat"
            assert deploy["outputs"]["version"] == 1
            assert deploy["outputs"]["endpoint"] == f"{s.url}/v1"
            assert deploy["outputs"]["ready_replicas"] == 1
            call = steps["call"]["outputs"]
            assert call["served_by"] == "tiny-chat" and call["answer"].split() == ["tok"] * 3
            evaluated = steps["eval"]
            assert evaluated["state"] == "SUCCEEDED", evaluated["reason"]
            out = evaluated["outputs"]
            assert (out["cases"], out["correct"], out["failed_requests"]) == (3, 2, 0)
            assert out["score"] == pytest.approx(2 / 3, abs=1e-5)
            assert out["deployment"] == "tiny-chat" and out["metric"] == "contains"
            assert [x["correct"] for x in out["samples"]] == [True, True, False]
            assert "2/3 right" in evaluated["reason"]

            # an eval step as a gate: below min_score it fails (and so does its pipeline)
            gate = {"name": "gate", "steps": [{"name": "gate", "kind": "eval", "eval": {
                "deployment": "tiny-chat", "dataset": str(scripts / "eval.jsonl"),
                "metric": "exact", "min_score": 0.9}}]}  # fmt: skip
            gid = c.post("/api/v1/pipelines", json={"spec": gate}).json()["id"]
            deadline = time.monotonic() + 60
            while (gated := c.get(f"/api/v1/pipelines/{gid}").json())["state"] == "RUNNING":
                assert time.monotonic() < deadline, gated
                time.sleep(0.3)
            assert gated["state"] == "FAILED"
            step = gated["steps"][0]
            assert step["state"] == "FAILED" and "below min_score 0.9" in step["reason"], step
            assert step["outputs"]["correct"] == 0  # exact: " tok tok tok" is not "tok"

            described = c.get("/api/v1/deployments/tiny-chat").json()
            assert described["model"] == "tiny:1 (version 1)"
            assert described["ready_replicas"] == 1 and described["team"] == "default"
            listed = c.get("/v1/models").json()
            assert [m["id"] for m in listed["data"]] == ["tiny-chat"]
    finally:
        s.plane.controller.stop()


def test_the_smollm2_example_registers_deploys_on_llama_cpp_and_answers(
    serving_plane: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/pipelines/serve-smollm2.yaml as a user runs it (`tyard pipeline run --wait`);
    skipped with the fix when the llama.cpp engine or the SmolLM2 wheel is missing."""
    missing = engine_available()
    if missing:
        pytest.skip(missing)
    try:
        ensure_smollm2()
    except ConfigError as exc:
        pytest.skip(f"SmolLM2 GGUF unavailable: {exc}")
    s = serving_plane()
    monkeypatch.setenv("TYARD_SERVER", s.url)
    monkeypatch.setenv("TYARD_TOKEN", s.token)
    s.plane.controller.start()
    try:
        ran = CliRunner().invoke(
            cli, ["pipeline", "run", str(EXAMPLE), "--wait", "--json"], catch_exceptions=False
        )
        assert ran.exit_code == 0, ran.output
        final = json.loads(ran.stdout)
        steps = {st["name"]: st for st in final["steps"]}
        assert [st["state"] for st in final["steps"]] == ["SUCCEEDED"] * 4, steps
        evaluated = steps["eval"]["outputs"]
        assert evaluated["cases"] == 8 and evaluated["failed_requests"] == 0, evaluated
        assert 0 <= evaluated["score"] <= 1 and evaluated["correct"] == round(
            8 * evaluated["score"]
        )
        assert steps["deploy"]["outputs"]["gateway_model"] == "smollm2-chat"
        chat = {"model": "smollm2-chat", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hello."}]}  # fmt: skip
        with s.http() as c:
            described = c.get("/api/v1/deployments/smollm2-chat").json()
            assert described["model"] == "smollm2:1 (version 1)"
            assert described["model_path"].endswith(".gguf")
            answer = c.post("/v1/chat/completions", json=chat)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"].strip()
    finally:
        s.plane.controller.stop()
