"""Applying a job's checkpoint retention: the control plane's side of ``checkpoint.keep*``.

Order (the crash-safety rule): plan (pure, `plan_retention`), then one transaction that deletes
the dropped checkpoints' rows, records a removal intent for each and appends the job event, then
the directories are deleted, then each intent is marked done. A crash after the transaction
leaves intents without ``removed_at``; `finish_pending` (called when the control loop starts)
deletes those directories. Deleting a directory that is already gone is a no-op, so every step
can be repeated.

Only a directory named ``step-<N>`` (the runtime's) or ``iter_<N>`` (Megatron's) directly
inside the job's checkpoint directory is ever deleted: a path a job reported elsewhere loses its
row but keeps its files (the event says so).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tensoryard.registry.paths import JobPaths
from tensoryard.registry.retention import RetentionPlan, RetentionPolicy, plan_retention
from tensoryard.spec.job import CheckpointSpec, JobSpec
from tensoryard.store import CheckpointRemovalRecord, JobRecord, Retirement, Store

__all__ = [
    "CheckpointPruner",
    "PruneResult",
    "checkpoint_root",
    "describe_policy",
    "job_checkpoint_root",
    "policy_of_spec",
]

log = logging.getLogger("tensoryard.retention")

_STEP_DIR = re.compile(r"^(step-[0-9]+|iter_[0-9]{7,})$")
_SHOWN_KEPT = 12  # kept checkpoints named in an event (keep_every can keep hundreds)


def policy_of_spec(checkpoint: CheckpointSpec) -> RetentionPolicy:
    """The retention policy a job's ``checkpoint`` section asks for (keep last ``keep``)."""
    best = checkpoint.keep_best
    return RetentionPolicy(
        keep_last=checkpoint.keep,
        keep_best=best.count if best else None,
        metric=best.metric if best else None,
        mode=best.mode if best else "min",
        keep_every=checkpoint.keep_every,
    )


def checkpoint_root(run_dir: str | Path, configured: str | None) -> Path:
    """Where a job's checkpoints go: ``checkpoint.dir``, else ``<run dir>/checkpoints``."""
    return Path(configured) if configured else Path(run_dir) / "checkpoints"


def job_checkpoint_root(run_dir: str | Path, spec: JobSpec) -> Path:
    """Where this job's checkpoints go: a Megatron job's save directory (its command's
    ``--save``, relative to its working directory), else `checkpoint_root`."""
    from tensoryard.runtime.megatron import recognise, save_dir_of

    default = checkpoint_root(run_dir, spec.checkpoint.dir)
    args = recognise(spec.command, spec.framework)
    if args is None:
        return default
    cwd = Path(spec.workdir) if spec.workdir else Path(run_dir)
    return save_dir_of(args, cwd=cwd, default=default)


def job_paths(job: JobRecord, protected: Sequence[Path] = ()) -> JobPaths:
    """The trust boundary of `job`'s files (registry/paths.py): its run directory and its
    checkpoint root, never the control plane's `protected` state directory."""
    checkpoint = CheckpointSpec.model_validate(job.spec.get("checkpoint") or {})
    try:
        root = job_checkpoint_root(job.run_dir, JobSpec.model_validate(job.spec))
    except ValueError:  # a spec stored by an older version: its checkpoint section counts
        root = checkpoint_root(job.run_dir, checkpoint.dir)
    roots = tuple(dict.fromkeys((Path(job.run_dir), Path(root))))
    return JobPaths(job.id, Path(job.run_dir), roots, tuple(protected))


def describe_policy(policy: RetentionPolicy) -> str:
    """``last 3, best 1 by eval_loss (min), every 1000``: the policy in words."""
    parts = []
    if policy.keep_last is not None:
        parts.append(f"last {policy.keep_last}")
    if policy.keep_best is not None:
        parts.append(f"best {policy.keep_best} by {policy.metric} ({policy.mode})")
    if policy.keep_every is not None:
        parts.append(f"every {policy.keep_every}")
    return ", ".join(parts) or "everything"


@dataclass(frozen=True)
class PruneResult:
    plan: RetentionPlan
    removed: tuple[CheckpointRemovalRecord, ...]
    """The checkpoints this call retired (a concurrent call may have retired the others)."""
    message: str
    """The job event written, or an empty string when nothing was removed."""


