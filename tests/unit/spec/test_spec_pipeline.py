"""PipelineSpec: a DAG of job steps; every mistake is found before anything runs, naming the
field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import SpecError
from tensoryard.spec.pipeline import (
    load_pipeline_spec,
    parse_params,
    parse_pipeline_spec,
    resolve_job,
    resolve_params,
)

REPO = Path(__file__).resolve().parents[3]


def job(*args: str) -> dict[str, Any]:
    return {"launcher": "python", "command": ["x.py", *args]}


def pipeline(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "p", "steps": list(steps), **extra}


def issues_of(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    with pytest.raises(SpecError) as info:
        parse_pipeline_spec(data)
    return [(i.path, i.message, i.fix) for i in info.value.issues]


def test_references_add_dependencies_and_the_order_follows_them() -> None:
    spec = parse_pipeline_spec(
        pipeline(
            {"name": "eval", "job": job("${{ steps.train.outputs.checkpoint }}")},
            {"name": "train", "job": job()},
            {"name": "report", "needs": ["eval"], "if": "${{ steps.eval.outputs.ppl < 3 }}",
             "job": job()},
        )
    )  # fmt: skip
    assert spec.dependencies() == {"eval": ["train"], "train": [], "report": ["eval"]}
    assert spec.order() == ["train", "eval", "report"]
    assert spec.step("report").condition() is not None


@pytest.mark.parametrize(
    ("data", "path", "message", "fix"),
    [
        (
            pipeline({"name": "a", "needs": ["nope"], "job": job()}),
            "steps.0.needs.0",
            "step 'a' needs 'nope', which is not a step",
            "use one of: a",
        ),
        (
            pipeline({"name": "a", "job": job("${{ steps.ghost.outputs.x }}")}),
            "steps.0",
            "step 'a' reads steps.ghost, which is not a step",
            "use one of: a",
        ),
        (
            pipeline(
                {"name": "a", "needs": ["c"], "job": job()},
                {"name": "b", "needs": ["a"], "job": job()},
                {"name": "c", "job": job("${{ steps.b.outputs.x }}")},
            ),
            "steps.0.needs",
            "the steps form a cycle: a -> c -> b -> a",
            "remove one of these dependencies (needs or ${{ steps... }} references)",
        ),
        (
            pipeline({"name": "a", "job": job("${{ params.lr }}")}),
            "steps.0.job.command.1",
            "unknown parameter 'lr'",
            "declare it under params: (known: none)",
        ),
        (
            pipeline({"name": "a", "if": "${{ params.x < }}", "job": job()}, params={"x": 1}),
            "steps.0.if",
            "bad expression 'params.x <': the expression ends too early",
            "fix the syntax",
        ),
        (
            pipeline({"name": "a", "job": job("${{ steps.a.outputs }}")}),
            "steps.0.needs",
            "the steps form a cycle: a -> a",
            "remove one of these dependencies (needs or ${{ steps... }} references)",
        ),
        (
            pipeline({"name": "a", "job": job()}, {"name": "a", "job": job()}),
            "steps.1.name",
            "step 'a' is defined twice",
            "rename one",
        ),
        (
            pipeline({"name": "a", "job": {"command": ["x.py"], "resources": {"cpu": -1}}}),
            "steps.0.job.resources.cpu",
            "Input should be greater than 0",
            "use a larger value",
        ),
        (
            pipeline({"name": "a", "job": {"command": ["x.py"], "team": "other"}}),
            "steps.0.job.team",
            "the step names team 'other', the pipeline runs in 'default'",
            "remove it; every step runs in the pipeline's team",
        ),
        (
            pipeline({"name": "a", "kind": "serve", "job": job()}),
            "steps.0.kind",
            "Input should be 'job', 'register', 'deploy' or 'eval'",
            "use one of the allowed values",
        ),
        (
            pipeline({"name": "a", "kind": "register", "job": job()}),
            "steps.0",
            "a register step needs `register:` and no `job:`",
            "give `register: {model: NAME, from_step: STEP}`",
        ),
        (
            pipeline(
                {"name": "a", "job": job()},
                {"name": "r", "kind": "register", "register": {"model": "m", "from_step": "b"}},
            ),
            "steps.1.register.from_step",
            "'b' is not a step",
            "use one of: a, r",
        ),
        (
            pipeline({"name": "a", "job": job("${{ models.m.production.loss }}")}),
            "steps.0.job.command.1",
            "'models.m.production.loss' is not a model metric",
            "write models.MODEL.ALIAS_OR_VERSION.metrics.KEY (null when there is none)",
        ),
        (
            pipeline({"name": "a", "job": job("${{ os.system }}")}),
            "steps.0.job.command.1",
            "unknown name 'os.system'",
            "use params.NAME, steps.STEP.outputs.KEY or models.MODEL.ALIAS.metrics.KEY",
        ),
    ],
    ids=[
        "a need that is not a step",
        "a reference to a step that does not exist",
        "a cycle through needs and a reference",
        "an unknown parameter",
        "a condition that does not parse",
        "a step that reads itself",
        "two steps with one name",
        "an invalid job inside a step",
        "a step in another team",
        "a step kind that does not exist",
        "a register step with a job body",
        "a register step from a step that does not exist",
        "a model reference without metrics",
        "a name that is neither a parameter nor an output",
    ],
)
def test_bad_pipelines_name_the_field_and_the_fix(
    data: dict[str, Any], path: str, message: str, fix: str
) -> None:
    assert (path, message, fix) in issues_of(data)


def test_params_override_defaults_with_the_defaults_type_and_unknown_ones_are_refused() -> None:
    spec = parse_pipeline_spec(
        pipeline({"name": "a", "job": job()}, params={"lr": 0.1, "steps": 10, "on": False})
    )
    given = parse_params(["lr=0.5", "steps=20", "on=true"])
    assert resolve_params(spec, given) == {"lr": 0.5, "steps": 20, "on": True}
    with pytest.raises(SpecError, match="unknown parameter 'x'"):
        resolve_params(spec, {"x": "1"})
    with pytest.raises(SpecError, match="'ten' is not a whole number"):
        resolve_params(spec, {"steps": "ten"})
    with pytest.raises(SpecError, match="is not KEY=VALUE"):
        parse_params(["lr"])


def test_a_parameter_without_default_must_be_given() -> None:
    spec = parse_pipeline_spec(pipeline({"name": "a", "job": job()}, params={"data": None}))
    with pytest.raises(SpecError, match="pass --param data=VALUE"):
        resolve_params(spec, {})
    assert resolve_params(spec, {"data": "/d"}) == {"data": "/d"}


def test_a_resolved_job_carries_values_inputs_and_a_hash_of_what_changes_its_result() -> None:
    spec = parse_pipeline_spec(
        pipeline(
            {"name": "a", "job": job()},
            {"name": "b", "inputs": {"ckpt": "${{ steps.a.outputs.checkpoint }}"},
             "job": job("--lr", "${{ params.lr }}")},
            params={"lr": 0.1},
        )
    )  # fmt: skip
    values = {("params", "lr"): 0.1, ("steps", "a", "outputs", "checkpoint"): "/c/step-1"}
    first, digest = resolve_job(spec, spec.step("b"), lambda p: values[p])
    assert first.command == ["x.py", "--lr", "0.1"]
    assert first.env == {"TYARD_INPUT_CKPT": "/c/step-1"}
    assert first.name == "p-b" and first.team == "default"
    values[("params", "lr")] = 0.2
    second, other = resolve_job(spec, spec.step("b"), lambda p: values[p])
    assert other != digest and second.command[-1] == "0.2"
    values[("params", "lr")] = 0.1
    assert resolve_job(spec, spec.step("b"), lambda p: values[p])[1] == digest


TINY = REPO / "examples" / "tiny_gpt"


def test_the_example_pipeline_loads_with_workdirs_from_its_directory() -> None:
    spec = load_pipeline_spec(REPO / "examples" / "pipelines" / "tiny-gpt.yaml")
    assert spec.order() == ["pretrain", "finetune", "eval-base", "evaluate", "register"]
    assert spec.step("pretrain").job == {**spec.step("pretrain").job, "workdir": str(TINY)}
    register = spec.step("register")
    assert register.kind == "register" and register.register_ is not None
    assert register.register_.from_step == "finetune" and register.job is None
    assert set(spec.dependencies()["register"]) == {"finetune", "evaluate", "eval-base"}


def test_yaml_syntax_errors_point_at_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("name: p\nsteps:\n  - name: [\n")
    with pytest.raises(SpecError, match="malformed YAML at line"):
        load_pipeline_spec(bad)
