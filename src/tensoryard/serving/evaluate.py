"""Generation-based evaluation against a deployment (a pipeline's ``kind: eval`` step).

The eval set is a JSONL file, one case per line: ``{"prompt": TEXT, "expected": TEXT}`` for the
completions API or ``{"messages": [...], "expected": TEXT}`` for chat; ``expected`` may also be a
list of acceptable answers. Each case is generated greedily (temperature 0) through the
deployment's replicas, chosen by the deployment's router like any gateway request (so a
deployment scaled to zero is woken and the request held), and scored:

- ``contains``: an expected answer appears in the generation (case and spacing ignored);
- ``exact``: the generation, stripped, equals an expected answer (case and spacing ignored).

The score is the fraction of cases answered right. Evaluation is pure (it writes nothing but
the step's outputs), so a control plane that restarts mid-eval runs it again from the start.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tensoryard.errors import FieldIssue, SpecError
from tensoryard.serving.replicas import ReplicaManager

__all__ = ["EvalCase", "EvalResult", "load_eval_set", "run_eval", "score"]

MAX_CASES = 10_000
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class EvalCase:
    prompt: str | None
    messages: list[dict[str, Any]] | None
    expected: tuple[str, ...]

    @property
    def text(self) -> str:
        """What the router keys on: the prompt, or the messages' contents in order."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(str(m.get("content", "")) for m in self.messages or [])


@dataclass
class EvalResult:
    cases: int
    correct: int
    failed_requests: int
    duration_s: float
    samples: list[dict[str, Any]] = field(default_factory=list)  # the first few, for the UI

    @property
    def score(self) -> float:
        return self.correct / self.cases if self.cases else 0.0


def load_eval_set(path: Path, *, field_name: str = "eval.dataset") -> list[EvalCase]:
    """The cases of a JSONL eval set; SpecError naming the file, line and key otherwise."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            [FieldIssue(field_name, f"cannot read {path}: {exc}", "give a readable JSONL file")]
        ) from exc
    cases: list[EvalCase] = []
    issues: list[FieldIssue] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{field_name} ({path.name} line {no})"
        try:
            row = json.loads(line)
        except ValueError as exc:
            issues.append(FieldIssue(where, f"not JSON: {exc}", "one JSON object per line"))
            continue
        if not isinstance(row, dict):
            issues.append(FieldIssue(where, "not a JSON object", "one JSON object per line"))
            continue
        expected = row.get("expected")
        answers = [expected] if isinstance(expected, str) else expected
        if (
            not isinstance(answers, list)
            or not answers
            or not all(isinstance(a, str) and a.strip() for a in answers)
        ):
            issues.append(
                FieldIssue(where, "`expected` is missing or empty", "give a string or a list")
            )
            continue
        prompt, messages = row.get("prompt"), row.get("messages")
        if (prompt is None) == (messages is None):
            issues.append(
                FieldIssue(where, "needs exactly one of `prompt` and `messages`", "give one")
            )
            continue
        if prompt is not None and not isinstance(prompt, str):
            issues.append(FieldIssue(where, "`prompt` is not a string", "give text"))
            continue
        if messages is not None and not (
            isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)
        ):
            issues.append(
                FieldIssue(where, "`messages` is not a list of messages", "as OpenAI's chat API")
            )
            continue
        cases.append(EvalCase(prompt, messages, tuple(answers)))
    if not issues and not cases:
        issues.append(FieldIssue(field_name, f"{path} holds no cases", "add JSONL lines"))
    if len(cases) > MAX_CASES:
        issues.append(
            FieldIssue(field_name, f"{len(cases)} cases", f"at most {MAX_CASES} per step")
        )
    if issues:
        raise SpecError(issues[:10])
    return cases


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text).strip().casefold()


def score(answer: str, expected: tuple[str, ...], metric: str) -> bool:
    got = _norm(answer)
    if metric == "exact":
        return any(got == _norm(e) for e in expected)
    return any(_norm(e) in got for e in expected)


def run_eval(
    manager: ReplicaManager,
    deployment: str,
    cases: list[EvalCase],
    *,
    metric: str,
    max_tokens: int,
    timeout_s: float,
    cancelled: Callable[[], bool] = lambda: False,
    keep_samples: int = 5,
) -> EvalResult:
    """Generate every case through the deployment's replicas, one at a time, and score."""
    start = time.monotonic()
    correct = failed = 0
    samples: list[dict[str, Any]] = []
    with httpx.Client(timeout=timeout_s) as http:
        for case in cases:
            if cancelled():
                break
            left = timeout_s - (time.monotonic() - start)
            if left <= 0:
                raise TimeoutError(f"the eval did not finish within {timeout_s:.0f} s")
            replica, route = asyncio.run(
                manager.acquire(deployment, case.text, timeout_s=left)
            )  # routed like a gateway request; holds while the deployment scales from zero
            ok = False
            try:
                body: dict[str, Any] = {
                    "model": deployment,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
                if case.prompt is not None:
                    path, body["prompt"] = "/v1/completions", case.prompt
                else:
                    path, body["messages"] = "/v1/chat/completions", case.messages
                resp = http.post(replica.url + path, json=body)
                resp.raise_for_status()
                choice = resp.json()["choices"][0]
                answer = str(
                    choice.get("text") if case.prompt is not None else choice["message"]["content"]
                )
                ok = True
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                failed += 1
                answer = f"(request failed: {exc})"
            finally:
                manager.release(replica, failed=not ok, route=route)
            right = ok and score(answer, case.expected, metric)
            correct += right
            if len(samples) < keep_samples:
                samples.append({"input": case.text[:200], "answer": answer[:200], "correct": right})
    return EvalResult(len(cases), correct, failed, time.monotonic() - start, samples)
