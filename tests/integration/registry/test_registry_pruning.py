"""Checkpoint retention applied to a job's rows and directories (SQLite and PostgreSQL): the
job's spec policy, the event it writes, paths it refuses to delete, idempotence, and a crash
between the rows and the directories finished by `finish_pending`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tensoryard.registry.pruning import CheckpointPruner, checkpoint_root, policy_of_spec
from tensoryard.registry.retention import RetentionPolicy
from tensoryard.spec.job import JobSpec
from tensoryard.store import JobRecord, Retirement, Store

LOSSES = {100: 3.0, 200: 1.0, 300: 2.0, 400: 2.5, 500: 2.6}


def _job(store: Store, runs: Path, **checkpoint: object) -> JobRecord:
    store.ensure_team("nlp")
    spec = JobSpec.model_validate(
        {"name": "pretrain", "team": "nlp", "command": ["train.py"], "checkpoint": checkpoint}
    )
    return store.create_job(spec, run_dir_root=runs)


def _report(store: Store, job: JobRecord, step: int, loss: float, root: Path | None = None) -> Path:
    """What the report route stores: the eval metric at the step, then the checkpoint."""
    path = (root or checkpoint_root(job.run_dir, None)) / f"step-{step:09d}"
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(b"x" * 1000)
    store.add_metrics(job.id, 1, [{"step": step, "ts": time.time(), "values": {"eval_loss": loss}}])
    store.add_checkpoint(job.id, 1, step=step, path=str(path), ts=time.time(), size_bytes=1000)
    return path


def test_the_jobs_spec_policy_keeps_last_best_and_every_k(store: Store, tmp_path: Path) -> None:
    job = _job(
        store,
        tmp_path,
        keep=1,
        keep_best={"metric": "eval_loss", "mode": "min", "count": 1},
        keep_every=300,
    )
    paths = {s: _report(store, job, s, loss) for s, loss in LOSSES.items()}

    result = CheckpointPruner(store).apply_to_job(job)

    assert [c.step for c in store.list_checkpoints(job.id)] == [200, 300, 500]
    assert [s for s, p in paths.items() if p.exists()] == [200, 300, 500]
    assert [r.step for r in store.checkpoint_removals(job.id)] == [100, 400]
    assert all(r.removed_at is not None for r in store.checkpoint_removals(job.id))
    assert result.plan.reasons[200] == ["best 1 by eval_loss"]
    assert result.message.startswith("retention: deleted step 100, 400 (policy: last 1, best 1")
    events = [e for e in store.list_events(job.id) if e.kind == "retention"]
    assert [e.message for e in events] == [result.message]


def test_applying_again_changes_nothing_and_writes_no_event(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path, keep=2)
    for step, loss in LOSSES.items():
        _report(store, job, step, loss)
    pruner = CheckpointPruner(store)
    first = pruner.apply_to_job(job)
    second = pruner.apply_to_job(job)

    assert [r.step for r in first.removed] == [100, 200, 300]
    assert second.removed == () and second.message == ""
    assert len([e for e in store.list_events(job.id) if e.kind == "retention"]) == 1


def test_a_checkpoint_promoted_to_a_model_version_is_never_deleted(
    store: Store, tmp_path: Path
) -> None:
    job = _job(store, tmp_path, keep=1)
    paths = {s: _report(store, job, s, loss) for s, loss in LOSSES.items()}
    store.register_version(
        "nlp",
        "m",
        artifact="ab" * 32,
        size_bytes=1000,
        created_by="ana",
        source="checkpoint",
        job_id=job.id,
        checkpoint_step=300,
    )

    CheckpointPruner(store).apply_to_job(job)

    assert [c.step for c in store.list_checkpoints(job.id)] == [300, 500]
    assert [s for s, p in paths.items() if p.exists()] == [300, 500]


def test_a_reported_path_outside_the_checkpoint_directory_loses_its_row_but_not_its_files(
    store: Store, tmp_path: Path
) -> None:
    job = _job(store, tmp_path, keep=1)
    elsewhere = _report(store, job, 100, 1.0, root=tmp_path / "precious")
    _report(store, job, 200, 1.0)

    result = CheckpointPruner(store).apply_to_job(job)

    assert elsewhere.exists() and [c.step for c in store.list_checkpoints(job.id)] == [200]
    assert "left on disk" in result.message and str(elsewhere) in result.message
    (removal,) = store.checkpoint_removals(job.id)
    assert removal.delete_files is False and removal.removed_at is not None


def test_a_crash_after_the_rows_is_finished_when_the_control_plane_starts_again(
    store: Store, tmp_path: Path
) -> None:
    job = _job(store, tmp_path, keep=1)
    paths = {s: _report(store, job, s, loss) for s, loss in LOSSES.items()}
    # the transaction committed, then the process died before deleting any directory
    retired = [Retirement(s, str(paths[s]), True) for s in (100, 200)]
    store.retire_checkpoints(job.id, retired, message="retention: deleted step 100, 200")
    assert paths[100].exists() and len(store.pending_checkpoint_removals()) == 2

    assert CheckpointPruner(store).finish_pending() == 2

    assert not paths[100].exists() and not paths[200].exists() and paths[300].exists()
    assert store.pending_checkpoint_removals() == []
    assert CheckpointPruner(store).finish_pending() == 0  # idempotent


def test_a_dry_run_plans_without_touching_rows_or_files(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    paths = {s: _report(store, job, s, loss) for s, loss in LOSSES.items()}
    result = CheckpointPruner(store).apply(
        job.id, RetentionPolicy(keep_last=1), root=tmp_path, dry_run=True
    )
    assert [c.step for c in result.plan.delete] == [100, 200, 300, 400]
    assert all(p.exists() for p in paths.values())
    assert len(store.list_checkpoints(job.id)) == 5 and store.checkpoint_removals(job.id) == []


@pytest.mark.parametrize(
    ("checkpoint", "expected"),
    [
        ({}, RetentionPolicy(keep_last=3)),
        (
            {"keep": 2, "keep_best": {"metric": "acc", "mode": "max", "count": 2}},
            RetentionPolicy(keep_last=2, keep_best=2, metric="acc", mode="max"),
        ),
        ({"keep_every": 1000}, RetentionPolicy(keep_last=3, keep_every=1000)),
    ],
    ids=[
        "the default keeps the last three",
        "keep_best maps to a best-by-metric rule",
        "keep_every maps to an every-k rule",
    ],
)
def test_the_spec_section_maps_to_a_retention_policy(
    checkpoint: dict[str, object], expected: RetentionPolicy
) -> None:
    spec = JobSpec.model_validate({"name": "a", "command": ["x"], "checkpoint": checkpoint})
    assert policy_of_spec(spec.checkpoint) == expected
