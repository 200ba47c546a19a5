"""PipelineSpec: a DAG of steps (jobs) with parameters, references, conditions and caching.

    name: tiny-gpt
    params: {steps: 60, max_ppl: 40}
    steps:
      - name: pretrain
        job: {command: ["train.py", "--steps", "${{ params.steps }}"], ...}
      - name: eval
        needs: [pretrain]
        job: {command: ["evaluate.py", "--checkpoint", "${{ steps.pretrain.outputs.checkpoint }}"]}
      - name: report
        needs: [eval]
        if: ${{ steps.eval.outputs.perplexity < params.max_ppl }}
        job: {...}

Validated once at the edge (CLI, API): unknown step references, cycles, unknown parameters and
bad expressions are SpecErrors naming the field, before anything runs. A step's `job` is a
JobSpec whose strings (command arguments, env values, workdir) may hold ``${{ ... }}``; it is
checked here with placeholders and resolved again when the step is submitted.

A step's ``kind`` is the extension point for steps that are not jobs (a model-registry
``register`` step promotes a checkpoint to the model registry; a ``deploy`` step serves a
registered version behind the gateway, see `DeploySpec`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from tensoryard import envvars
from tensoryard.errors import FieldIssue, SpecError
from tensoryard.spec._common import (
    StrictModel,
    load_yaml_text,
    read_spec_file,
    spec_error_from_validation,
)
from tensoryard.spec.deployment import DeploymentSpec
from tensoryard.spec.expr import TEMPLATE_RE, Expr, ExprError, parse_expr, render_template
from tensoryard.spec.job import NAME_PATTERN, JobSpec, parse_job_spec

__all__ = [
    "STEP_KINDS",
    "DeploySpec",
    "EvalSpec",
    "ParamValue",
    "PipelineSpec",
    "RegisterSpec",
    "StepSpec",
    "chain_hash",
    "input_hash",
    "load_pipeline_spec",
    "parse_params",
    "parse_pipeline_spec",
    "resolve_job",
    "resolve_params",
]

ParamValue = str | int | float | bool | None
STEP_KINDS = ("job", "register", "deploy", "eval")
"""Kinds of step a pipeline may hold: a job, registering a step's checkpoint as a model,
deploying a registered model version behind the gateway, or a generation eval against a
deployment."""
MAX_STEPS = 100
_PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class RegisterSpec(StrictModel):
    """A `register` step: the newest checkpoint of an earlier step's job becomes the next
    version of a model of the pipeline's team (lineage from that job), with aliases moved to
    it in the same transaction."""

    model: str = Field(..., pattern=NAME_PATTERN, description="Model name (created on first use).")
    from_step: str = Field(
        ...,
        pattern=NAME_PATTERN,
        description="The step whose job's newest checkpoint is registered.",
    )
    metrics: dict[str, str] = Field(
        default_factory=dict,
        description="Metrics recorded on the version (may use ${{ }}; numbers stay numbers).",
    )
    aliases: list[str] = Field(
        default_factory=list, description="Aliases moved to the new version, like `production`."
    )
    tags: dict[str, str] = Field(
        default_factory=dict, description="key=value tags (may use ${{ }})."
    )
    description: str = Field("", max_length=4000)


class DeploySpec(DeploymentSpec):
    """A `deploy` step: create or update the deployment of a registered model version in the
    pipeline's team, and wait until it is ready. The fields of ``POST /api/v1/deployments``
    (checked the same way), plus how long to wait and how many replica crashes to accept.

    ``model`` is MODEL[:VERSION|@ALIAS] and may use ${{ }}, like
    ``tiny:${{ steps.register.outputs.version }}``; so may string option values."""

    ready_timeout_s: float = Field(
        600.0, gt=0, le=86400, description="Fail the step when not ready after this long."
    )
    max_restarts: int = Field(
        2,
        ge=0,
        le=100,
        description="Fail the step when a replica exited more often than this while starting.",
    )

    def deployment(self, model: str, options: dict[str, Any]) -> DeploymentSpec:
        """The deployment's spec with ``model`` and ``options`` resolved."""
        data = self.model_dump(exclude={"ready_timeout_s", "max_restarts"})
        return DeploymentSpec.model_validate({**data, "model": model, "options": options})