class CheckpointPruner:
    """Applies retention policies to jobs' checkpoints in the store and on disk."""

    def __init__(self, store: Store, *, after_rows: Callable[[], None] = lambda: None) -> None:
        """``after_rows`` runs between the transaction and the directory deletions (the
        control plane's crash point for fault-injection tests)."""
        self.store = store
        self.after_rows = after_rows

    def apply(
        self,
        job_id: int,
        policy: RetentionPolicy,
        *,
        root: Path | None = None,
        dry_run: bool = False,
    ) -> PruneResult:
        """Retire what ``policy`` does not keep; only directories inside ``root`` are deleted
        (None: any reported path; for trusted callers of the Python API)."""
        plan = self._plan(job_id, policy)
        if dry_run or not plan.delete:
            return PruneResult(plan, (), "")
        kept_paths = {c.path for c in plan.keep}
        retire = [
            Retirement(c.step, c.path, _deletable(c.path, root) and c.path not in kept_paths)
            for c in plan.delete
        ]
        message = _message(plan, retire, policy)
        removed = self.store.retire_checkpoints(job_id, retire, message=message)
        if removed:
            self.after_rows()
        self._remove(removed)
        return PruneResult(plan, tuple(removed), message if removed else "")

    def apply_to_job(self, job: JobRecord) -> PruneResult:
        """Apply the job's own ``checkpoint`` policy (the control plane, on each report)."""
        checkpoint = CheckpointSpec.model_validate(job.spec.get("checkpoint") or {})
        try:
            root = job_checkpoint_root(job.run_dir, JobSpec.model_validate(job.spec))
        except ValueError:  # a spec stored by an older version: its checkpoint section counts
            root = checkpoint_root(job.run_dir, checkpoint.dir)
        return self.apply(job.id, policy_of_spec(checkpoint), root=root)

    def finish_pending(self, job_id: int | None = None) -> int:
        """Delete the directories of removals a crash interrupted; returns how many."""
        pending = self.store.pending_checkpoint_removals(job_id)
        self._remove(pending)
        return len(pending)

    def _plan(self, job_id: int, policy: RetentionPolicy) -> RetentionPlan:
        checkpoints = self.store.list_checkpoints(job_id)
        metrics: dict[int, dict[str, float]] = {}
        if policy.keep_best is not None and checkpoints:  # only the checkpoint steps' rows
            metrics = self.store.metrics_at_steps(job_id, [c.step for c in checkpoints])
        pinned = {
            v.checkpoint_step
            for v in self.store.find_versions(job_id=job_id)
            if v.checkpoint_step is not None
        }
        return plan_retention(checkpoints, metrics, policy, pinned=pinned)

    def _remove(self, removals: list[CheckpointRemovalRecord]) -> None:
        done = []
        for removal in removals:
            if not removal.delete_files:
                continue
            path = Path(removal.path)
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
            except OSError as exc:  # stays pending: the next finish_pending retries it
                log.warning("retention: cannot delete %s yet: %s", path, exc)
                continue
            done.append(removal.id)
        self.store.finish_checkpoint_removals(done)


def _deletable(path: str, root: Path | None) -> bool:
    if root is None:
        return True
    candidate = Path(path)
    if not candidate.is_absolute() or not _STEP_DIR.match(candidate.name):
        return False
    try:
        return candidate.parent.resolve() == root.resolve()
    except OSError:
        return False


def _message(plan: RetentionPlan, retire: list[Retirement], policy: RetentionPolicy) -> str:
    """``retention: deleted step 200, 300 (policy: last 3, best 1 by eval_loss (min)); kept
    step 100 (best 1 by eval_loss), 400 (newest, last 3)``."""
    deleted = ", ".join(str(r.step) for r in retire)
    shown = plan.keep[-_SHOWN_KEPT:]
    kept = "; ".join(f"{c.step} ({', '.join(plan.reasons[c.step])})" for c in shown)
    if len(plan.keep) > len(shown):
        kept = f"{len(plan.keep) - len(shown)} older and {kept}"
    text = f"retention: deleted step {deleted} (policy: {describe_policy(policy)}); kept {kept}"
    left = [r for r in retire if not r.delete_files]
    if left:
        names = ", ".join(r.path for r in left)
        text += (
            f"; left on disk (not a step-N directory inside the job's checkpoint directory): "
            f"{names}"
        )
    return text
