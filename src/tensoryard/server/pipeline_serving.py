"""Pipeline steps that go through the serving plane: ``deploy`` (serve a registered version,
intent first, applied once per process, done when every replica answers) and ``eval`` (score a
deployment on a JSONL eval set on a worker thread), and the checks of deploy steps made when a
pipeline is submitted. The module docstring of :mod:`tensoryard.server.pipelines` tells the
whole protocol."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tensoryard.errors import (
    FieldIssue,
    SpecError,
    TensoryardError,
)
from tensoryard.spec.deployment import DeploymentSpec
from tensoryard.spec.expr import ExprError, Value, render_template
from tensoryard.spec.pipeline import DeploySpec, PipelineSpec, StepSpec
from tensoryard.store import StepRecord, Store

if TYPE_CHECKING:
    from tensoryard.serving.deploy import Deployer, DeploymentStatus
    from tensoryard.serving.evaluate import EvalCase

from tensoryard.server.pipeline_run import PipelineRun, utc

__all__ = ["ServingSteps", "check_deploy_steps"]

log = logging.getLogger("tensoryard.pipelines")


class SetStep(Protocol):
    """Moves a step (compare-and-set on its state); the advancer's ``_set``."""

    def __call__(
        self,
        run: PipelineRun,
        name: str,
        state: str,
        reason: str,
        *,
        expected: str | None = None,
        **fields: Any,
    ) -> StepRecord: ...


