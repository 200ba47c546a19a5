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
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tensoryard.errors import (
    Conflict,
    NotFound,
    SpecError,
    StoreError,
)
from tensoryard.registry.service import ModelRegistry
from tensoryard.server.pipeline_run import (
    DONE_OK,
    PipelineRun,
    collect_outputs,
    number_or_text,
    value_text,
)
from tensoryard.server.pipeline_serving import ServingSteps, check_deploy_steps
from tensoryard.spec.expr import ExprError, render_template
from tensoryard.spec.pipeline import PipelineSpec, StepSpec, chain_hash, resolve_job
from tensoryard.spec.states import TERMINAL_STATES, JobState
from tensoryard.store import PipelineRecord, StepRecord, Store
from tensoryard.store.records import STEP_TERMINAL

if TYPE_CHECKING:
    from tensoryard.serving.deploy import Deployer

__all__ = ["PipelineAdvancer", "check_deploy_steps", "collect_outputs"]

log = logging.getLogger("tensoryard.pipelines")


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
        self.clock = clock
        self._specs: dict[int, PipelineSpec] = {}
        self.serving = ServingSteps(store, deployer=deployer, clock=clock, set_step=self._set)

    @property
    def deployer(self) -> Deployer | None:
        """The serving plane deploy and eval steps go through (None: they fail, saying so)."""
        return self.serving.deployer

    @deployer.setter
    def deployer(self, deployer: Deployer | None) -> None:
        self.serving.deployer = deployer

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
        run = PipelineRun(record, spec, {s.name: s for s in record.steps})
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
    def _watch(self, run: PipelineRun, step: StepSpec) -> None:
        if step.kind == "deploy":
            self.serving.watch_deploy(run, step)
            return
        if step.kind == "eval":
            self.serving.watch_eval(run, step)
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
    def _start_if_ready(self, run: PipelineRun, step: StepSpec) -> None:
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
                values = ", ".join(f"{r} = {value_text(resolve, r.parts)}" for r in condition.refs)
                detail = f" ({values})" if values else ""
                self._set(run, step.name, "SKIPPED", f"`if: {condition.text}` is false{detail}")
                return
        _STEP_RUNNERS[step.kind](self, run, step)

    def _run_job_step(self, run: PipelineRun, step: StepSpec) -> None:
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

    def _run_register_step(self, run: PipelineRun, step: StepSpec) -> None:
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
                k: number_or_text(render_template(v, resolve)) for k, v in spec.metrics.items()
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

    def _cache_hit(self, run: PipelineRun, step: StepSpec, digest: str) -> StepRecord | None:
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
    def _finish(self, run: PipelineRun) -> None:
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

    def _set(
        self,
        run: PipelineRun,
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


_STEP_RUNNERS: dict[str, Callable[[PipelineAdvancer, PipelineRun, StepSpec], None]] = {
    "job": PipelineAdvancer._run_job_step,
    "register": PipelineAdvancer._run_register_step,
    "deploy": lambda a, run, step: a.serving.run_deploy_step(run, step),
    "eval": lambda a, run, step: a.serving.run_eval_step(run, step),
}
"""Step kind -> how a ready step runs. A `register` kind (model registry) plugs in here."""


REGISTER_TAG = "pipeline-step"
"""Tag on versions a register step made: ``PIPELINE/STEP`` (finds them again after a crash)."""
