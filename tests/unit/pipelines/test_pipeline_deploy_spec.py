"""A pipeline's `kind: deploy` step: every mistake the spec can show is found before anything
runs, naming the field under `steps.N.deploy` and the fix; engine, options and model are
checked by the deployments API's own checks (`check_deploy_steps`)."""

from __future__ import annotations

from typing import Any

import pytest

from tensoryard.errors import SpecError
from tensoryard.server.pipelines import check_deploy_steps
from tensoryard.spec.deployment import DeploymentSpec
from tensoryard.spec.pipeline import parse_pipeline_spec

TRAIN = {"name": "train", "job": {"launcher": "python", "command": ["t.py"]}}
REGISTER = {
    "name": "register",
    "kind": "register",
    "register": {"model": "m", "from_step": "train"},
}


def deploy(**body: Any) -> dict[str, Any]:
    return {"name": "serve", "kind": "deploy", "deploy": {"model": "m@production", **body}}


def pipeline(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "p", "steps": list(steps)}


def spec_issues(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    with pytest.raises(SpecError) as info:
        parse_pipeline_spec(data)
    return [(i.path, i.message, i.fix) for i in info.value.issues]


def edge_issues(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    with pytest.raises(SpecError) as info:
        check_deploy_steps(parse_pipeline_spec(data))
    return [(i.path, i.message, i.fix) for i in info.value.issues]


@pytest.mark.parametrize(
    ("data", "path", "message", "fix"),
    [
        (
            pipeline({"name": "serve", "kind": "deploy"}),
            "steps.0",
            "a deploy step needs `deploy:`",
            "give `deploy: {model: MODEL@ALIAS}` or `deploy: {model: "
            "'MODEL:${{ steps.STEP.outputs.version }}'}`",
        ),
        (
            pipeline({**deploy(), "job": {"command": ["x.py"]}}),
            "steps.0",
            "a deploy step needs `deploy:` and no `job:`",
            "give `deploy: {model: MODEL@ALIAS}` or `deploy: {model: "
            "'MODEL:${{ steps.STEP.outputs.version }}'}`",
        ),
        (
            pipeline(deploy(replicas=-1)),
            "steps.0.deploy.replicas",
            "Input should be greater than or equal to 0",
            "use a larger value",
        ),
        (
            pipeline(deploy(name="Not_A_Name")),
            "steps.0.deploy.name",
            "String should match pattern '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'",
            "use lowercase letters, digits and '-' (start with a letter)",
        ),
        (
            pipeline(deploy(gpus=1)),
            "steps.0.deploy.gpus",
            "Extra inputs are not permitted",
            "remove this field or check its spelling",
        ),
        (
            pipeline(deploy(router="random")),
            "steps.0.deploy.router",
            "Input should be 'prefix' or 'round-robin'",
            "use one of the allowed values",
        ),
        (
            pipeline(deploy(ready_timeout_s=0)),
            "steps.0.deploy.ready_timeout_s",
            "Input should be greater than 0",
            "use a larger value",
        ),
        (
            pipeline(TRAIN, deploy(model="m:${{ steps.nope.outputs.version }}")),
            "steps.1",
            "step 'serve' reads steps.nope, which is not a step",
            "use one of: train, serve",
        ),
        (
            pipeline(TRAIN, deploy(model="m:${{ steps.train.version }}")),
            "steps.1.deploy.model",
            "'steps.train.version' is not a step output",
            "write steps.STEP.outputs.KEY",
        ),
        (
            pipeline(deploy(options={"n_ctx": "${{ params.ctx }}"})),
            "steps.0.deploy.options.n_ctx",
            "unknown parameter 'ctx'",
            "declare it under params: (known: none)",
        ),
    ],
    ids=[
        "a deploy step without its body",
        "a deploy step with a job body too",
        "a negative replica count",
        "a deployment name that is not a DNS label",
        "a field the deployments API does not have",
        "a router that does not exist",
        "a readiness timeout of zero",
        "a model version read from a step that does not exist",
        "a model version read from something that is not an output",
        "an option that reads an unknown parameter",
    ],
)
def test_bad_deploy_steps_name_the_field_and_the_fix(
    data: dict[str, Any], path: str, message: str, fix: str
) -> None:
    assert (path, message, fix) in spec_issues(data)


@pytest.mark.parametrize(
    ("step", "path", "message", "fix"),
    [
        (
            deploy(engine="tgi"),
            "steps.0.deploy.engine",
            "unknown engine 'tgi'",
            "use one of ('llama.cpp', 'vllm', 'sglang')",
        ),
        (
            deploy(options={"n_gpu_layers": 10}),
            "steps.0.deploy.options.n_gpu_layers",
            "is not a llama.cpp option tensoryard knows",
            "use one of cache, cache_size, logprobs, n_batch, n_ctx, n_threads, seed",
        ),
        (
            deploy(options={"n_ctx": "lots"}),
            "steps.0.deploy.options.n_ctx",
            "'lots' is not a whole number",
            "give a whole number",
        ),
        (
            deploy(model="/models/x.gguf"),
            "steps.0.deploy.model",
            "'/models/x.gguf' is a file; a deploy step serves a registered model",
            "register it first and give MODEL[:VERSION|@ALIAS]",
        ),
        (
            deploy(model="Big Model"),
            "steps.0.deploy.model",
            "'Big Model' is neither a path nor MODEL[:VERSION|@ALIAS]",
            "use a lowercase model name, e.g. smollm2:1 or smollm2@prod, or a .gguf path",
        ),
    ],
    ids=[
        "an engine that does not exist",
        "an option llama.cpp does not take",
        "an option of the wrong type",
        "a file instead of a registered model",
        "a model reference that does not parse",
    ],
)
def test_the_deployments_api_checks_apply_to_deploy_steps_with_their_path(
    step: dict[str, Any], path: str, message: str, fix: str
) -> None:
    assert (path, message, fix) in edge_issues(pipeline(step))


def test_templated_values_are_checked_when_the_step_runs_and_add_dependencies() -> None:
    data = pipeline(
        TRAIN,
        REGISTER,
        deploy(
            model="${{ steps.register.outputs.model }}:${{ steps.register.outputs.version }}",
            options={"tokens": "${{ steps.train.outputs.step }}"},
            engine="mock",
            replicas=2,
        ),
    )
    spec = parse_pipeline_spec(data)
    check_deploy_steps(spec)  # nothing known is wrong
    assert spec.dependencies()["serve"] == ["register", "train"]
    assert spec.order() == ["train", "register", "serve"]
    body = spec.step("serve").deploy_
    assert body is not None and body.ready_timeout_s == 600 and body.max_restarts == 2
    resolved = body.deployment("m:3", {"tokens": "4"})
    assert resolved == DeploymentSpec(
        model="m:3", engine="mock", replicas=2, options={"tokens": "4"}
    )


def test_a_gpu_deploy_step_is_checked_with_the_gpu_engines_rules() -> None:
    bad = deploy(engine="vllm", options={"tensor_parallel_size": 4, "nodes": 3})
    paths = [p for p, _, _ in edge_issues(pipeline(bad))]
    assert paths == ["steps.0.deploy.options.nodes"]
    good = deploy(engine="sglang", options={"tensor_parallel_size": 16, "nodes": 2})
    check_deploy_steps(parse_pipeline_spec(pipeline(good)))  # no SpecError
    with pytest.raises(SpecError) as info:  # a control plane without Kubernetes
        check_deploy_steps(parse_pipeline_spec(pipeline(good)), kubernetes=False)
    assert info.value.issues[0].path == "steps.0.deploy.engine"
    assert "--executor kubernetes" in info.value.issues[0].fix
