"""Eval sets (JSONL) are checked line by line with the field and fix named; answers are
scored by `contains` or `exact`, ignoring case and spacing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensoryard.errors import SpecError
from tensoryard.serving.evaluate import load_eval_set, score


def test_an_eval_set_loads_prompts_and_chat_cases(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    rows = [
        {"prompt": "2 + 2 =", "expected": "4"},
        {"messages": [{"role": "user", "content": "Capital of France?"}], "expected": ["Paris"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    cases = load_eval_set(path)
    assert [c.expected for c in cases] == [("4",), ("Paris",)]
    assert cases[0].text == "2 + 2 =" and cases[1].text == "Capital of France?"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"prompt": "x"}', "`expected` is missing or empty"),
        ('{"prompt": "x", "expected": ["", "  "]}', "`expected` is missing or empty"),
        ('{"expected": "a"}', "exactly one of `prompt` and `messages`"),
        ('{"prompt": "x", "messages": [{}], "expected": "a"}', "exactly one of"),
        ('{"prompt": 3, "expected": "a"}', "`prompt` is not a string"),
        ('{"messages": "hi", "expected": "a"}', "`messages` is not a list"),
    ],
)
def test_a_bad_line_is_named_with_its_number(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text('{"prompt": "ok", "expected": "ok"}\n' + line + "\n")
    with pytest.raises(SpecError) as err:
        load_eval_set(path, field_name="steps.3.eval.dataset")
    issue = err.value.issues[0]
    assert issue.path == "steps.3.eval.dataset (set.jsonl line 2)"
    assert message in issue.message


def test_a_missing_or_empty_set_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_eval_set(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SpecError, match="holds no cases"):
        load_eval_set(tmp_path / "empty.jsonl")


def test_scoring_ignores_case_and_spacing() -> None:
    assert score("  The answer is PARIS.\n", ("paris",), "contains")
    assert not score("The answer is Lyon.", ("paris",), "contains")
    assert score(" Paris \n", ("paris", "Paris, France"), "exact")
    assert not score("Paris, of course", ("paris",), "exact")
    assert score("new   york", ("New York",), "exact")
