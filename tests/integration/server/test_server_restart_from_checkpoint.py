"""Restarting a job from a chosen checkpoint (`POST /jobs/{id}/resubmit` with
`checkpoint_step`) and submitting a job as YAML text (`spec_yaml`), through the real app on
SQLite: the checkpoint lands in the new job's own directory, lineage in both jobs' events, and
bad input is a 4xx naming the field and the fix with nothing stored. The training runtime
resuming from it is proven in tests/e2e_web (a real CPU run of the tiny GPT)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.integration.console import test_console_api
from tests.integration.console.test_console_api import World

from tensoryard.store._retention import Retirement

world = test_console_api.world  # the console's tests' control plane: teams nlp and vision


def _checkpoint(world: World, job: int, step: int) -> Path:
    """A runtime-shaped checkpoint directory of `job`, recorded in the store."""
    run_dir = Path(world.plane.store.get_job(job).run_dir)
    path = run_dir / "checkpoints" / f"step-{step:09d}"
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(b"weights of step %d" % step)
    (path / "meta.json").write_text(json.dumps({"step": step, "layout": "full"}))
    world.plane.store.add_checkpoint(job, 1, step=step, path=str(path), ts=1.0, size_bytes=20)
    return path


def _restart(world: World, user: str, job: int, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {world.tokens[user]}"}
    return world.client.post(f"/api/v1/jobs/{job}/resubmit", headers=headers, json=body)


def _job_count(world: World) -> int:
    return world.plane.store.list_jobs().total


def _staged_left(world: World) -> list[Path]:
    return list(world.plane.config.runs_dir.glob(".restart-*"))


def test_a_restart_gets_the_chosen_checkpoint_in_its_own_directory_and_records_lineage(
    world: World,
) -> None:
    old = world.jobs["nlp"]
    chosen = _checkpoint(world, old, 10)
    _checkpoint(world, old, 20)
    answer = _restart(world, "mo", old, {"checkpoint_step": 10})
    assert answer.status_code == 201, answer.text
    assert answer.json()["from"] == old and answer.json()["checkpoint_step"] == 10
    store = world.plane.store
    new = store.get_job(answer.json()["id"])
    placed = Path(new.run_dir) / "checkpoints" / chosen.name
    assert sorted(p.name for p in placed.parent.iterdir()) == [chosen.name]  # only the chosen
    assert (placed / "state.pt").read_bytes() == b"weights of step 10"
    assert (placed / "state.pt").stat().st_ino == (chosen / "state.pt").stat().st_ino  # a link
    assert new.spec["env"] == {"KEY": "secret"} and new.user == "mo"
    events = [e.message for e in store.list_events(new.id)]
    assert f"restarted from job {old}'s checkpoint of step 10 by mo" in events
    assert any(f"job {new.id} restarts from" in e.message for e in store.list_events(old))
    [line] = store.list_audit(actor="mo", action="job.submit")
    assert line.outcome == "ok"
    assert not _staged_left(world)


@pytest.mark.parametrize(
    ("body", "message", "fix"),
    [
        pytest.param(
            {"checkpoint_step": 15},
            "has no checkpoint at step 15",
            "choose one of its checkpoints' steps: 20",
            id="a step the job never checkpointed is named with the steps one may choose",
        ),
        pytest.param(
            {"checkpoint_step": 10},
            "was removed by its retention policy",
            "choose one of the steps it keeps: 20",
            id="a checkpoint retention removed is named as such",
        ),
        pytest.param(
            {"checkpoint_step": -1},
            "greater than or equal to 0",
            "",
            id="a negative step is refused by the schema",
        ),
    ],
)
def test_a_bad_checkpoint_step_is_a_422_naming_the_field_and_nothing_is_stored(
    world: World, body: dict[str, Any], message: str, fix: str
) -> None:
    old = world.jobs["nlp"]
    removed = _checkpoint(world, old, 10)
    _checkpoint(world, old, 20)
    world.plane.store.retire_checkpoints(
        old, [Retirement(10, str(removed), delete_files=True)], message="retention"
    )
    before = _job_count(world)
    answer = _restart(world, "mo", old, body)
    assert answer.status_code == 422, answer.text
    [issue] = answer.json()["detail"]
    assert issue["path"] == "checkpoint_step" and message in issue["message"]
    assert fix in issue.get("fix", "")
    assert _job_count(world) == before and not _staged_left(world)


def test_a_checkpoint_holding_a_link_is_refused(world: World, tmp_path: Path) -> None:
    old = world.jobs["nlp"]
    path = _checkpoint(world, old, 10)
    (tmp_path / "elsewhere").write_text("not the job's")
    (path / "extra.pt").symlink_to(tmp_path / "elsewhere")
    before = _job_count(world)
    answer = _restart(world, "mo", old, {"checkpoint_step": 10})
    assert answer.status_code == 422
    assert "not a plain file" in answer.json()["detail"][0]["message"]
    assert _job_count(world) == before and not _staged_left(world)


def test_a_member_of_another_team_cannot_restart_from_its_checkpoints(world: World) -> None:
    old = world.jobs["nlp"]
    _checkpoint(world, old, 10)
    before = _job_count(world)
    answer = _restart(world, "vic", old, {"checkpoint_step": 10})
    assert answer.status_code == 403
    assert _job_count(world) == before and not _staged_left(world)
    [line] = world.plane.store.list_audit(actor="vic", outcome="denied")
    assert line.object == f"job/{old}"


YAML = """\
name: from-yaml
team: nlp
launcher: python
command: ["train.py"]   # a comment, as in a job.yaml
workdir: {workdir}
resources:
  cpu: 1