class EvalSpec(StrictModel):
    """An `eval` step: generate an answer for each case of a JSONL eval set through a
    deployment (greedy) and score it; outputs ``score`` (0..1), ``cases``, ``correct``,
    ``failed_requests`` and a few ``samples``. Fails below ``min_score`` when set, so a later
    step (a register or alias move) can depend on it."""

    deployment: str = Field(
        ...,
        min_length=1,
        description="The deployment to call; may use ${{ }}, like "
        "'${{ steps.deploy.outputs.deployment }}'.",
    )
    dataset: str = Field(
        ...,
        min_length=1,
        description="JSONL on the control plane's machine, one {prompt|messages, expected} per "
        "line; relative to the pipeline file.",
    )
    metric: Literal["contains", "exact"] = Field(
        "contains", description="contains: an expected answer appears; exact: equals it."
    )
    max_tokens: int = Field(32, ge=1, le=4096, description="Tokens generated per case.")
    min_score: float | None = Field(
        None, ge=0, le=1, description="Fail the step when the score is below this."
    )
    timeout_s: float = Field(
        1800.0, gt=0, le=86400, description="Fail the step when not done after this long."
    )


class StepSpec(StrictModel):
    """One step: a job (or a model registration) that runs when its `needs` succeeded and
    its `if` holds."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Step name, unique in the pipeline.")
    kind: Literal["job", "register", "deploy", "eval"] = Field(
        "job",
        description="What the step does: run a job (default), register or deploy a model, "
        "or evaluate a deployment.",
    )
    needs: list[str] = Field(
        default_factory=list,
        description="Steps that must succeed first (steps referenced in ${{ }} are added).",
    )
    if_: str | None = Field(
        None,
        alias="if",
        description="Run only when this is true, like '${{ steps.eval.outputs.ppl < 40 }}'.",
    )
    retries: int = Field(0, ge=0, le=20, description="Submit the job again this often on failure.")
    cache: bool = Field(
        True, description="Reuse the outputs of an earlier run with the same inputs."
    )
    inputs: dict[str, str] = Field(
        default_factory=dict,
        description="Named values given to the job as TYARD_INPUT_<NAME> (may use ${{ }}).",
    )
    job: dict[str, Any] | None = Field(
        None, description="A JobSpec (kind job); strings may use ${{ }}."
    )
    register_: RegisterSpec | None = Field(
        None, alias="register", description="What to register (kind register)."
    )
    deploy_: DeploySpec | None = Field(
        None, alias="deploy", description="What to deploy (kind deploy)."
    )
    eval_: EvalSpec | None = Field(None, alias="eval", description="What to evaluate (kind eval).")

    model_config = StrictModel.model_config | {"populate_by_name": True}

    @model_validator(mode="after")
    def _body_matches_kind(self) -> StepSpec:
        bodies = {
            "job": self.job,
            "register": self.register_,
            "deploy": self.deploy_,
            "eval": self.eval_,
        }
        extra = [k for k, v in bodies.items() if v is not None and k != self.kind]
        if bodies[self.kind] is None or extra:
            fixes = {
                "job": "add `job:`, or set `kind: register` or `kind: deploy`",
                "register": "give `register: {model: NAME, from_step: STEP}`",
                "deploy": "give `deploy: {model: MODEL@ALIAS}` or `deploy: {model: "
                "'MODEL:${{ steps.STEP.outputs.version }}'}`",
                "eval": "give `eval: {deployment: NAME, dataset: FILE.jsonl}`",
            }
            others = " and no " + " or ".join(f"`{k}:`" for k in extra) if extra else ""
            raise ValueError(
                f"a {self.kind} step needs `{self.kind}:`{others} (fix: {fixes[self.kind]})"
            )
        return self

    @field_validator("inputs")
    @classmethod
    def _input_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _PARAM_RE.match(key):
                raise ValueError(f"{key!r} is not an input name (fix: use A-Z, a-z, 0-9 and '_')")
        return value

    def condition(self) -> Expr | None:
        """The parsed `if` (the ``${{ }}`` around it is optional)."""
        if self.if_ is None:
            return None
        text = self.if_.strip()
        match = TEMPLATE_RE.fullmatch(text)
        return parse_expr(match.group(1) if match else text)


class PipelineSpec(StrictModel):
    """A pipeline: parameters with defaults and the steps, in any order (needs give it)."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Pipeline name.")
    team: str = Field("default", pattern=NAME_PATTERN, description="Team whose queue runs it.")
    user: str = Field("anonymous", min_length=1, max_length=128)
    description: str = Field("", max_length=4000)
    params: dict[str, ParamValue] = Field(
        default_factory=dict, description="Parameters and their defaults (null: required)."
    )
    steps: list[StepSpec] = Field(..., min_length=1, max_length=MAX_STEPS)

    @field_validator("params")
    @classmethod
    def _param_names(cls, value: dict[str, ParamValue]) -> dict[str, ParamValue]:
        for key in value:
            if not _PARAM_RE.match(key):
                raise ValueError(
                    f"{key!r} is not a parameter name (fix: use A-Z, a-z, 0-9 and '_')"
                )
        return value

    def step(self, name: str) -> StepSpec:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def order(self) -> list[str]:
        """Step names in a valid run order (dependencies first, else file order)."""
        deps = self.dependencies()
        done: list[str] = []
        left = [s.name for s in self.steps]
        while left:
            ready = [n for n in left if all(d in done for d in deps[n])]
            done += ready
            left = [n for n in left if n not in ready]
        return done

    def dependencies(self) -> dict[str, list[str]]:
        """Step -> the steps it waits for: `needs` plus every step its strings reference."""
        out: dict[str, list[str]] = {}
        for step in self.steps:
            deps = list(step.needs)
            if step.register_ is not None and step.register_.from_step not in deps:
                deps.append(step.register_.from_step)
            for ref in _step_refs(step):
                if ref not in deps:
                    deps.append(ref)
            out[step.name] = deps
        return out


