"""Restarting a job from a chosen checkpoint: a new job whose first attempt resumes from a
checkpoint of another job.

The runtime resumes from the newest complete ``step-N`` directory in its checkpoint directory
(runtime/checkpoint.py), so the new job is handed the chosen one as the only checkpoint in its
own, fresh checkpoint directory. Order (nothing is stored on bad input): check the step against
the store (unknown, or removed by retention: a SpecError naming ``checkpoint_step``), stage a
copy beside the run directories (hard links where the filesystem allows: no bytes copied, and the
old job's retention can delete its own directory without touching the copy), store the job,
move the staged directory into the new job's checkpoint directory with one rename, and only then
wake the scheduler. The copy is verified to hold only plain files and a ``meta.json`` first.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from tensoryard.errors import FieldIssue, SpecError
from tensoryard.registry.pruning import job_checkpoint_root
from tensoryard.runtime.megatron import recognise
from tensoryard.spec.job import JobSpec
from tensoryard.store import CheckpointRecord, JobRecord, Store

__all__ = ["Staged", "chosen_checkpoint", "place", "stage"]

FIELD = "checkpoint_step"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def _refuse(message: str, fix: str) -> SpecError:
    return SpecError([FieldIssue(FIELD, message, fix)], source="request")


def _steps(records: list[CheckpointRecord]) -> str:
    return ", ".join(str(c.step) for c in records) or "none"


def chosen_checkpoint(store: Store, job: JobRecord, spec: JobSpec, step: int) -> Path:
    """The directory of `job`'s checkpoint at `step`, or a SpecError naming the field and the
    steps one may choose instead."""
    if recognise(spec.command, spec.framework) is not None:
        raise _refuse(
            f"job {job.id} is a Megatron job, which resumes from its own --load directory",
            "resubmit without checkpoint_step and point the command's --load at the checkpoint",
        )
    kept = store.list_checkpoints(job.id)
    record = next((c for c in kept if c.step == step), None)
    if record is None:
        removed = {r.step for r in store.checkpoint_removals(job.id)}
        if step in removed:
            raise _refuse(
                f"the checkpoint of step {step} of job {job.id} was removed by its retention "
                "policy (checkpoint.keep)",
                f"choose one of the steps it keeps: {_steps(kept)}",
            )
        raise _refuse(
            f"job {job.id} has no checkpoint at step {step}",
            f"choose one of its checkpoints' steps: {_steps(kept)}",
        )
    path = Path(record.path)
    if path.is_symlink() or not _STEP_DIR.match(path.name) or not (path / "meta.json").is_file():
        raise _refuse(
            f"the checkpoint of step {step} of job {job.id} is not a complete tensoryard "
            f"checkpoint directory at {path} (its files are gone, or another tool wrote it)",
            f"choose another of its steps: {_steps([c for c in kept if c.step != step])}",
        )
    return path


class Staged:
    """A staged copy of a checkpoint directory, to be placed into the new job's directory or
    discarded."""

    def __init__(self, root: Path, step_dir: Path) -> None:
        self.root = root
        self.step_dir = step_dir

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed: copy the bytes
        shutil.copy2(src, dst)


def stage(source: Path, runs_dir: Path, step: int) -> Staged:
    """Copy `source` (a ``step-N`` directory) beside the run directories; refuse a directory
    holding anything but plain files and directories (a link could point anywhere)."""
    for where, dirs, files in os.walk(source):
        for name in [*dirs, *files]:
            entry = Path(where) / name
            if entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
                raise _refuse(
                    f"the checkpoint of step {step} holds {entry.name}, which is not a plain file",
                    "choose a checkpoint written by the tensoryard runtime",
                )
    root = runs_dir / f".restart-{uuid.uuid4().hex}"
    root.mkdir(parents=True)
    target = root / source.name
    try:
        shutil.copytree(source, target, copy_function=_link_or_copy)
    except (OSError, shutil.Error) as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise _refuse(
            f"could not copy the checkpoint of step {step} ({exc}); retention may have "
            "removed it just now",
            "reload its checkpoints and choose again",
        ) from None
    return Staged(root, target)


def place(staged: Staged, job: JobRecord, spec: JobSpec) -> Path:
    """Move the staged checkpoint into `job`'s checkpoint directory (one rename on the same
    filesystem); return where it now is."""
    root = job_checkpoint_root(job.run_dir, spec)
    root.mkdir(parents=True, exist_ok=True)
    final = root / staged.step_dir.name
    os.replace(staged.step_dir, final)
    staged.discard()
    return final