class ServingSteps:
    """The ``deploy`` and ``eval`` steps of the pipelines: they run through the serving plane
    (`Deployer`), and remember between passes which deployments this process applied and
    which evaluations run on its worker threads."""

    def __init__(
        self,
        store: Store,
        *,
        deployer: Deployer | None,
        clock: Callable[[], datetime],
        set_step: SetStep,
    ) -> None:
        self.store = store
        self.deployer = deployer
        self.clock = clock
        self._set = set_step
        self._applied: set[tuple[int, str]] = set()  # deploy steps applied by this process
        self._evals: dict[tuple[int, str], tuple[Future[Any], threading.Event]] = {}
        self._eval_pool: ThreadPoolExecutor | None = None

    def run_deploy_step(self, run: PipelineRun, step: StepSpec) -> None:
        spec = step.deploy_
        assert spec is not None  # a deploy step always has one (StepSpec checks it)
        deployer = self._serving(run, step)
        if deployer is None:
            return
        try:
            deployment = _resolved_deployment(spec, run.resolver(self.store))
            plan = deployer.plan(run.record.team, deployment)
        except ExprError as exc:
            self._set(run, step.name, "FAILED", f"cannot resolve deploy: {exc}")
            return
        except (TensoryardError, OSError) as exc:
            self._set(run, step.name, "FAILED", f"cannot deploy {spec.model}: {exc}")
            return
        # intent first: a crash after this line finds the step RUNNING and applies it again
        self._set(
            run,
            step.name,
            "RUNNING",
            _deploying(plan.name, plan.model, plan.version, 0, plan.replicas),
            outputs={
                "deployment": plan.name,
                "gateway_model": plan.name,
                "endpoint": deployer.endpoint(),
                "model": plan.model,
                "version": plan.version,
                "engine": plan.engine,
                "replicas": plan.replicas,
            },
        )
        self.watch_deploy(run, step)

    def watch_deploy(self, run: PipelineRun, step: StepSpec) -> None:
        spec = step.deploy_
        assert spec is not None
        current = run.steps[step.name]
        outputs = dict(current.outputs)
        name = str(outputs.get("deployment", ""))
        if run.record.cancel_requested:
            self._set(
                run,
                step.name,
                "CANCELLED",
                f"the pipeline was cancelled; deployment {name} is left as it is "
                f"(`tyard deployments delete {name}` removes it)",
            )
            return
        deployer = self._serving(run, step)
        if deployer is None:
            return
        key = (run.record.id, step.name)
        if key not in self._applied:
            if not self._apply_deploy(run, step):
                return
            self._applied.add(key)
        status = deployer.status(name)
        started = current.started_at
        waited = (self.clock() - utc(started)).total_seconds() if started else 0.0
        state, reason = _deploy_outcome(
            spec, outputs, status, waited, tail=deployer.replica_log_tail
        )
        if state != "RUNNING":
            self._applied.discard(key)
        if state != "RUNNING" or reason != current.reason:
            extra = {"ready_replicas": status.ready} if state == "SUCCEEDED" else {}
            self._set(run, step.name, state, reason, outputs={**outputs, **extra})

    def _apply_deploy(self, run: PipelineRun, step: StepSpec) -> bool:
        """Create or update the step's deployment (idempotent), pinned to the version the
        step resolved when it started; False when the step FAILED instead."""
        assert step.deploy_ is not None and self.deployer is not None
        outputs = run.steps[step.name].outputs
        version = outputs.get("version")
        pinned = f"{outputs.get('model')}:{version}"
        try:
            deployment = _resolved_deployment(step.deploy_, run.resolver(self.store))
            plan = self.deployer.plan(
                run.record.team, deployment, version=version if isinstance(version, int) else None
            )
            how = self.deployer.apply(plan, created_by=run.record.user)
        except (ExprError, TensoryardError, OSError) as exc:
            self._set(run, step.name, "FAILED", f"cannot deploy {pinned}: {exc}")
            return False
        log.info("pipeline %d step %s: deployment %s %s", run.record.id, step.name, plan.name, how)
        return True

    def run_eval_step(self, run: PipelineRun, step: StepSpec) -> None:
        from tensoryard.serving.evaluate import load_eval_set

        spec = step.eval_
        assert spec is not None  # an eval step always has one (StepSpec checks it)
        deployer = self._serving(run, step)
        if deployer is None:
            return
        try:
            name = render_template(spec.deployment, run.resolver(self.store)).strip()
            cases = load_eval_set(Path(spec.dataset))
        except ExprError as exc:
            self._set(run, step.name, "FAILED", f"cannot resolve eval.deployment: {exc}")
            return
        except SpecError as exc:
            self._set(run, step.name, "FAILED", f"bad eval set: {exc}")
            return
        if not deployer.status(name).exists:
            self._set(
                run,
                step.name,
                "FAILED",
                f"eval.deployment: no deployment {name!r} (fix: deploy it first, e.g. in a "
                "`kind: deploy` step this one needs)",
            )
            return
        # intent first: a restart finds the step RUNNING and runs the (pure) eval again
        self._set(
            run,
            step.name,
            "RUNNING",
            f"evaluating {name} on {len(cases)} case(s) of {Path(spec.dataset).name}",
            outputs={"deployment": name, "dataset": spec.dataset, "cases": len(cases)},
        )
        self.watch_eval(run, step, cases)

    def watch_eval(
        self, run: PipelineRun, step: StepSpec, cases: list[EvalCase] | None = None
    ) -> None:
        from tensoryard.serving.evaluate import EvalResult, load_eval_set, run_eval

        spec = step.eval_
        assert spec is not None
        key = (run.record.id, step.name)
        outputs = dict(run.steps[step.name].outputs)
        name = str(outputs.get("deployment", ""))
        if run.record.cancel_requested:
            job = self._evals.pop(key, None)
            if job is not None:
                job[1].set()
            self._set(run, step.name, "CANCELLED", "the pipeline was cancelled")
            return
        deployer = self._serving(run, step)
        if deployer is None:
            return
        if key not in self._evals:  # first pass, or the eval of a process that stopped
            if cases is None:  # read again only when this process did not start the step
                try:
                    cases = load_eval_set(Path(spec.dataset))
                except SpecError as exc:
                    self._set(run, step.name, "FAILED", f"bad eval set: {exc}")
                    return
            if self._eval_pool is None:
                self._eval_pool = ThreadPoolExecutor(2, thread_name_prefix="tyard-eval")
            stop = threading.Event()
            manager = deployer.manager
            future = self._eval_pool.submit(
                run_eval,
                manager,
                name,
                cases,
                metric=spec.metric,
                max_tokens=spec.max_tokens,
                timeout_s=spec.timeout_s,
                cancelled=stop.is_set,
            )
            self._evals[key] = (future, stop)
        future, _ = self._evals[key]
        if not future.done():
            return
        del self._evals[key]
        try:
            result: EvalResult = future.result()
        except (TensoryardError, TimeoutError, OSError) as exc:
            self._set(run, step.name, "FAILED", f"eval of {name} failed: {exc}")
            return
        values = {
            **outputs,
            "score": round(result.score, 6),
            "correct": result.correct,
            "cases": result.cases,
            "failed_requests": result.failed_requests,
            "metric": spec.metric,
            "duration_s": round(result.duration_s, 3),
            "samples": result.samples,
        }
        summary = (
            f"{name}: {result.correct}/{result.cases} right ({spec.metric}), score "
            f"{result.score:.3f}"
            + (f", {result.failed_requests} request(s) failed" if result.failed_requests else "")
        )
        if spec.min_score is not None and result.score < spec.min_score:
            self._set(
                run,
                step.name,
                "FAILED",
                f"{summary}: below min_score {spec.min_score:g}",
                outputs=values,
            )
            return
        self._set(run, step.name, "SUCCEEDED", summary, outputs=values)

    def _serving(self, run: PipelineRun, step: StepSpec) -> Deployer | None:
        """This control plane's serving plane; None (and the step FAILED, saying so) without."""
        if self.deployer is None:
            self._set(run, step.name, "FAILED", "this control plane has no serving plane")
        return self.deployer


