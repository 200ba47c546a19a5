"""One pipeline during one advancer pass, and the values its steps produce: the resolver of
``${{ }}`` expressions (params, earlier steps' outputs, model metrics) and a finished job's
outputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensoryard.errors import (
    NotFound,
    SpecError,
)
from tensoryard.pipelines.outputs import read_outputs_file
from tensoryard.spec.expr import ExprError, Value
from tensoryard.spec.pipeline import PipelineSpec
from tensoryard.store import JobRecord, PipelineRecord, StepRecord, Store

if TYPE_CHECKING:
    pass

__all__ = ["DONE_OK", "PipelineRun", "collect_outputs", "utc"]

DONE_OK = frozenset({"SUCCEEDED", "CACHED"})


@dataclass
class PipelineRun:
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


def utc(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def number_or_text(text: str) -> float | int | str:
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() and "." not in text else number


def value_text(resolve: Callable[[tuple[str, ...]], Value], parts: tuple[str, ...]) -> str:
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
