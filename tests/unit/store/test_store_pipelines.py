"""Pipeline rows on SQLite and PostgreSQL: created whole, a step's job inserted in the same
transaction that moves the step, compare-and-set on every move, cache lookups per team."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import Conflict, NotFound, SpecError
from tensoryard.spec.job import parse_job_spec
from tensoryard.spec.pipeline import PipelineSpec, parse_pipeline_spec
from tensoryard.store import Store


def chain(team: str = "default") -> PipelineSpec:
    return parse_pipeline_spec(
        {
            "name": "chain",
            "team": team,
            "steps": [
                {"name": "eval", "job": {"command": ["e.py", "${{ steps.train.outputs.c }}"]}},
                {"name": "train", "job": {"command": ["t.py"]}},
            ],
        }
    )


def submit(store: Store, pid: int, step: str, tmp_path: Path, tries: int = 0, **kw: Any) -> Any:
    job = parse_job_spec({"name": f"chain-{step}", "command": ["t.py"]})
    return store.submit_step(
        pid,
        step,
        expected_tries=tries,
        job=job,
        input_hash=kw.get("digest", "h1"),
        run_dir_root=tmp_path,
        reason="submitted",
    )


def test_a_pipeline_is_stored_with_its_steps_in_run_order(store: Store) -> None:
    store.ensure_team("default")
    record = store.create_pipeline(chain(), {"lr": 1})
    assert record.state == "RUNNING" and record.params == {"lr": 1}
    assert [(s.name, s.state, s.tries) for s in record.steps] == [
        ("train", "WAITING", 0),
        ("eval", "WAITING", 0),
    ]
    assert store.get_pipeline(record.id) == record
    assert store.running_pipelines() == [record]


def test_an_unknown_team_stores_nothing(store: Store) -> None:
    with pytest.raises(SpecError, match="unknown team 'ghost'"):
        store.create_pipeline(chain("ghost"), {})
    assert store.list_pipelines() == []


def test_submitting_a_step_stores_its_job_and_a_repeat_is_refused(
    store: Store, tmp_path: Path
) -> None:
    store.ensure_team("default")
    pid = store.create_pipeline(chain(), {}).id
    step = submit(store, pid, "train", tmp_path)
    assert step.state == "RUNNING" and step.tries == 1 and step.job_ids == (step.job_id,)
    job = store.get_job(step.job_id or 0)
    assert job.name == "chain-train" and job.run_dir == str(tmp_path / f"job-{job.id}")
    assert "pipeline" in store.list_events(job.id)[0].message
    with pytest.raises(Conflict, match="expected WAITING after 0"):
        submit(store, pid, "train", tmp_path)  # a second advancer, or a pass after a crash
    assert store.list_jobs().total == 1


def test_a_retry_submits_a_new_job_and_keeps_the_old_ones(store: Store, tmp_path: Path) -> None:
    store.ensure_team("default")
    pid = store.create_pipeline(chain(), {}).id
    first = submit(store, pid, "train", tmp_path)
    store.set_step(pid, "train", expected=["RUNNING"], state="WAITING", reason="retrying")
    second = submit(store, pid, "train", tmp_path, tries=1)
    assert second.tries == 2 and second.job_ids == (first.job_id, second.job_id)


def test_moves_are_compare_and_set(store: Store) -> None:
    store.ensure_team("default")
    pid = store.create_pipeline(chain(), {}).id
    with pytest.raises(Conflict, match="is WAITING, not one of RUNNING"):
        store.set_step(pid, "train", expected=["RUNNING"], state="SUCCEEDED", reason="x")
    with pytest.raises(NotFound, match="has no step 'nope'"):
        store.set_step(pid, "nope", expected=["WAITING"], state="SKIPPED", reason="x")
    done = store.set_step(pid, "train", expected=["WAITING"], state="SKIPPED", reason="x")
    assert done.finished_at is not None
    store.finish_pipeline(pid, "SUCCEEDED", "done")
    with pytest.raises(Conflict, match="already ended"):
        store.finish_pipeline(pid, "FAILED", "late")
    with pytest.raises(Conflict, match="nothing to cancel"):
        store.request_pipeline_cancel(pid)


def test_a_cancelled_pipeline_submits_nothing(store: Store, tmp_path: Path) -> None:
    store.ensure_team("default")
    pid = store.create_pipeline(chain(), {}).id
    assert store.request_pipeline_cancel(pid).cancel_requested
    with pytest.raises(Conflict, match="not submitting"):
        submit(store, pid, "train", tmp_path)
    assert store.list_jobs().total == 0


def test_the_cache_finds_the_newest_success_with_the_same_inputs_in_the_same_team(
    store: Store, tmp_path: Path
) -> None:
    for team in ("default", "other"):
        store.ensure_team(team)
    mine = store.create_pipeline(chain(), {}).id
    theirs = store.create_pipeline(chain("other"), {}).id
    submit(store, theirs, "train", tmp_path, digest="same")
    store.set_step(theirs, "train", expected=["RUNNING"], state="SUCCEEDED", reason="ok")
    assert store.find_cached_step("default", "same") is None  # never across teams
    submit(store, mine, "train", tmp_path, digest="same")
    assert store.find_cached_step("default", "same") is None  # not finished yet
    store.set_step(
        mine, "train", expected=["RUNNING"], state="SUCCEEDED", reason="ok", outputs={"c": "/x"}
    )
    found = store.find_cached_step("default", "same")
    assert found is not None and found.pipeline_id == mine and found.outputs == {"c": "/x"}
    assert store.find_cached_step("default", "different") is None
