"""Bad scheduler configuration is rejected with a message that names the culprit and the fix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli
from tensoryard.errors import ConfigError, SpecError
from tensoryard.scheduler import SchedulerConfig, nodes_from_cluster, workload_from_job
from tensoryard.scheduler.config import load_scheduler_config
from tensoryard.spec import (
    CohortSpec,
    QueueSpec,
    QuotaConfig,
    load_quota_config,
    parse_cluster_shape,
    parse_job_spec,
    parse_quota_config,
)


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        (
            {
                "queues": [{"name": "a", "cohort": "x"}],
                "cohorts": [{"name": "x", "parent": "y"}, {"name": "y", "parent": "x"}],
            },
            ["cycle", "x -> y -> x", "remove the parent"],
        ),
        (
            {"queues": [{"name": "a", "cohort": "x"}], "cohorts": [{"name": "x", "parent": "x"}]},
            ["cycle", "x -> x"],
        ),
        (
            {"queues": [{"name": "a", "cohort": "missing"}], "cohorts": []},
            ["queue 'a'", "cohort 'missing'", "not declared"],
        ),
        (
            {"queues": [{"name": "a"}], "cohorts": [{"name": "x", "parent": "nowhere"}]},
            ["cohort 'x'", "parent 'nowhere'"],
        ),
        ([{"name": "a"}, {"name": "a"}], ["'a' is used twice"]),
    ],
    ids=[
        "a cohort cycle",
        "a cohort that is its own parent",
        "a queue in an unknown cohort",
        "a cohort under an unknown parent",
        "two queues with one name",
    ],
)
def test_bad_queue_and_cohort_structure_is_a_config_error(
    data: object, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_quota_config(data, source="quotas.yaml")
    message = str(info.value)
    assert message.startswith("quotas.yaml: ")
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(
    ("queue", "path", "fragment"),
    [
        (
            {"name": "a", "nominal": {"H100": -4}},
            "queues.0.nominal",
            "nominal quota for H100 is -4",
        ),
        (
            {"name": "a", "nominal": {"H100": 4}, "lending_limit": {"H100": 8}},
            "queues.0",
            "only 4 are owned",
        ),
        (
            {"name": "a", "nominal": {"H100": 4}, "lending_limit": 6},
            "queues.0",
            "only 4 H100 are owned",
        ),
        ({"name": "a", "borrowing_limit": -1}, "queues.0.borrowing_limit", "borrowing_limit is -1"),
        ({"name": "a", "weight": 0}, "queues.0.weight", "greater than 0"),
        ({"name": "a", "nominal": {"cpu": 4}}, "queues.0.nominal", "reserved name 'cpu'"),
        ({"name": "A"}, "queues.0.name", "pattern"),
        ({"name": "a", "quota": 3}, "queues.0.quota", "Extra inputs"),
    ],
    ids=[
        "a negative quota",
        "lending more than owned (per model)",
        "lending more than owned (one number)",
        "a negative borrowing limit",
        "a zero weight",
        "cpu used as a GPU model",
        "an upper-case queue name",
        "an unknown field",
    ],
)
def test_bad_queue_fields_are_spec_errors_with_a_path(
    queue: dict, path: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_quota_config([queue], source="quotas.yaml")
    issue = info.value.issues[0]
    assert issue.path == path
    assert fragment in issue.message
    assert issue.fix


def test_a_quota_file_that_is_not_a_list_or_mapping_is_rejected() -> None:
    with pytest.raises(SpecError, match="list of queues"):
        parse_quota_config("nlp: 8")


def test_cohorts_named_by_queues_are_created_when_no_cohort_list_is_given() -> None:
    config = parse_quota_config([{"name": "a", "cohort": "pool"}, {"name": "b", "cohort": "pool"}])
    assert [c.name for c in config.cohorts] == ["pool"]


@pytest.mark.parametrize("suffix", [".yaml", ".json"], ids=["a YAML file", "a JSON file"])
def test_a_quota_file_loads(tmp_path: Path, suffix: str) -> None:
    data = {
        "queues": [{"name": "nlp", "cohort": "research", "nominal": {"H100": 16}, "weight": 2}],
        "cohorts": [{"name": "research"}],
    }
    path = tmp_path / f"quotas{suffix}"
    path.write_text(json.dumps(data))  # JSON is valid YAML too
    config = load_quota_config(path)
    assert config.queue("nlp") is not None
    assert config.queue("nlp").weight == 2  # type: ignore[union-attr]
    assert config.gpu_models == ("H100",)


def test_a_missing_quota_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_quota_config(tmp_path / "nope.yaml")


def test_quota_config_build_accepts_specs_directly() -> None:
    config = QuotaConfig.build(
        [QueueSpec(name="a", cohort="c", nominal={"H100": 8})], [CohortSpec(name="c")]
    )
    assert config.queues[0].borrowing_limit_for("H100") is None


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"history_weight": 1.5}, "history_weight"),
        ({"service_levels_gpu_s": (10.0, 5.0)}, "strictly increasing"),
        ({"max_reservations": -1}, "max_reservations"),
        ({"preemption_grace_s": -5}, "preemption_grace_s"),
    ],
    ids=[
        "a history weight above 1",
        "unsorted service levels",
        "negative reservations",
        "negative grace",
    ],
)
def test_bad_scheduler_settings_are_config_errors(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    ("shape", "per_switch", "nodes", "switches", "gpus"),
    [
        ("64x8", 8, 64, 8, 512),
        ("32x8:H100+16x8:A100", 16, 48, 3, 384),
        ("1x0", None, 1, 1, 0),
    ],
    ids=["a homogeneous cluster", "two GPU models", "one CPU-only machine"],
)
def test_cluster_shapes_expand_into_nodes_and_switches(
    shape: str, per_switch: int | None, nodes: int, switches: int, gpus: int
) -> None:
    spec = parse_cluster_shape(shape, nodes_per_switch=per_switch)
    expanded = nodes_from_cluster(spec)
    assert len(expanded) == nodes
    assert len({n.switch for n in expanded}) == switches
    assert sum(n.gpus_total for n in expanded) == gpus == spec.total_gpus


@pytest.mark.parametrize("shape", ["", "64", "x8", "64x8:", "8x99"], ids=lambda s: f"shape {s!r}")
def test_unreadable_cluster_shapes_are_spec_errors(shape: str) -> None:
    with pytest.raises(SpecError):
        parse_cluster_shape(shape)


def test_a_job_spec_becomes_a_pending_workload() -> None:
    spec = parse_job_spec(
        {
            "name": "pretrain",
            "team": "nlp",
            "priority": 3,
            "command": ["train.py"],
            "resources": {"nodes": 2, "gpus_per_node": 8, "cpu": 16},
            "max_runtime": "2h",
            "scheduling": {"gpu_model": "H100", "topology": "required"},
        }
    )
    w = workload_from_job("17", spec, submit_time=5.0)
    assert (w.queue, w.nodes, w.gpus_per_node, w.cpu_per_node) == ("nlp", 2, 8, 16.0)
    assert (w.priority, w.topology, w.runtime_estimate_s) == (3, "required", 7200.0)


def test_scheduler_settings_come_from_a_yaml_file_then_key_value_overrides(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text("scheduler:\n  reclaim_min_run_s: 120\n  defragment: false\n")
    config = load_scheduler_config(
        path, ["reclaim_min_run_s=30", "service_levels_gpu_s=[600, 7200]", "max_reservations=2"]
    )
    assert config.reclaim_min_run_s == 30.0  # the override wins over the file
    assert config.defragment is False
    assert config.service_levels_gpu_s == (600.0, 7200.0)
    assert config.max_reservations == 2
    assert config.preemption_grace_s == SchedulerConfig().preemption_grace_s  # unset: default
    # a bare mapping (no `scheduler:` key), an empty file and one of only comments work too
    path.write_text("preemption_grace_s: 45\n")
    assert load_scheduler_config(path).preemption_grace_s == 45.0
    for text in ("", "# nothing set\n", "scheduler:\n  # reclaim_min_run_s: 60\n"):
        path.write_text(text)
        assert load_scheduler_config(path) == SchedulerConfig()
    assert load_scheduler_config(None) == SchedulerConfig()


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["reclaim_min_run_s"], ["use KEY=VALUE", "reclaim_min_run_s=120"]),
        (
            ["reclaim_min_run=60"],
            ["unknown scheduler setting 'reclaim_min_run'", "reclaim_min_run_s"],
        ),
        (["reclaim_min_run_s=soon"], ["reclaim_min_run_s = 'soon' is not a number"]),
        (["reclaim_min_run_s=-5"], ["--scheduler 'reclaim_min_run_s=-5'", "must be >= 0"]),
        (["defragment=maybe"], ["defragment = 'maybe' is not a boolean", "true or false"]),
        (["max_reservations=1.5"], ["max_reservations = 1.5 is not a whole number"]),
        (['service_levels_gpu_s=[10, "x"]'], ["not a list of numbers", "[3600, 28800]"]),
        (["service_levels_gpu_s=[20, 10]"], ["strictly increasing"]),
        (["history_weight=2"], ["history_weight must be between 0 and 1"]),
    ],
    ids=lambda v: v[0] if isinstance(v, list) and v and "=" in v[0] else None,
)
def test_bad_scheduler_settings_name_the_setting_and_the_fix(
    overrides: list[str], fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_scheduler_config(None, overrides)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_a_bad_settings_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    with pytest.raises(ConfigError, match=r"cannot read scheduler settings .*--scheduler-config"):
        load_scheduler_config(path)
    path.write_text("reclaim_min_run_s: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_scheduler_config(path)
    path.write_text("- reclaim_min_run_s\n")
    with pytest.raises(ConfigError, match="expected a mapping of setting: value, got list"):
        load_scheduler_config(path)
    path.write_text("scheduler:\n  fair_share: 3\n")
    with pytest.raises(ConfigError, match=rf"{path}: unknown scheduler setting 'fair_share'"):
        load_scheduler_config(path)


def test_the_server_refuses_bad_scheduler_settings_before_it_creates_anything(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    result = CliRunner().invoke(
        cli, ["server", "--home", str(home), "--port", "1", "--scheduler", "reclaim_min_run_s=-1"]
    )
    assert result.exit_code == 1
    assert "reclaim_min_run_s must be >= 0" in result.output
    assert "Traceback" not in result.output
    assert not home.exists()
    result = CliRunner().invoke(
        cli,
        ["server", "--home", str(home), "--executor", "kubernetes", "--admission", "kueue",
         "--scheduler", "reclaim_min_run_s=10"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "Kueue admits jobs" in " ".join(result.output.split())
    assert not home.exists()


def test_docs_list_every_scheduler_setting_with_its_default() -> None:
    docs = Path(__file__).resolve().parents[3] / "docs" / "scheduling.md"
    rows = {}
    for line in docs.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    default = SchedulerConfig()
    for f in dataclasses.fields(SchedulerConfig):
        assert f.name in rows, f"docs/scheduling.md does not document {f.name}"
        # the documented default, read back as a setting, is the code's default
        read = load_scheduler_config(None, [f"{f.name}={rows[f.name]}"])
        assert getattr(read, f.name) == getattr(default, f.name), f.name
    assert set(rows) == {f.name for f in dataclasses.fields(SchedulerConfig)}
