"""Pipelines through the real control loop: a SQLite or PostgreSQL store, the real local
executor running small Python steps as processes, and the controller's cycle driven here."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensoryard.executors.local import LocalExecutor
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import Controller
from tensoryard.server.scheduling import CorePolicy, NodeCapacity
from tensoryard.spec.pipeline import parse_pipeline_spec, resolve_params
from tensoryard.store import PipelineRecord, Store

pytestmark = pytest.mark.slow

WRITE_OUTPUTS = """
import json, os, sys
values = dict(arg.split("=", 1) for arg in sys.argv[1:])
out = {k: float(v) if v.replace(".", "", 1).isdigit() else v for k, v in values.items()}
with open(os.path.join(os.environ["TYARD_RUN_DIR"], "outputs.json"), "w") as fh:
    json.dump(out, fh)
with open(os.path.join(os.environ["TYARD_RUN_DIR"], "env.json"), "w") as fh:
    json.dump({k: v for k, v in os.environ.items() if k.startswith("TYARD_INPUT_")}, fh)
"""

FAIL_ONCE = """
import os, pathlib, sys
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("failed once")
    sys.exit(3)
"""


class Plane:
    """A control loop over a store and the local executor; `restart()` is a new process's."""

    def __init__(self, store: Store, home: Path) -> None:
        self.store = store
        self.home = home
        self.executor = LocalExecutor()
        self.controller = self._new()

    def _new(self) -> Controller:
        config = ServerConfig(home=self.home, launch_workers=0, cancel_grace_s=2)
        controller = Controller(
            store=self.store,
            executor=self.executor,
            policy=CorePolicy(),
            capacity=lambda: (NodeCapacity("n1", cpu_slots=4, memory_bytes=64 * 2**30),),
            config=config,
            holder="replica-a",
        )
        assert controller.lead()
        return controller

    def restart(self) -> None:
        self.controller = self._new()

    def run(self, spec: dict[str, Any], **params: Any) -> int:
        parsed = parse_pipeline_spec(spec)
        return self.store.create_pipeline(parsed, resolve_params(parsed, params)).id

    def until(self, pipeline_id: int, states: set[str], timeout: float = 60) -> PipelineRecord:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.controller.cycle()
            record = self.store.get_pipeline(pipeline_id)
            if record.state in states:
                return record
            time.sleep(0.1)
        raise AssertionError(f"pipeline {pipeline_id} is {self.store.get_pipeline(pipeline_id)}")


@pytest.fixture
def plane(store: Store, tmp_path: Path) -> Iterator[Plane]:
    store.ensure_team("default")
    plane = Plane(store, tmp_path / "home")
    yield plane
    for job in store.active_jobs():
        for attempt in store.list_attempts(job.id):
            if attempt.handle:
                plane.executor.terminate(attempt.handle)


def step(name: str, script: Path, *args: str, **extra: Any) -> dict[str, Any]:
    job = {
        "launcher": "python",
        "command": [script.name, *args],
        "workdir": str(script.parent),
        "restart": {"max_restarts": 0},  # a failed job fails its step's try at once
    }
    return {"name": name, "job": job, **extra}


