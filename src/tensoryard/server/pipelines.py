"""The pipeline advancer: one pass over every RUNNING pipeline, called by the control loop.

It holds no state between passes: everything it needs is in the pipeline and step rows, so a
restarted control plane (or a new leader) carries on where the last one stopped. Each change
is one compare-and-set transaction on a step (``Store.submit_step`` inserts the step's job in
the same transaction that moves the step to RUNNING), so a pass repeated after a crash, or
run twice by mistake, never submits a step twice. Per pipeline, in step order:

1. a RUNNING step whose job ended: SUCCEEDED with its outputs, WAITING again for a retry, or
   FAILED / CANCELLED (a cancel request is passed on to running jobs first);
2. on a cancel request, WAITING steps are CANCELLED;
3. a WAITING step whose needs all ended: CANCELLED when a need failed, SKIPPED when a need was
   skipped or its `if` is false, CACHED when an earlier step of the team had the same input
   hash (outputs reused, reason shown), else its job is submitted;
4. when every step ended, the pipeline ends: CANCELLED on request, FAILED when a step failed or
   was cancelled, else SUCCEEDED.

Step kinds plug in at `_STEP_RUNNERS`: ``job`` submits a job; ``register`` promotes the
newest checkpoint of an earlier step's job to a model version (`ModelRegistry`), tagged
``pipeline-step=PIPELINE/STEP`` so a pass repeated after a crash finds the version it made
instead of registering a second one. Expressions may read a model's metrics:
``models.MODEL.ALIAS.metrics.KEY`` (null when there is no such model, version or metric).

``deploy`` serves a registered version through the serving plane (`Deployer`). Intent first:
the step moves to RUNNING with the resolved version in its outputs, then the deployment is
created or updated; while RUNNING, each advancer process applies it once more (idempotent:
a deployment that already serves that version is left alone, names are unique, so a pass
repeated after a crash never makes a second deployment) and the step ends when every replica
answers (SUCCEEDED), when a replica exited more than ``max_restarts`` times (FAILED with the
end of its log) or after ``ready_timeout_s`` (FAILED).

``eval`` generates each case of a JSONL eval set through a deployment and scores it
(`tensoryard.serving.evaluate`). The eval set is checked before the step moves to RUNNING; the
generation runs on a worker thread of this process, and each pass looks whether it finished.
Evaluation writes nothing but the step's outputs, so a control plane that restarts mid-eval
(or a new leader) simply runs it again from the start.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tensoryard.errors import (
    Conflict,
    FieldIssue,
    NotFound,
    SpecError,
    StoreError,
    TensoryardError,
)
from tensoryard.pipelines.outputs import read_outputs_file
from tensoryard.registry.service import ModelRegistry
from tensoryard.spec.deployment import DeploymentSpec
from tensoryard.spec.expr import ExprError, Value, render_template
from tensoryard.spec.pipeline import DeploySpec, PipelineSpec, StepSpec, chain_hash, resolve_job
from tensoryard.spec.states import TERMINAL_STATES, JobState
from tensoryard.store import JobRecord, PipelineRecord, StepRecord, Store
from tensoryard.store.records import STEP_TERMINAL

if TYPE_CHECKING:
    from tensoryard.serving.deploy import Deployer, DeploymentStatus
    from tensoryard.serving.evaluate import EvalCase

__all__ = ["PipelineAdvancer", "check_deploy_steps", "collect_outputs"]

log = logging.getLogger("tensoryard.pipelines")

DONE_OK = frozenset({"SUCCEEDED", "CACHED"})


@dataclass
class _Run:
    """One pipeline during one pass: its spec and the freshest record of each step."""

    record: PipelineRecord
    spec: PipelineSpec
    steps: dict[str, StepRecord]

    def resolver(self, store: Store | None = None) -> Callable[[tuple[str, ...]], Value]:
        def resolve(parts: tuple[str, ...]) -> Value:
            if parts[0] == "models" and len(parts) == 5 and store is not None:
                try:
                    version = store.get_version(self.record.team, parts[1], parts[2])
                except (NotFound, SpecError):
                    return None
                metric = version.metrics.get(parts[4])
                return metric if isinstance(metric, str | int | float | bool) else None
            if parts[0] == "params" and len(parts) == 2:
                if parts[1] not in self.record.params:
                    raise ExprError(f"params.{parts[1]} is not set")
                value = self.record.params[parts[1]]
                return value if isinstance(value, str | int | float | bool) else None
            if parts[0] == "steps" and len(parts) == 4 and parts[2] == "outputs":
                step = self.steps.get(parts[1])
                if step is None or step.state not in DONE_OK:
                    raise ExprError(f"steps.{parts[1]} has not succeeded")
                if parts[3] not in step.outputs:
                    known = ", ".join(sorted(step.outputs)) or "none"
                    raise ExprError(
                        f"step {parts[1]} has no output {parts[3]!r} (its outputs: {known})"
                    )
                value = step.outputs[parts[3]]
                return value if isinstance(value, str | int | float | bool) else None
            raise ExprError(f"unknown name {'.'.join(parts)!r}")

        return resolve


class PipelineAdvancer:
    """Moves pipelines forward; `advance()` is one pass (idempotent, safe to repeat)."""

    def __init__(
        self,
        store: Store,
        *,
        runs_dir: Path,
        registry: ModelRegistry | None = None,
        deployer: Deployer | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.runs_dir = runs_dir
        self.registry = registry
        self.deployer = deployer
        self.clock = clock
        self._specs: dict[int, PipelineSpec] = {}
        self._applied: set[tuple[int, str]] = set()  # deploy steps applied by this process
        self._evals: dict[tuple[int, str], tuple[Future[Any], threading.Event]] = {}
        self._eval_pool: ThreadPoolExecutor | None = None

    def advance(self) -> int:
        """One pass over every RUNNING pipeline; returns how many changes it made."""
        changes = 0
        for record in self.store.running_pipelines():
            try:
                changes += self._advance_one(record)
            except Conflict as exc:  # another advancer moved first: the next pass re-reads
                log.info("pipeline %d: %s", record.id, exc)
            except Exception:  # one bad pipeline must not stop the others, nor the jobs
                log.exception("pipeline %d could not be advanced", record.id)
        return changes

    def _spec(self, record: PipelineRecord) -> PipelineSpec:
        spec = self._specs.get(record.id)
        if spec is None:
            spec = PipelineSpec.model_validate(record.spec)
            self._specs[record.id] = spec
        return spec

    def _advance_one(self, record: PipelineRecord) -> int:
        try:
            spec = self._spec(record)
        except ValidationError as exc:
            self.store.finish_pipeline(record.id, "FAILED", f"stored spec is invalid: {exc}")
            return 1
        run = _Run(record, spec, {s.name: s for s in record.steps})
        before = dict(run.steps)
        for name in spec.order():
            step = spec.step(name)
            # 1. a running step's job
            if run.steps[name].state == "RUNNING":
                self._watch(run, step)
            # 2. cancel what has not started
            if record.cancel_requested and run.steps[name].state == "WAITING":
                self._set(run, name, "CANCELLED", "the pipeline was cancelled before it ran")
            # 3. start what is ready
            if run.steps[name].state == "WAITING":
                self._start_if_ready(run, step)
        changes = sum(1 for n, s in run.steps.items() if s != before[n])
        # 4. end the pipeline when every step ended
        if all(s.state in STEP_TERMINAL for s in run.steps.values()):
            self._finish(run)
            changes += 1
        return changes

    # 1 ------------------------------------------------------------------------------------
    def _watch(self, run: _Run, step: StepSpec) -> None:
        if step.kind == "deploy":
            self._watch_deploy(run, step)
            return
        if step.kind == "eval":
            self._watch_eval(run, step)
            return
        current = run.steps[step.name]
        if current.job_id is None:  # the job row was deleted under us
            self._set(run, step.name, "FAILED", "its job no longer exists", expected="RUNNING")
            return
        job = self.store.get_job(current.job_id)
        if job.state not in TERMINAL_STATES:
            if run.record.cancel_requested and not job.cancel_requested:
                self.store.request_cancel(job.id)
            return
        if job.state is JobState.SUCCEEDED:
            try:
                outputs = collect_outputs(self.store, job)
            except SpecError as exc:
                self._set(run, step.name, "FAILED", f"job {job.id} succeeded but {exc}")
                return
            self._set(
                run,
                step.name,
                "SUCCEEDED",
                f"job {job.id} succeeded",
                outputs=outputs,
            )
            return
        if job.state is JobState.FAILED:
            if current.tries <= step.retries and not run.record.cancel_requested:
                self._set(
                    run,
                    step.name,
                    "WAITING",
                    f"try {current.tries} (job {job.id}) failed: {job.reason}; retrying "
                    f"({current.tries} of {step.retries} retries used)",
                )
                return
            tries = f" after {current.tries} tries" if current.tries > 1 else ""
            self._set(run, step.name, "FAILED", f"job {job.id} failed{tries}: {job.reason}")
            return
        why = "the pipeline was cancelled" if run.record.cancel_requested else job.reason
        self._set(run, step.name, "CANCELLED", f"job {job.id} was cancelled: {why}")

    # 3 ------------------------------------------------------------------------------------
    def _start_if_ready(self, run: _Run, step: StepSpec) -> None:
        needs = run.spec.dependencies()[step.name]
        states = {n: run.steps[n].state for n in needs}
        broken = [n for n, s in states.items() if s in ("FAILED", "CANCELLED")]
        if broken:
            self._set(run, step.name, "CANCELLED", f"not run: {broken[0]} {states[broken[0]]}")
            return
        skipped = [n for n, s in states.items() if s == "SKIPPED"]
        if skipped:
            self._set(run, step.name, "SKIPPED", f"{skipped[0]} was skipped")
            return
        if any(s not in DONE_OK for s in states.values()):
            return  # still waiting
        resolve = run.resolver(self.store)
        condition = step.condition()
        if condition is not None:
            try:
                holds = condition.evaluate(resolve)
            except ExprError as exc:
                self._set(
                    run, step.name, "FAILED", f"cannot evaluate `if: {condition.text}`: {exc}"
                )
                return
            if not holds:
                values = ", ".join(f"{r} = {_value(resolve, r.parts)}" for r in condition.refs)
                detail = f" ({values})" if values else ""
                self._set(run, step.name, "SKIPPED", f"`if: {condition.text}` is false{detail}")
                return
        _STEP_RUNNERS[step.kind](self, run, step)

    def _run_job_step(self, run: _Run, step: StepSpec) -> None:
        current = run.steps[step.name]
        source = f"pipeline {run.record.id} step {step.name}"
        try:
            job, own = resolve_job(run.spec, step, run.resolver(self.store), source=source)
        except (ExprError, SpecError) as exc:
            self._set(run, step.name, "FAILED", f"cannot build its job: {exc}")
            return
        # The needs' hashes are part of a step's inputs: a step after a recomputed step is
        # recomputed too, even when it reads its files without a ${{ }} reference.
        needs = run.spec.dependencies()[step.name]
        digest = chain_hash(own, [run.steps[n].input_hash for n in sorted(needs)])
        if step.cache and current.tries == 0:
            hit = self._cache_hit(run, step, digest)
            if hit is not None:
                return
        reason = f"submitted try {current.tries + 1}" if current.tries else "submitted"
        run.steps[step.name] = self.store.submit_step(
            run.record.id,
            step.name,
            expected_tries=current.tries,
            job=job,
            input_hash=digest,
            run_dir_root=self.runs_dir,
            reason=reason,
        )

    def _run_register_step(self, run: _Run, step: StepSpec) -> None:
        spec = step.register_
        assert spec is not None  # a register step always has one (StepSpec checks it)
        if self.registry is None:
            self._set(run, step.name, "FAILED", "this control plane has no model registry")
            return
        source = run.steps[spec.from_step]
        if source.job_id is None:
            self._set(run, step.name, "FAILED", f"step {spec.from_step} ran no job to register")
            return
        resolve = run.resolver(self.store)
        try:
            metrics = {
                k: _number_or_text(render_template(v, resolve)) for k, v in spec.metrics.items()
            }
            tags = {k: render_template(v, resolve) for k, v in spec.tags.items()}
        except ExprError as exc:
            self._set(run, step.name, "FAILED", f"cannot resolve register: {exc}")
            return
        marker = f"{run.record.id}/{step.name}"
        team = run.record.team
        earlier = [
            v
            for v in self.store.find_versions(teams=[team], tag=(REGISTER_TAG, marker))
            if v.model == spec.model
        ]
        try:
            if earlier:  # registered before a crash: do not register twice
                version = earlier[0]
            else:
                version = self.registry.register_checkpoint(
                    team,
                    spec.model,
                    source.job_id,
                    created_by=run.record.user,
                    metrics=metrics,
                    tags={**tags, REGISTER_TAG: marker},
                    aliases=list(spec.aliases),
                    description=spec.description
                    or f"registered by pipeline {run.record.id} step {step.name}",
                )
        except (NotFound, SpecError, Conflict, StoreError) as exc:
            self._set(run, step.name, "FAILED", f"cannot register {spec.model}: {exc}")
            return
        aliases = f" as {', '.join(spec.aliases)}" if spec.aliases else ""
        self._set(
            run,
            step.name,
            "SUCCEEDED",
            f"registered {team}/{spec.model} version {version.version}{aliases} from job "
            f"{source.job_id}",
            outputs={
                "model": spec.model,
                "version": version.version,
                "artifact": version.artifact,
                "job_id": source.job_id,
            },
        )

    def _run_deploy_step(self, run: _Run, step: StepSpec) -> None:
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
        self._watch_deploy(run, step)

    def _watch_deploy(self, run: _Run, step: StepSpec) -> None:
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
        waited = (self.clock() - _utc(started)).total_seconds() if started else 0.0
        state, reason = _deploy_outcome(
            spec, outputs, status, waited, tail=deployer.replica_log_tail
        )
        if state != "RUNNING":
            self._applied.discard(key)
        if state != "RUNNING" or reason != current.reason:
            extra = {"ready_replicas": status.ready} if state == "SUCCEEDED" else {}
            self._set(run, step.name, state, reason, outputs={**outputs, **extra})

    def _apply_deploy(self, run: _Run, step: StepSpec) -> bool:
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

    def _cache_hit(self, run: _Run, step: StepSpec, digest: str) -> StepRecord | None:
        found = self.store.find_cached_step(run.record.team, digest)
        if found is None:
            return None
        checkpoint = found.outputs.get("checkpoint")
        if isinstance(checkpoint, str) and checkpoint and not Path(checkpoint).exists():
            return None  # its checkpoint is gone: run it again
        origin = f"{found.pipeline_id}/{found.name}"
        return self._set(
            run,
            step.name,
            "CACHED",
            f"inputs unchanged (hash {digest[:12]}): reusing the outputs of pipeline "
            f"{found.pipeline_id} step {found.name} (job {found.job_id})",
            outputs=found.outputs,
            input_hash=digest,
            cached_from=origin,
        )

    # 4 ------------------------------------------------------------------------------------
    def _finish(self, run: _Run) -> None:
        states = {n: s.state for n, s in run.steps.items()}
        bad = [n for n, s in states.items() if s in ("FAILED", "CANCELLED")]
        if run.record.cancel_requested:
            state, reason = "CANCELLED", "cancelled by request"
        elif bad:
            state = "FAILED"
            reason = f"step {bad[0]} {states[bad[0]]}: {run.steps[bad[0]].reason}"
        else:
            done = sum(1 for s in states.values() if s in DONE_OK)
            reason = f"{done} step(s) done, {len(states) - done} skipped"
            state = "SUCCEEDED"
        self.store.finish_pipeline(run.record.id, state, reason)
        self._specs.pop(run.record.id, None)

    # eval steps -----------------------------------------------------------------------------
    def _run_eval_step(self, run: _Run, step: StepSpec) -> None:
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
        self._watch_eval(run, step, cases)

    def _watch_eval(self, run: _Run, step: StepSpec, cases: list[EvalCase] | None = None) -> None:
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

    def _serving(self, run: _Run, step: StepSpec) -> Deployer | None:
        """This control plane's serving plane; None (and the step FAILED, saying so) without."""
        if self.deployer is None:
            self._set(run, step.name, "FAILED", "this control plane has no serving plane")
        return self.deployer

    def _set(
        self,
        run: _Run,
        name: str,
        state: str,
        reason: str,
        *,
        expected: str | None = None,
        **fields: Any,
    ) -> StepRecord:
        current = run.steps[name]
        record = self.store.set_step(
            run.record.id,
            name,
            expected=[expected or current.state],
            state=state,
            reason=reason,
            **fields,
        )
        run.steps[name] = record
        return record


