"""The alert rules in deploy/prometheus: promtool accepts them, their unit tests pass, and they
use only metrics tensoryard, the DCGM exporter, node_exporter or Prometheus define."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from _promql import ALLOWED, metric_names

from tensoryard.observability.gpu import FATAL_XIDS

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"
RULES = sorted((DEPLOY / "rules").glob("*.yml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)"
)


def _all_rules() -> list[dict]:
    return [r for f in RULES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def _rules() -> list[dict]:
    """The alerting rules."""
    return [r for r in _all_rules() if "alert" in r]


def _records() -> list[dict]:
    return [r for r in _all_rules() if "record" in r]


@needs_promtool
def test_promtool_accepts_the_rules():
    done = subprocess.run([PROMTOOL, "check", "rules", *RULES], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_rule_unit_tests_pass():
    tests = sorted((DEPLOY / "tests").glob("*.yml"))
    assert len(tests) == len(RULES)
    done = subprocess.run(
        [PROMTOOL, "test", "rules", *tests], capture_output=True, text=True, cwd=DEPLOY / "tests"
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_accepts_the_prometheus_config():
    done = subprocess.run(
        [PROMTOOL, "check", "config", "prometheus.yml"], capture_output=True, text=True, cwd=DEPLOY
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_case():
    tests = "\n".join(f.read_text() for f in (DEPLOY / "tests").glob("*.yml"))
    for rule in _rules():
        assert f"alertname: {rule['alert']}\n" in tests, rule["alert"]


def test_rules_use_only_defined_metric_names():
    for rule in _rules():
        unknown = metric_names(rule["expr"]) - ALLOWED
        assert not unknown, f"{rule['alert']} uses undefined metrics {unknown}"


def test_every_rule_has_severity_health_action_and_summary():
    for rule in _rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["labels"]["health_action"] in {"drain_node", "restart_job", "notify"}
        assert rule["annotations"]["summary"], rule["alert"]


def test_the_fatal_xid_rule_and_the_collector_agree():
    rule = next(r for r in _rules() if "tyard_gpu_xid_errors_total" in r["expr"])
    listed = re.search(r'xid=~"([0-9|]+)"', rule["expr"])
    assert listed is not None
    assert tuple(int(x) for x in listed.group(1).split("|")) == FATAL_XIDS
    dcgm = next(r for r in _rules() if "DCGM_FI_DEV_XID_ERRORS" in r["expr"])
    assert tuple(int(x) for x in re.findall(r"== (\d+)", dcgm["expr"])) == FATAL_XIDS


def test_the_name_extractor_sees_names_not_functions_labels_or_keywords():
    expr = (
        'sum by (job) (rate(foo_total{a="b c"}[5m])) / on (job) group_left '
        "bar > 0.3 and baz offset 5m or histogram_quantile(0.9, x_bucket)"
    )
    assert metric_names(expr) == {"foo_total", "bar", "baz", "x_bucket"}


def test_recording_rules_record_declared_names_from_defined_metrics():
    records = _records()
    assert records, "rules/k8s.yml records the DCGM join"
    for rule in records:
        assert rule["record"] in ALLOWED, f"{rule['record']} is not declared in metrics.DCGM_JOINED"
        unknown = metric_names(rule["expr"]) - ALLOWED
        assert not unknown, f"{rule['record']} uses undefined metrics {unknown}"


def test_every_recording_rule_has_a_unit_test_case():
    tests = "\n".join(f.read_text() for f in (DEPLOY / "tests").glob("*.yml"))
    for rule in _records():
        assert rule["record"] in tests, rule["record"]