@pytest.fixture
def scripts(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, source in (("write.py", WRITE_OUTPUTS), ("fail_once.py", FAIL_ONCE)):
        path = tmp_path / name
        path.write_text(source)
        out[name] = path
    return out


def three_steps(scripts: dict[str, Path], *, cache: bool = True) -> dict[str, Any]:
    write = scripts["write.py"]
    return {
        "name": "chain",
        "params": {"seed": 7, "max_ppl": 20.0},
        "steps": [
            step("train", write, "model=m-${{ params.seed }}", "loss=2.5", cache=cache),
            step(
                "eval",
                write,
                "ppl=12.5",
                "seen=${{ steps.train.outputs.model }}",
                inputs={"model": "${{ steps.train.outputs.model }}"},
                cache=cache,
            ),
            step(
                "publish",
                write,
                "done=yes",
                needs=["eval"],
                cache=cache,
                **{"if": "${{ steps.eval.outputs.ppl < params.max_ppl }}"},
            ),
        ],
    }


def test_steps_run_in_order_and_later_steps_read_earlier_outputs(
    plane: Plane, scripts: dict[str, Path]
) -> None:
    pid = plane.run(three_steps(scripts))
    record = plane.until(pid, {"SUCCEEDED", "FAILED"})
    assert record.state == "SUCCEEDED", record
    train, ev, publish = (record.step(n) for n in ("train", "eval", "publish"))
    assert train.outputs["model"] == "m-7" and train.outputs["loss"] == 2.5
    assert ev.outputs["seen"] == "m-7"
    env = json.loads((Path(plane.store.get_job(ev.job_id or 0).run_dir) / "env.json").read_text())
    assert env == {"TYARD_INPUT_MODEL": "m-7"}
    assert publish.state == "SUCCEEDED" and publish.outputs["done"] == "yes"
    jobs = [plane.store.get_job(s.job_id or 0) for s in (train, ev, publish)]
    assert [j.name for j in jobs] == ["chain-train", "chain-eval", "chain-publish"]
    assert jobs[0].finished_at is not None and jobs[0].finished_at <= jobs[1].created_at


def test_a_false_condition_skips_the_step_with_the_values_it_compared(
    plane: Plane, scripts: dict[str, Path]
) -> None:
    pid = plane.run(three_steps(scripts, cache=False), max_ppl="10")
    record = plane.until(pid, {"SUCCEEDED", "FAILED"})
    assert record.state == "SUCCEEDED"
    publish = record.step("publish")
    assert publish.state == "SKIPPED" and publish.job_id is None
    assert "steps.eval.outputs.ppl = 12.5" in publish.reason
    assert "params.max_ppl = 10.0" in publish.reason


def test_a_second_run_with_unchanged_inputs_reuses_outputs_and_says_why(
    plane: Plane, scripts: dict[str, Path]
) -> None:
    first = plane.until(plane.run(three_steps(scripts)), {"SUCCEEDED"})
    second = plane.until(plane.run(three_steps(scripts), seed="8"), {"SUCCEEDED"})
    # the seed changed the train step's inputs, and so everything after it
    assert [s.state for s in second.steps] == ["SUCCEEDED"] * 3
    third = plane.until(plane.run(three_steps(scripts)), {"SUCCEEDED"})
    assert [s.state for s in third.steps] == ["CACHED"] * 3
    train = third.step("train")
    assert train.job_id is None and train.outputs == first.step("train").outputs
    assert f"pipeline {first.id} step train" in train.reason and "inputs unchanged" in train.reason
    assert train.cached_from == f"{first.id}/train"


def test_a_failing_step_is_retried_and_a_step_out_of_retries_fails_the_pipeline(
    plane: Plane, scripts: dict[str, Path], tmp_path: Path
) -> None:
    flaky = {
        "name": "flaky",
        "steps": [
            step("once", scripts["fail_once.py"], str(tmp_path / "m1"), retries=1),
            step("after", scripts["write.py"], "x=1", needs=["once"]),
        ],
    }
    record = plane.until(plane.run(flaky), {"SUCCEEDED", "FAILED"})
    assert record.state == "SUCCEEDED"
    assert record.step("once").tries == 2 and len(record.step("once").job_ids) == 2

    broken = {
        "name": "broken",
        "steps": [
            step("once", scripts["fail_once.py"], str(tmp_path / "m2"), cache=False),
            step("after", scripts["write.py"], "x=1", needs=["once"]),
        ],
    }
    record = plane.until(plane.run(broken), {"SUCCEEDED", "FAILED"})
    assert record.state == "FAILED"
    assert record.step("once").state == "FAILED" and "failed" in record.step("once").reason
    assert record.step("after").state == "CANCELLED"
    assert record.step("after").reason == "not run: once FAILED"
    assert "step once FAILED" in record.reason


def test_a_pipeline_survives_a_control_plane_restart_without_running_a_step_twice(
    plane: Plane, scripts: dict[str, Path]
) -> None:
    pid = plane.run(three_steps(scripts, cache=False))
    deadline = time.monotonic() + 30
    while plane.store.get_pipeline(pid).step("train").state != "SUCCEEDED":
        assert time.monotonic() < deadline
        plane.controller.cycle()
        time.sleep(0.1)
    plane.restart()  # fresh memory: everything comes from the store
    plane.controller.pipelines.advance()
    plane.restart()
    plane.controller.pipelines.advance()  # twice: the second finds the step submitted already
    record = plane.until(pid, {"SUCCEEDED", "FAILED"})
    assert record.state == "SUCCEEDED"
    assert [len(s.job_ids) for s in record.steps] == [1, 1, 1]
    assert len(plane.store.list_jobs(limit=100).items) == 3


def test_cancelling_a_pipeline_cancels_its_running_job_and_the_steps_after_it(
    plane: Plane, tmp_path: Path
) -> None:
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    pid = plane.run(
        {
            "name": "long",
            "steps": [
                step("sleep", sleeper, cache=False),
                step("after", sleeper, needs=["sleep"]),
            ],
        }
    )
    deadline = time.monotonic() + 30
    while True:
        plane.controller.cycle()
        record = plane.store.get_pipeline(pid)
        job_id = record.step("sleep").job_id
        if job_id and plane.store.get_job(job_id).state.value == "RUNNING":
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    plane.store.request_pipeline_cancel(pid)
    record = plane.until(pid, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=30)
    assert record.state == "CANCELLED"
    assert record.step("sleep").state == "CANCELLED"
    assert record.step("after").state == "CANCELLED"
    assert plane.store.get_job(job_id).state.value == "CANCELLED"


def test_a_missing_output_or_a_bad_outputs_file_fails_the_step_with_the_reason(
    plane: Plane, scripts: dict[str, Path], tmp_path: Path
) -> None:
    bad_writer = tmp_path / "bad.py"
    bad_writer.write_text(
        "import os\nopen(os.path.join(os.environ['TYARD_RUN_DIR'], 'outputs.json'), 'w')"
        ".write('[1]')\n"
    )
    pid = plane.run(
        {
            "name": "holes",
            "steps": [
                step("train", scripts["write.py"], "loss=1", cache=False),
                step("eval", scripts["write.py"], "${{ steps.train.outputs.model }}"),
                step("bad", bad_writer, cache=False),
            ],
        }
    )
    record = plane.until(pid, {"SUCCEEDED", "FAILED"})
    assert record.state == "FAILED"
    ev, bad = record.step("eval"), record.step("bad")
    assert ev.state == "FAILED" and ev.job_id is None
    assert "step train has no output 'model'" in ev.reason and "loss" in ev.reason
    assert bad.state == "FAILED" and "it is not a JSON object" in bad.reason