_STEP_RUNNERS: dict[str, Callable[[PipelineAdvancer, _Run, StepSpec], None]] = {
    "job": PipelineAdvancer._run_job_step,
    "register": PipelineAdvancer._run_register_step,
    "deploy": PipelineAdvancer._run_deploy_step,
    "eval": PipelineAdvancer._run_eval_step,
}
"""Step kind -> how a ready step runs. A `register` kind (model registry) plugs in here."""


REGISTER_TAG = "pipeline-step"
"""Tag on versions a register step made: ``PIPELINE/STEP`` (finds them again after a crash)."""


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


def _utc(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _number_or_text(text: str) -> float | int | str:
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() and "." not in text else number


def _value(resolve: Callable[[tuple[str, ...]], Value], parts: tuple[str, ...]) -> str:
    try:
        return repr(resolve(parts))
    except ExprError:
        return "?"


def collect_outputs(store: Store, job: JobRecord) -> dict[str, Any]:
    """A finished job's outputs (see `tensoryard.pipelines.outputs`); SpecError when its
    outputs file is invalid."""
    outputs: dict[str, Any] = {"job_id": job.id, "run_dir": job.run_dir}
    checkpoint = store.latest_checkpoint(job.id)
    if checkpoint is not None:
        outputs["checkpoint"] = checkpoint.path
    if job.attempts:
        rows = store.list_metrics(job.id, attempt=job.attempts)
        for row in rows:
            outputs.update({k: v for k, v in row.values.items()})
        if rows:
            outputs["step"] = rows[-1].step
    if job.run_dir:
        outputs.update(read_outputs_file(Path(job.run_dir)))
    return outputs
