"""deploy/kubernetes (base) and deploy/kubernetes-overlays render, and the PrometheusRule holds
exactly the alert rules of deploy/prometheus/rules, valid for promtool."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.unit.cluster.deploy_render import DEPLOY, render

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def test_the_dev_overlay_runs_one_replica_with_a_generated_database_secret(tmp_path: Path) -> None:
    objects = render("dev", tmp_path)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Secret", "tensoryard-db") in kinds and ("Namespace", "tensoryard") in kinds
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "tensoryard-control-plane"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    db_url = env["TYARD_DB_URL"]["valueFrom"]["secretKeyRef"]
    assert db_url == {"name": "tensoryard-db", "key": "url"}
    # The Kubernetes executor, its run directories on the runs claim the base ships, mounted at
    # the server's runs directory; its home on a claim the replicas share; the images' user.
    args = pod["containers"][0]["args"]
    assert "--executor=kubernetes" in args and "--namespace=tensoryard" in args
    assert "--public-url=http://tensoryard-server.tensoryard.svc:8642" in args
    claims = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    assert {"tensoryard-home", "tensoryard-runs"} <= set(claims)
    assert all(c["spec"]["accessModes"] == ["ReadWriteMany"] for c in claims.values())
    assert "--runs-claim=tensoryard-runs" in args and "--home=/var/lib/tensoryard" in args
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == "tensoryard-runs"
    assert mounts["runs"] == "/var/lib/tensoryard/runs"
    assert volumes["home"]["persistentVolumeClaim"]["claimName"] == "tensoryard-home"
    assert pod["securityContext"]["runAsUser"] == 1000
    # Its PostgreSQL, from tensoryard's image, its password from the same Secret.
    postgres = next(o for o in objects if o["kind"] == "StatefulSet")
    container = postgres["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("tensoryard/postgres:")
    pg_env = {e["name"]: e for e in container["env"]}
    ref = pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "tensoryard-db", "key": "password"}
    assert ("Service", "postgres") in kinds
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    assert all(
        o["metadata"].get("namespace") == "tensoryard"
        for o in objects
        if o["kind"] not in cluster_scoped
    )
    binding = next(o for o in objects if o["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "tensoryard"
    # scheduler settings: a generated ConfigMap (hashed name, so an edit rolls the pods),
    # mounted where --scheduler-config reads it
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    assert config_map["metadata"]["name"].startswith("tensoryard-scheduler-")
    assert "scheduler.yaml" in config_map["data"]
    volume = next(v for v in pod["volumes"] if v["name"] == "scheduler")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "scheduler")
    arg = "--scheduler-config=" + mount["mountPath"] + "/scheduler.yaml"
    assert arg in pod["containers"][0]["args"]


def test_the_production_overlay_adds_replicas_and_prometheus_operator_objects(
    tmp_path: Path,
) -> None:
    objects = render("production", tmp_path)
    kinds = [o["kind"] for o in objects]
    assert "Secret" not in kinds, "production reads a Secret created out of band"
    assert {"ServiceMonitor", "PrometheusRule", "PodDisruptionBudget"} <= set(kinds)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3


def test_the_agent_daemonset_is_scraped_as_the_rules_and_the_plan_expect(tmp_path: Path) -> None:
    from tensoryard.cluster.prometheus import prometheus_config
    from tensoryard.executors.kubernetes.nodes import TAINT_KEY

    objects = render("production", tmp_path)
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    monitor = next(o for o in objects if o["kind"] == "PodMonitor")
    pod = daemonset["spec"]["template"]
    labels = pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # The PodMonitor selects the agent's pods and port; its job label is the pod's name label,
    # `tensoryard-agent`, the job deploy/prometheus/rules (TensoryardAgentDown) looks for.
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert ports[endpoint["port"]] == 9410
    assert labels[monitor["spec"]["jobLabel"]] == "tensoryard-agent"
    rules = (DEPLOY / "prometheus" / "rules" / "platform.yml").read_text()
    assert 'up{job="tensoryard-agent"}' in rules
    # `tyard cluster plan`'s prometheus.yml keeps the same pods and port.
    job = next(
        j for j in prometheus_config()["scrape_configs"] if j["job_name"] == "tensoryard-agent"
    )
    keep = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if "regex" in r}
    assert (
        keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)]
        == labels["app.kubernetes.io/name"]
    )
    assert keep[("__meta_kubernetes_pod_container_port_name",)] in ports
    # Both make the node's name the agent's `instance` (and `node`): what a drain names.
    for relabels in (job["relabel_configs"], endpoint["relabelings"]):
        targets = {
            r.get("target_label", r.get("targetLabel")): r.get(
                "source_labels", r.get("sourceLabels")
            )
            for r in relabels
        }
        assert targets["instance"] == targets["node"] == ["__meta_kubernetes_pod_node_name"]
    # On GPU nodes only, and still there when tensoryard cordons the node.
    (term,) = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    ]
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not pod["spec"].get("hostNetwork") and not pod["spec"].get("hostPID")


def test_the_prometheus_rule_is_up_to_date_and_passes_promtool(tmp_path: Path) -> None:
    build = DEPLOY / "kubernetes-overlays" / "monitoring" / "build.py"
    check = subprocess.run([sys.executable, str(build), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    rule = yaml.safe_load((build.parent / "prometheusrule.yaml").read_text())
    sources = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
    expected = [g for p in sources for g in yaml.safe_load(p.read_text())["groups"]]
    assert rule["spec"]["groups"] == expected
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(
        ["promtool", "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