# -- parsing and validation ------------------------------------------------------------------


def parse_pipeline_spec(data: Any, *, source: str = "") -> PipelineSpec:
    """Validate a mapping into a PipelineSpec, or raise SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError(
            [FieldIssue("", "a pipeline spec must be a mapping", "start with 'name: ...'")],
            source=source,
        )
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source=source) from exc
    issues = _check_graph(spec)
    if not issues:
        issues = _check_steps(spec)
    if issues:
        raise SpecError(issues, source=source)
    return spec


def load_pipeline_spec(path: str | Path) -> PipelineSpec:
    """Read a YAML file; each step's relative `workdir` is taken from the file's directory."""
    file = Path(path)
    data = load_yaml_text(read_spec_file(file), source=str(file))
    spec = parse_pipeline_spec(data, source=str(file))
    base = file.resolve().parent
    for step in spec.steps:
        if step.eval_ is not None and not Path(step.eval_.dataset).is_absolute():
            step.eval_.dataset = str((base / step.eval_.dataset).resolve())
        if step.job is None:
            continue
        workdir = step.job.get("workdir")
        if workdir is None:
            step.job["workdir"] = str(base)
        elif isinstance(workdir, str) and "${{" not in workdir and not Path(workdir).is_absolute():
            step.job["workdir"] = str((base / workdir).resolve())
    return spec


def _step_refs(step: StepSpec) -> list[str]:
    """Names of the steps a step's expressions read (``steps.NAME...``), in order."""
    names: list[str] = []
    for expr in _expressions(step):
        for ref in expr.refs:
            if len(ref.parts) >= 2 and ref.parts[0] == "steps" and ref.parts[1] not in names:
                names.append(ref.parts[1])
    return names


def _expressions(step: StepSpec) -> list[Expr]:
    out: list[Expr] = []
    for _, text in _strings(step):
        for match in TEMPLATE_RE.finditer(text):
            try:
                out.append(parse_expr(match.group(1)))
            except ExprError:
                continue  # reported by _check_steps with its field
    try:
        cond = step.condition()
    except ExprError:
        cond = None
    if cond is not None:
        out.append(cond)
    return out


