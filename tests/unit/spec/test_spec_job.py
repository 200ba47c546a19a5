"""JobSpec: valid specs load with defaults; bad ones name the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import SpecError
from tensoryard.spec.job import load_job_spec, parse_job_spec

MINIMAL: dict[str, Any] = {"name": "tiny", "command": ["train.py"]}


def with_(**changes: Any) -> dict[str, Any]:
    spec = {**MINIMAL}
    for dotted, value in changes.items():
        node = spec
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return spec


def test_a_minimal_spec_gets_sensible_defaults() -> None:
    spec = parse_job_spec(MINIMAL)
    assert spec.team == "default"
    assert spec.launcher == "torchrun"
    assert spec.resources.nodes == 1
    assert spec.resources.procs == 1
    assert spec.restart.max_restarts == 3
    assert spec.scheduling.topology == "preferred"


def test_quantities_are_read_in_human_units() -> None:
    spec = parse_job_spec(
        with_(resources__memory="16Gi", max_runtime="1h30m", restart__backoff="10s")
    )
    assert spec.resources.memory == 16 * 2**30
    assert spec.max_runtime == 5400.0
    assert spec.restart.backoff == 10.0


def test_a_command_string_is_split_like_a_shell() -> None:
    spec = parse_job_spec(with_(command="train.py --lr 3e-4 --name 'a b'"))
    assert spec.command == ["train.py", "--lr", "3e-4", "--name", "a b"]


def test_gpu_jobs_default_to_one_process_per_gpu() -> None:
    spec = parse_job_spec(with_(resources__gpus_per_node=8, resources__nodes=2))
    assert spec.resources.procs == 8
    assert spec.resources.world_size == 16
    assert spec.resources.total_gpus == 16


BAD_CASES = [
    (with_(bogus=1), "bogus", "remove this field"),
    (with_(resources__gpu=8), "resources.gpu", "remove this field"),
    (with_(resources__nodes=-1), "resources.nodes", "larger value"),
    (with_(resources__nodes=100_000), "resources.nodes", "smaller value"),
    (with_(resources__gpus_per_node=64), "resources.gpus_per_node", "smaller value"),
    (with_(resources__memory="lots"), "resources.memory", "16Gi"),
    (with_(resources__cpu=0), "resources.cpu", "larger value"),
    (with_(command=[]), "command", "at least one"),
    ({"name": "tiny"}, "command", "add this field"),
    (with_(name="Bad Name!"), "name", "lowercase"),
    (with_(launcher="mpirun"), "launcher", "allowed values"),
    (with_(priority="high"), "priority", "whole number"),
    (with_(max_runtime="soon"), "max_runtime", "30m"),
    (
        with_(resources__gpus_per_node=8, resources__processes_per_node=3),
        "resources",
        "one process per GPU",
    ),
    (with_(launcher="python", resources__processes_per_node=2), "", "launcher: torchrun"),
    (with_(checkpoint__keep_best="eval_loss"), "checkpoint.keep_best", "{metric: eval_loss"),
    (with_(checkpoint__keep_best={"mode": "min"}), "checkpoint.keep_best.metric", "add this"),
    (
        with_(checkpoint__keep_best={"metric": "eval loss"}),
        "checkpoint.keep_best.metric",
        "the name the job reports",
    ),
    (
        with_(checkpoint__keep_best={"metric": "acc", "mode": "up"}),
        "checkpoint.keep_best.mode",
        "allowed values",
    ),
    (
        with_(checkpoint__keep_best={"metric": "acc", "count": 0}),
        "checkpoint.keep_best.count",
        "larger value",
    ),
    (with_(checkpoint__keep_every=0), "checkpoint.keep_every", "larger value"),
]


@pytest.mark.parametrize(
    ("data", "path", "fix"),
    BAD_CASES,
    ids=[
        "an unknown top-level field is rejected",
        "a misspelt resources field is rejected",
        "a negative node count is rejected",
        "an absurd node count is rejected",
        "more GPUs per node than any machine has is rejected",
        "an unreadable memory size is rejected",
        "zero CPUs is rejected",
        "an empty command is rejected",
        "a missing command is rejected",
        "a name with spaces and capitals is rejected",
        "an unknown launcher is rejected",
        "a priority that is not a number is rejected",
        "an unreadable duration is rejected",
        "three processes on eight GPUs is rejected",
        "the python launcher with two processes is rejected",
        "keep_best as a bare metric name says to give a mapping",
        "keep_best without a metric is rejected",
        "a keep_best metric with a space is rejected",
        "a keep_best mode other than min or max is rejected",
        "keeping the zero best is rejected",
        "keep_every zero is rejected",
    ],
)
def test_bad_specs_name_the_field_and_the_fix(data: dict[str, Any], path: str, fix: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(data)
    issues = info.value.issues
    assert any(i.path == path for i in issues), [i.path for i in issues]
    assert fix in str(info.value)


def test_retention_settings_are_read_next_to_keep() -> None:
    spec = parse_job_spec(
        with_(
            checkpoint__keep=2,
            checkpoint__keep_best={"metric": "eval_loss"},
            checkpoint__keep_every=1000,
        )
    )
    assert spec.checkpoint.keep == 2
    assert spec.checkpoint.keep_best is not None
    assert (spec.checkpoint.keep_best.metric, spec.checkpoint.keep_best.mode) == (
        "eval_loss",
        "min",
    )
    assert spec.checkpoint.keep_best.count == 1
    assert spec.checkpoint.keep_every == 1000


def test_a_spec_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_job_spec(["name", "tiny"])


def test_malformed_yaml_points_at_the_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: tiny\ncommand: [train.py\nteam: nlp\n")
    with pytest.raises(SpecError, match=r"malformed YAML at line \d+"):
        load_job_spec(path)


def test_a_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_job_spec(tmp_path / "nope.yaml")


def test_workdir_defaults_to_the_spec_files_directory(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: tiny\ncommand: train.py\n")
    assert load_job_spec(path).workdir == str(tmp_path.resolve())
    path.write_text("name: tiny\ncommand: train.py\nworkdir: sub\n")
    assert load_job_spec(path).workdir == str((tmp_path / "sub").resolve())


def test_volumes_mount_claims_read_only_where_asked() -> None:
    spec = parse_job_spec(
        with_(volumes=[{"claim": "team-data", "mount": "/data/", "read_only": True}])
    )
    (volume,) = spec.volumes
    assert (volume.claim, volume.mount, volume.read_only) == ("team-data", "/data", True)
    assert parse_job_spec(MINIMAL).volumes == []


@pytest.mark.parametrize(
    ("volumes", "path", "says"),
    [
        ([{"claim": "Team_Data", "mount": "/data"}], "volumes.0.claim", "kubectl get pvc"),
        ([{"claim": "data", "mount": "data"}], "volumes.0.mount", "absolute"),
        ([{"claim": "data", "mount": "/data/../etc"}], "volumes.0.mount", "'..'"),
        ([{"claim": "data", "mount": "/opt/tensoryard/x"}], "volumes.0.mount", "elsewhere"),
        ([{"claim": "data", "mount": "/dev/shm"}], "volumes.0.mount", "elsewhere"),
        ([{"claim": "data"}], "volumes.0.mount", ""),
        (
            [{"claim": "a", "mount": "/data"}, {"claim": "b", "mount": "/data/b"}],
            "volumes",
            "overlap",
        ),
        ([{"claim": "a", "mount": "/data", "size": "1Ti"}], "volumes.0.size", ""),
    ],
)
def test_a_bad_volume_names_its_field(volumes: list[dict[str, Any]], path: str, says: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(with_(volumes=volumes))
    (issue,) = caught.value.issues
    assert issue.path == path
    assert says in f"{issue.message} {issue.fix}"