def _resolved_deployment(
    spec: DeploySpec, resolve: Callable[[tuple[str, ...]], Value]
) -> DeploymentSpec:
    """The step's deployment with ``${{ }}`` in its model and string options resolved."""
    options = {
        k: render_template(v, resolve) if isinstance(v, str) and "${{" in v else v
        for k, v in spec.options.items()
    }
    return spec.deployment(render_template(spec.model, resolve).strip(), options)


def _deploying(name: str, model: Any, version: Any, ready: int, replicas: int) -> str:
    return f"deploying {model} version {version} as {name}: {ready} of {replicas} replica(s) ready"


def _deploy_outcome(
    spec: DeploySpec,
    outputs: dict[str, Any],
    status: DeploymentStatus,
    waited_s: float,
    *,
    tail: Callable[[str, int], str],
) -> tuple[str, str]:
    """(state, reason) of a deploy step from its deployment's replica states: SUCCEEDED when
    every replica answers, FAILED on a crash loop, a deleted deployment or the timeout, else
    RUNNING with the progress."""
    name = str(outputs.get("deployment", ""))
    model, version = outputs.get("model"), outputs.get("version")
    if not status.exists:
        return "FAILED", f"deployment {name} was deleted while the step waited for it"
    if status.is_ready:
        return "SUCCEEDED", (
            f"deployment {name} ready: {status.ready} of {status.replicas} replica(s) answer "
            f"{model} version {version}; call it at {outputs.get('endpoint')} with model "
            f"{name!r}"
        )
    crashed = [(slot, n) for slot, n in status.failed if n >= spec.max_restarts]
    if crashed:
        slot, restarts = crashed[0]
        return "FAILED", (
            f"replica {slot} of deployment {name} exited {restarts + 1} time(s) while starting "
            f"(max_restarts {spec.max_restarts}); its log ends: {tail(name, slot)} (the "
            f"deployment is left running; `tyard deployments delete {name}` removes it)"
        )
    if waited_s > spec.ready_timeout_s:
        return "FAILED", (
            f"deployment {name} not ready after {waited_s:.0f} s (ready_timeout_s "
            f"{spec.ready_timeout_s:g}): {status.ready} of {status.replicas} replica(s) ready; "
            f"see `tyard deployments describe {name}`"
        )
    return "RUNNING", _deploying(name, model, version, status.ready, status.replicas)


def check_deploy_steps(spec: PipelineSpec, *, kubernetes: bool = True) -> None:
    """Check every deploy step like the deployments API checks a request (engine, options,
    model reference), as far as it is known before the pipeline runs: values with ``${{ }}``
    are checked when the step runs. SpecError with ``steps.N.deploy.FIELD`` paths. Eval
    steps' eval sets are read and checked too (``steps.N.eval.dataset``)."""
    from tensoryard.serving.deploy import check_engine
    from tensoryard.serving.evaluate import load_eval_set
    from tensoryard.serving.source import parse_model_source

    issues: list[FieldIssue] = []
    for i, step in enumerate(spec.steps):
        if step.eval_ is not None:  # the eval set must be there and well formed at submission
            try:
                load_eval_set(Path(step.eval_.dataset), field_name=f"steps.{i}.eval.dataset")
            except SpecError as exc:
                issues += exc.issues
        body = step.deploy_
        if body is None:
            continue
        where = f"steps.{i}.deploy"
        known = {k: v for k, v in body.options.items() if not (isinstance(v, str) and "${{" in v)}
        try:
            check_engine(body.engine, known, kubernetes=kubernetes)
        except SpecError as exc:
            issues += [FieldIssue(f"{where}.{x.path}", x.message, x.fix) for x in exc.issues]
        if "${{" in body.model:
            continue
        try:
            source = parse_model_source(body.model)
        except SpecError as exc:
            issues += [FieldIssue(f"{where}.{x.path}", x.message, x.fix) for x in exc.issues]
            continue
        if source.path is not None:
            issues.append(
                FieldIssue(
                    f"{where}.model",
                    f"{body.model!r} is a file; a deploy step serves a registered model",
                    "register it first and give MODEL[:VERSION|@ALIAS]",
                )
            )
    if issues:
        raise SpecError(issues, source="pipeline")