def _strings(step: StepSpec) -> list[tuple[str, str]]:
    """(field path under the step, string) of every string a step may template."""
    found: list[tuple[str, str]] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, str):
            found.append((path, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}.{i}")

    if step.job is not None:
        walk(step.job, "job")
    if step.register_ is not None:
        walk(step.register_.metrics, "register.metrics")
        walk(step.register_.tags, "register.tags")
    if step.deploy_ is not None:
        walk(step.deploy_.model, "deploy.model")
        walk(step.deploy_.options, "deploy.options")
    if step.eval_ is not None:
        walk(step.eval_.deployment, "eval.deployment")
    walk(step.inputs, "inputs")
    return found


def _check_graph(spec: PipelineSpec) -> list[FieldIssue]:
    """Unique names, known needs and references, no cycle."""
    issues: list[FieldIssue] = []
    names = [s.name for s in spec.steps]
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            issues.append(
                FieldIssue(f"steps.{i}.name", f"step {name!r} is defined twice", "rename one")
            )
        seen.add(name)
    known = ", ".join(names)
    for i, step in enumerate(spec.steps):
        for j, need in enumerate(step.needs):
            if need not in seen:
                issues.append(
                    FieldIssue(
                        f"steps.{i}.needs.{j}",
                        f"step {step.name!r} needs {need!r}, which is not a step",
                        f"use one of: {known}",
                    )
                )
            elif need == step.name:
                issues.append(
                    FieldIssue(f"steps.{i}.needs.{j}", f"step {need!r} needs itself", "remove it")
                )
        if step.register_ is not None and step.register_.from_step not in seen:
            issues.append(
                FieldIssue(
                    f"steps.{i}.register.from_step",
                    f"{step.register_.from_step!r} is not a step",
                    f"use one of: {known}",
                )
            )
        for ref in _step_refs(step):
            if ref not in seen:
                issues.append(
                    FieldIssue(
                        f"steps.{i}",
                        f"step {step.name!r} reads steps.{ref}, which is not a step",
                        f"use one of: {known}",
                    )
                )
    if issues:
        return issues
    cycle = _find_cycle(spec.dependencies())
    if cycle:
        first = names.index(cycle[0])
        issues.append(
            FieldIssue(
                f"steps.{first}.needs",
                "the steps form a cycle: " + " -> ".join([*cycle, cycle[0]]),
                "remove one of these dependencies (needs or ${{ steps... }} references)",
            )
        )
    return issues


def _find_cycle(deps: Mapping[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in deps.get(node, []):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in deps:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _check_steps(spec: PipelineSpec) -> list[FieldIssue]:
    """Expressions parse and read known things; each job is a valid JobSpec."""
    issues: list[FieldIssue] = []
    for i, step in enumerate(spec.steps):
        for path, text in _strings(step):
            for match in TEMPLATE_RE.finditer(text):
                issues += _check_expr(spec, match.group(1), f"steps.{i}.{path}")
        if step.if_ is not None:
            whole = TEMPLATE_RE.fullmatch(step.if_.strip())
            issues += _check_expr(spec, whole.group(1) if whole else step.if_, f"steps.{i}.if")
        if step.job is not None:
            issues += _check_job(spec, step, i)
    return issues


def _check_expr(spec: PipelineSpec, text: str, path: str) -> list[FieldIssue]:
    try:
        expr = parse_expr(text)
    except ExprError as exc:
        return [FieldIssue(path, f"bad expression {text.strip()!r}: {exc}", "fix the syntax")]
    issues = []
    for ref in expr.refs:
        problem = _ref_problem(spec, ref.parts)
        if problem:
            issues.append(FieldIssue(path, problem[0], problem[1]))
    return issues


def _ref_problem(spec: PipelineSpec, parts: tuple[str, ...]) -> tuple[str, str] | None:
    name = ".".join(parts)
    if parts[0] == "params":
        if len(parts) != 2:
            return f"{name!r} is not a parameter reference", "write params.NAME"
        if parts[1] not in spec.params:
            known = ", ".join(spec.params) or "none"
            return (
                f"unknown parameter {parts[1]!r}",
                f"declare it under params: (known: {known})",
            )
        return None
    if parts[0] == "steps":
        if len(parts) != 4 or parts[2] != "outputs":
            return f"{name!r} is not a step output", "write steps.STEP.outputs.KEY"
        return None  # the step exists (checked with the graph) and runs before this one
    if parts[0] == "models":
        if len(parts) != 5 or parts[3] != "metrics":
            return (
                f"{name!r} is not a model metric",
                "write models.MODEL.ALIAS_OR_VERSION.metrics.KEY (null when there is none)",
            )
        return None
    return (
        f"unknown name {name!r}",
        "use params.NAME, steps.STEP.outputs.KEY or models.MODEL.ALIAS.metrics.KEY",
    )


_PLACEHOLDER = "placeholder"


def _check_job(spec: PipelineSpec, step: StepSpec, index: int) -> list[FieldIssue]:
    """The job, with every ``${{ }}`` replaced by a placeholder, must be a valid JobSpec."""

    def placeholder(parts: tuple[str, ...]) -> Any:
        if parts[0] == "params" and spec.params.get(parts[-1]) is not None:
            return spec.params[parts[-1]]
        return _PLACEHOLDER

    path = f"steps.{index}.job"
    try:
        raw = _job_mapping(spec, step, placeholder)
    except ExprError:
        return []  # depends on values only known when the step runs: checked then
    team = (step.job or {}).get("team")
    issues = []
    if team is not None and team != spec.team:
        issues.append(
            FieldIssue(
                f"{path}.team",
                f"the step names team {team!r}, the pipeline runs in {spec.team!r}",
                "remove it; every step runs in the pipeline's team",
            )
        )
    try:
        parse_job_spec(raw)
    except SpecError as exc:
        issues += [FieldIssue(f"{path}.{x.path}".rstrip("."), x.message, x.fix) for x in exc.issues]
    return issues


def _job_mapping(spec: PipelineSpec, step: StepSpec, resolve: Any) -> dict[str, Any]:
    """The step's job with templates rendered and the pipeline's defaults filled in."""

    def render(value: Any) -> Any:
        if isinstance(value, str):
            return render_template(value, resolve) if "${{" in value else value
        if isinstance(value, dict):
            return {k: render(v) for k, v in value.items()}
        if isinstance(value, list):
            return [render(v) for v in value]
        return value

    raw: dict[str, Any] = render(copy.deepcopy(step.job or {}))
    raw.setdefault("name", f"{spec.name}-{step.name}"[:63].rstrip("-"))
    raw["team"] = spec.team
    raw["user"] = spec.user
    inputs = {k: render(v) for k, v in step.inputs.items()}
    if inputs:
        env = dict(raw.get("env") or {})
        env.update({f"{envvars.INPUT_PREFIX}{k.upper()}": str(v) for k, v in inputs.items()})
        raw["env"] = env
    return raw


def resolve_job(
    spec: PipelineSpec, step: StepSpec, resolve: Any, *, source: str = ""
) -> tuple[JobSpec, str]:
    """The step's JobSpec with every reference resolved, and its input hash.

    The hash covers the resolved job spec minus what does not change the result (its name,
    user and priority): a step whose resolved job is the same reuses earlier outputs."""
    raw = _job_mapping(spec, step, resolve)
    job = parse_job_spec(raw, source=source)
    return job, input_hash(step.kind, job)


def input_hash(kind: str, job: JobSpec) -> str:
    data = job.model_dump(mode="json")
    for key in ("name", "user", "priority"):
        data.pop(key, None)
    text = json.dumps({"kind": kind, "job": data}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def chain_hash(own: str, upstream: list[str]) -> str:
    """A step's input hash: its own resolved job's hash and those of the steps it needs."""
    if not upstream:
        return own
    return hashlib.sha256("|".join([own, *upstream]).encode()).hexdigest()


def parse_params(pairs: list[str]) -> dict[str, str]:
    """``["lr=0.1", "name=x"]`` -> ``{"lr": "0.1", "name": "x"}`` (values typed later)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SpecError(
                [FieldIssue("params", f"{pair!r} is not KEY=VALUE", "write --param lr=0.001")]
            )
        out[key.strip()] = value
    return out


def resolve_params(spec: PipelineSpec, given: Mapping[str, Any]) -> dict[str, ParamValue]:
    """Defaults overridden by `given`; unknown names and missing required values are errors.
    A given string is read as the type of the default (number, boolean) when it has one."""
    issues: list[FieldIssue] = []
    known = ", ".join(spec.params) or "none"
    out = dict(spec.params)
    for key, value in given.items():
        if key not in spec.params:
            issues.append(
                FieldIssue(f"params.{key}", f"unknown parameter {key!r}", f"use one of: {known}")
            )
            continue
        try:
            out[key] = _typed(value, spec.params[key])
        except ValueError as exc:
            issues.append(FieldIssue(f"params.{key}", str(exc), "give a value of that type"))
    for key, value in out.items():
        if value is None:
            issues.append(
                FieldIssue(
                    f"params.{key}",
                    f"parameter {key!r} has no default and was not given",
                    f"pass --param {key}=VALUE",
                )
            )
    if issues:
        raise SpecError(issues, source="params")
    return out


def _typed(value: Any, default: ParamValue) -> ParamValue:
    if not isinstance(value, str) or default is None or isinstance(default, str):
        if isinstance(value, str | int | float | bool) or value is None:
            return value
        raise ValueError(f"{value!r} is not a string, number or boolean")
    if isinstance(default, bool):
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"{value!r} is not true or false")
    if isinstance(default, int):
        try:
            return int(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a whole number (the default is {default})"
            ) from None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number (the default is {default})") from None
