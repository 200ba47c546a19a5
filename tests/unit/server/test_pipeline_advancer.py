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
