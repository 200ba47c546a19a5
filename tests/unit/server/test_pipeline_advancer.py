"""The pipeline advancer on a real store, without running jobs: what it does with a stored
spec it cannot read, and that a pass with nothing to do changes nothing."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import update

from tensoryard.server.pipelines import PipelineAdvancer
from tensoryard.spec.pipeline import parse_pipeline_spec
from tensoryard.store import Store
from tensoryard.store.models import Pipeline


def test_a_pipeline_whose_stored_spec_is_unreadable_fails_and_the_others_go_on(
    store: Store, tmp_path: Path
) -> None:
    store.ensure_team("default")
    spec = parse_pipeline_spec({"name": "p", "steps": [{"name": "a", "job": {"command": ["x"]}}]})
    broken = store.create_pipeline(spec, {}).id
    fine = store.create_pipeline(spec, {}).id
    with store.engine.begin() as conn:
        conn.execute(update(Pipeline).where(Pipeline.id == broken).values(spec={"name": 5}))
    advancer = PipelineAdvancer(store, runs_dir=tmp_path)
    assert advancer.advance() == 2
    failed = store.get_pipeline(broken)
    assert failed.state == "FAILED" and failed.reason.startswith("stored spec is invalid")
    started = store.get_pipeline(fine).step("a")
    assert started.state == "RUNNING" and started.job_id is not None
    assert advancer.advance() == 0  # the job has not ended: nothing to do
    assert store.list_jobs().total == 1


def _run_job_to_success(store: Store, job_id: int, checkpoint: Path, loss: float) -> None:
    """What the control loop and the job's reports would do, straight on the store."""
    from tensoryard.spec.states import JobState as S

    store.transition(job_id, S.ADMITTED, reason="fits", placement={})
    store.transition(job_id, S.STARTING, reason="launched")
    store.start_attempt(job_id, handle={})
    store.transition(job_id, S.RUNNING, reason="up")
    checkpoint = Path(store.get_job(job_id).run_dir) / checkpoint.name  # the job's own files
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.pt").write_bytes(b"weights" * 1000)
    store.add_checkpoint(job_id, 1, step=5, path=str(checkpoint), ts=1.0, size_bytes=7000)
    store.add_metrics(job_id, 1, [{"step": 5, "ts": 1.0, "values": {"loss": loss}}])
    store.transition(job_id, S.SUCCEEDED, reason="exit 0")


def test_a_register_step_promotes_the_checkpoint_once_even_when_repeated_after_a_crash(
    store: Store, tmp_path: Path
) -> None:
    from tensoryard.registry import ArtifactStore, open_blobs
    from tensoryard.registry.service import ModelRegistry
    from tensoryard.server.pipelines import REGISTER_TAG

    store.ensure_team("default")
    registry = ModelRegistry(store, ArtifactStore(open_blobs(str(tmp_path / "artifacts"))))
    spec = parse_pipeline_spec(
        {
            "name": "p",
            "steps": [
                {"name": "train", "cache": False, "job": {"command": ["x"]}},
                {
                    "name": "reg",
                    "kind": "register",
                    "if": "${{ models.m.production.metrics.loss == null "
                    "or steps.train.outputs.loss < models.m.production.metrics.loss }}",
                    "register": {
                        "model": "m",
                        "from_step": "train",
                        "metrics": {"loss": "${{ steps.train.outputs.loss }}"},
                        "aliases": ["production"],
                    },
                },
            ],
        }
    )
    advancer = PipelineAdvancer(store, runs_dir=tmp_path, registry=registry)

    first = store.create_pipeline(spec, {}).id
    advancer.advance()
    job_id = store.get_pipeline(first).step("train").job_id
    assert job_id is not None
    _run_job_to_success(store, job_id, tmp_path / "ckpt-1", loss=2.5)
    # the control plane registered the version, then died before it recorded the step
    registry.register_checkpoint(
        "default", "m", job_id, created_by="anonymous", tags={REGISTER_TAG: f"{first}/reg"}
    )
    advancer.advance()
    advancer.advance()
    done = store.get_pipeline(first)
    assert done.state == "SUCCEEDED", done.reason
    reg = done.step("reg")
    assert reg.state == "SUCCEEDED" and reg.outputs["version"] == 1, reg.reason
    assert [v.version for v in store.list_versions("default", "m")] == [1]  # not registered twice

    # a second run whose model is worse than `production` is not registered
    second = store.create_pipeline(spec, {}).id
    advancer.advance()
    job2 = store.get_pipeline(second).step("train").job_id
    assert job2 is not None and job2 != job_id
    store.set_alias("default", "m", "production", 1)
    _run_job_to_success(store, job2, tmp_path / "ckpt-2", loss=9.0)
    advancer.advance()
    advancer.advance()
    skipped = store.get_pipeline(second).step("reg")
    assert skipped.state == "SKIPPED" and "is false" in skipped.reason, skipped.reason
    assert [v.version for v in store.list_versions("default", "m")] == [1]