"""


def _submit(world: World, body: dict[str, Any]) -> Any:
    headers = {"Authorization": f"Bearer {world.tokens['mo']}"}
    return world.client.post("/api/v1/jobs", headers=headers, json=body)


def test_a_job_submitted_as_yaml_text_is_stored_like_its_json_twin(
    world: World, tmp_path: Path
) -> None:
    answer = _submit(world, {"spec_yaml": YAML.format(workdir=tmp_path)})
    assert answer.status_code == 201, answer.text
    job = world.plane.store.get_job(answer.json()["id"])
    assert job.name == "from-yaml" and job.user == "mo" and job.spec["command"] == ["train.py"]


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        pytest.param(
            {"spec_yaml": "name: x\ncommand: [train.py\n"},
            "spec_yaml",
            "malformed YAML at line",
            id="a YAML syntax error names spec_yaml and the line",
        ),
        pytest.param(
            {"spec_yaml": "- just\n- a list\n"},
            "spec_yaml",
            "must be a mapping",
            id="a YAML document that is not a mapping names spec_yaml",
        ),
        pytest.param(
            {"spec_yaml": YAML.replace("cpu: 1", "cpu: many")},
            "resources.cpu",
            "",
            id="a bad field in the YAML is named by its path like in JSON",
        ),
        pytest.param(
            {
                "spec_yaml": "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                + "".join(
                    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                    for p, c in zip("abcdef", "bcdefg", strict=True)
                )
            },
            "spec_yaml",
            "",
            id="an alias bomb is refused by the CLI's limits",
        ),
        pytest.param(
            {"spec": {"name": "x"}, "spec_yaml": "name: x\n"},
            "spec",
            "give the job spec once",
            id="both spec and spec_yaml is refused",
        ),
        pytest.param({}, "spec", "give the job spec once", id="neither is refused"),
    ],
)
def test_bad_yaml_is_a_422_naming_the_field_and_nothing_is_stored(
    world: World, tmp_path: Path, body: dict[str, Any], path: str, message: str
) -> None:
    if "spec_yaml" in body:
        body = {**body, "spec_yaml": body["spec_yaml"].replace("{workdir}", str(tmp_path))}
    before = _job_count(world)
    answer = _submit(world, body)
    assert answer.status_code == 422, answer.text
    issues = answer.json()["detail"]
    assert any(i["path"] == path and message in i["message"] for i in issues), issues
    assert "Traceback" not in answer.text
    assert _job_count(world) == before
