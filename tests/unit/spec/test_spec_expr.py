"""The ${{ }} expression language: what it computes, and what it refuses (never eval)."""

from __future__ import annotations

import pytest

from tensoryard.spec.expr import ExprError, Value, parse_expr, render_template

VALUES: dict[str, Value] = {
    "params.lr": 0.001,
    "params.max_ppl": 40,
    "params.name": "tiny",
    "params.on": True,
    "steps.eval.outputs.perplexity": 12.5,
    "steps.eval-base.outputs.perplexity": 30.0,
}


def resolve(parts: tuple[str, ...]) -> Value:
    key = ".".join(parts)
    if key not in VALUES:
        raise ExprError(f"{key} is unknown")
    return VALUES[key]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("steps.eval.outputs.perplexity < params.max_ppl", True),
        ("steps.eval.outputs.perplexity < steps.eval-base.outputs.perplexity", True),
        ("steps.eval.outputs.perplexity >= params.max_ppl", False),
        ("params.max_ppl - 10 * 2 == 20", True),
        ("-(params.lr) < 0 and not params.on == false", True),
        ("params.name == 'tiny' or params.lr > 1", True),
        ('params.name != "tiny"', False),
        ("(1 + 2) * 3 / 2", 4.5),
        ("params.name + '-v2'", "tiny-v2"),
        ("null == null", True),
        ("1e-3 == params.lr", True),
    ],
    ids=lambda v: str(v),
)
def test_expressions_compute_what_they_say(text: str, expected: Value) -> None:
    assert parse_expr(text).evaluate(resolve) == expected


def test_an_expression_lists_the_names_it_reads() -> None:
    refs = parse_expr("steps.eval.outputs.perplexity < params.max_ppl").refs
    assert [str(r) for r in refs] == ["steps.eval.outputs.perplexity", "params.max_ppl"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("1 <", "ends too early"),
        ("a < b < c", "chained comparisons"),
        ("__import__('os').system('x')", "unexpected '\\('"),
        ("params.lr[0]", "cannot read"),
        ("(1 + 2", "'\\)' is missing"),
        ("params.", "a name is missing"),
        ("1 2", "unexpected '2'"),
        ("-" * 40 + "1", "deeper than"),
        ("x" * 1001, "longer than"),
    ],
    ids=[
        "empty",
        "dangling operator",
        "chained comparison",
        "a call",
        "indexing",
        "open parenthesis",
        "trailing dot",
        "two values",
        "deep nesting",
        "too long",
    ],
)
def test_bad_expressions_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ExprError, match=message):
        parse_expr(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("params.name < 3", "params.name is 'tiny', not a number"),
        ("params.max_ppl / 0", "division by zero"),
        ("params.missing", "params.missing is unknown"),
    ],
)
def test_evaluation_errors_name_the_value(text: str, message: str) -> None:
    with pytest.raises(ExprError, match=message):
        parse_expr(text).evaluate(resolve)


def test_templates_render_values_in_strings() -> None:
    text = "--lr ${{ params.lr }} --ppl=${{steps.eval.outputs.perplexity}} ${{ params.on }}"
    assert render_template(text, resolve) == "--lr 0.001 --ppl=12.5 true"
    assert render_template("no templates", resolve) == "no templates"
