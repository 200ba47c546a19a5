"""`tyard cluster plan`: generated objects match the CRDs, the labels reach the scheduler, the
DCGM list covers the alert rules, and nothing is written when the inventory is bad."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.shared_data import missing_shared
from typer.testing import CliRunner

from tensoryard.cli.main import app
from tensoryard.cluster import build_plan, load_inventory, write_plan
from tensoryard.cluster.crds import load_crd_schemas, validate_objects
from tensoryard.cluster.gpu_operator import DCGM_DEFAULT_COUNTERS, dcgm_counters
from tensoryard.cluster.labels import TOPOLOGY_LEVELS, node_from_labels, node_labels
from tensoryard.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "cluster" / "inventory.yaml"
SHARED = REPO.parent / "shared"
KUEUE_CRDS = SHARED / "k8s" / "crds" / "kueue"
DCGM_CSV = SHARED / "reference" / "dcgm-exporter_default-counters.csv"


@pytest.fixture(scope="module")
def schemas() -> Any:
    _needs_shared(KUEUE_CRDS)
    return load_crd_schemas(KUEUE_CRDS)


@pytest.fixture(scope="module")
def plan() -> Any:
    return build_plan(load_inventory(EXAMPLE))


def _needs_shared(path: Path) -> None:
    if not path.exists():
        missing_shared(f"{path} is absent; clone ../shared to run this test")


@pytest.mark.shared
def test_every_kueue_object_validates_against_the_kueue_crds(plan: Any, schemas: Any) -> None:
    assert validate_objects(plan.kueue, schemas) == []
    kinds = [o["kind"] for o in plan.kueue]
    for kind in ("Topology", "ResourceFlavor", "WorkloadPriorityClass", "Cohort"):
        assert kind in kinds
    assert kinds.count("ClusterQueue") == kinds.count("LocalQueue") == 3


@pytest.mark.shared
def test_the_crd_check_catches_a_wrong_object(plan: Any, schemas: Any) -> None:
    queue = json.loads(json.dumps(next(o for o in plan.kueue if o["kind"] == "ClusterQueue")))
    queue["spec"]["queueingStrategy"] = "Random"
    del queue["spec"]["resourceGroups"][0]["flavors"][0]["name"]
    issues = validate_objects([queue], schemas)
    text = " | ".join(f"{i.path} {i.message}" for i in issues)
    assert "queueingStrategy" in text and "'name' is a required property" in text


def test_cluster_queues_mirror_the_platform_quotas(plan: Any) -> None:
    queues = {o["metadata"]["name"]: o["spec"] for o in plan.kueue if o["kind"] == "ClusterQueue"}
    flavor = queues["pretrain"]["resourceGroups"][0]["flavors"][0]
    gpu = next(r for r in flavor["resources"] if r["name"] == "nvidia.com/gpu")
    assert flavor["name"] == "gpu-h100"
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": 40, "lendingLimit": 16}
    nlp_gpu = queues["nlp"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    assert nlp_gpu["borrowingLimit"] == 24
    assert queues["pretrain"]["cohortName"] == "research"
    assert queues["pretrain"]["fairSharing"] == {"weight": 2}
    # 8 nodes x 224 cores / 64 GPUs = 28 cores per H100
    assert flavor["resources"][0] == {"name": "cpu", "nominalQuota": 40 * 28, "lendingLimit": 448}
    local = [o for o in plan.kueue if o["kind"] == "LocalQueue"]
    assert {(o["metadata"]["namespace"], o["spec"]["clusterQueue"]) for o in local} == {
        ("ml", "pretrain"),
        ("ml", "nlp"),
        ("ml", "eval"),
    }


def test_node_labels_are_what_the_scheduler_and_kueue_topology_read(plan: Any) -> None:
    nodes = list(yaml.safe_load_all(plan.files["nodes.yaml"]))
    assert len(nodes) == 10
    b01 = next(n for n in nodes if n["metadata"]["name"] == "hgx-b01")
    assert b01["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    topology = next(o for o in plan.kueue if o["kind"] == "Topology")
    assert [lvl["nodeLabel"] for lvl in topology["spec"]["levels"]] == list(TOPOLOGY_LEVELS)
    assert set(TOPOLOGY_LEVELS) <= set(b01["metadata"]["labels"])
    node = node_from_labels(
        "hgx-b01",
        b01["metadata"]["labels"],
        {"nvidia.com/gpu": "8", "cpu": "224", "memory": "2Ti"},
    )
    assert (node.switch, node.block, node.gpu_model, node.gpus_total) == (
        "leaf-02",
        "block-a",
        "H100",
        8,
    )
    assert node.mem_total == 2 * 1024**4 and node.cpu_total == 224.0


def test_node_labels_of_a_node_without_ib_have_no_rail_label() -> None:
    inv = load_inventory(EXAMPLE)
    l40s = next(n for n in inv.nodes if n.gpu.model == "L40S")
    assert "tensoryard.io/ib-rails" not in node_labels(l40s)


@pytest.mark.shared
def test_the_dcgm_list_is_the_exporter_default_plus_what_the_alert_rules_use() -> None:
    _needs_shared(DCGM_CSV)
    reference = [
        line.split(",")[0].strip()
        for line in DCGM_CSV.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [name for name, _, _ in DCGM_DEFAULT_COUNTERS] == reference
    names = {name for name, _, _ in dcgm_counters()}
    rules = "".join(p.read_text() for p in (REPO / "deploy" / "prometheus" / "rules").glob("*.yml"))
    used = set(re.findall(r"DCGM_FI_[A-Z_]+", rules))
    assert used, "the rules use DCGM metrics"
    assert used <= names, used - names


def test_gpu_operator_values_follow_the_inventory(plan: Any) -> None:
    values = yaml.safe_load(plan.files["gpu-operator/values.yaml"])
    assert values["driver"] == {
        "enabled": True,
        "version": "570.133.20",
        "rdma": {"enabled": True, "useHostMofed": False},
    }
    assert values["dcgmExporter"]["config"]["name"] == "tensoryard-dcgm-metrics"
    configmap = yaml.safe_load(plan.files["gpu-operator/dcgm-metrics.yaml"])
    assert "DCGM_FI_DEV_XID_ERRORS, gauge" in configmap["data"]["dcgm-metrics.csv"]
    assert "network-operator/values.yaml" in plan.files
    assert json.loads(plan.files["plan.json"])["fabric_manager"].startswith("started by")


def test_a_preinstalled_driver_without_ib_leaves_driver_and_rdma_out() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["cluster"]["driver_preinstalled"] = True
    data["cluster"]["mig_strategy"] = "mixed"
    for node in data["nodes"]:
        node.pop("ib", None)
    from tensoryard.cluster import parse_inventory

    p = build_plan(parse_inventory(data))
    values = yaml.safe_load(p.files["gpu-operator/values.yaml"])
    assert values["driver"] == {"enabled": False}
    assert values["mig"] == {"strategy": "mixed"} and values["migManager"] == {"enabled": True}
    assert "network-operator/values.yaml" not in p.files
    assert "node image must run nvidia-fabricmanager" in p.summary["fabric_manager"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_the_prometheus_config_passes_promtool(plan: Any, tmp_path: Path) -> None:
    config = yaml.safe_load(plan.files["prometheus/prometheus.yml"])
    jobs = [s["job_name"] for s in config["scrape_configs"]]
    assert {"tensoryard-control-plane", "tensoryard-agent", "dcgm-exporter"} <= set(jobs)
    # Debian's Prometheus build leaves out Kubernetes service discovery, so promtool checks the
    # rest (relabelling, regexes, globals) with static targets in its place.
    for scrape in config["scrape_configs"]:
        assert scrape.pop("kubernetes_sd_configs")
        scrape["static_configs"] = [{"targets": ["127.0.0.1:1"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_write_plan_replaces_only_with_force_and_leaves_no_temp_folders(
    plan: Any, tmp_path: Path
) -> None:
    out = tmp_path / "plan"
    write_plan(plan, out)
    assert (out / "kueue" / "kueue.yaml").read_text() == plan.files["kueue/kueue.yaml"]
    (out / "stale.txt").write_text("old")
    with pytest.raises(ConfigError, match="--force"):
        write_plan(plan, out)
    assert (out / "stale.txt").exists()
    write_plan(plan, out, force=True)
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]


def test_the_cli_writes_nothing_for_a_bad_inventory_and_names_the_fields(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["nodes"][2]["name"] = "hgx-a01"
    data["nodes"][8]["gpu"]["model"] = "X9"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["cluster", "plan", str(bad), "-o", str(out)])
    assert result.exit_code == 2
    assert "nodes.2.name" in result.output and "nodes.8.gpu.model" in result.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.shared
def test_the_cli_plans_the_example_with_crd_validation_and_json(tmp_path: Path) -> None:
    _needs_shared(KUEUE_CRDS)
    out = tmp_path / "out"
    args = ["cluster", "plan", str(EXAMPLE), "-o", str(out), "--crds", str(KUEUE_CRDS), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["gpus"] == {"H100": 64, "L40S": 8}
    assert all((out / f).is_file() for f in summary["files"])


def test_a_write_failing_half_way_leaves_the_old_plan_untouched(tmp_path: Path) -> None:
    from tensoryard.cluster.plan import Plan

    out = tmp_path / "plan"
    write_plan(Plan(files={"kueue/kueue.yaml": "old"}), out)
    # the second file cannot be created: its parent is the first file
    broken = Plan(files={"a.txt": "new", "a.txt/b.txt": "new"})
    with pytest.raises(ConfigError, match="nothing was changed"):
        write_plan(broken, out, force=True)
    assert (out / "kueue" / "kueue.yaml").read_text() == "old"
    assert not (out / "a.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]
