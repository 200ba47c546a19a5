"""Grafana dashboards: up to date with their generator, every panel query parses (promtool checks
it as a recording rule) and uses only defined metric names."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from _promql import ALLOWED, metric_names

GRAFANA = Path(__file__).resolve().parents[3] / "deploy" / "grafana"
DASHBOARDS = sorted(GRAFANA.glob("*.json"))
PROMTOOL = shutil.which("promtool")


def _exprs() -> list[tuple[str, str]]:
    """(dashboard / panel title, PromQL) for every panel target."""
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in board["panels"]:
            for target in panel["targets"]:
                out.append((f"{path.name} / {panel['title']}", target["expr"]))
    return out


def _concrete(expr: str) -> str:
    """Grafana variables replaced by values Prometheus accepts."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\w+", "x", expr)


def test_the_three_dashboards_are_what_build_py_writes(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("grafana_build", GRAFANA / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    build.HERE = tmp_path
    build.main()
    assert [p.name for p in DASHBOARDS] == sorted(p.name for p in tmp_path.glob("*.json"))
    for path in DASHBOARDS:
        assert path.read_text() == (tmp_path / path.name).read_text(), f"rerun build.py: {path}"


def test_panels_use_only_defined_metric_names():
    assert len(_exprs()) > 40
    for where, expr in _exprs():
        unknown = metric_names(_concrete(expr)) - ALLOWED
        assert not unknown, f"{where}: undefined metrics {unknown}"


def test_variable_queries_use_defined_metric_names():
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] == "query":
                metric = re.match(r"label_values\((\w+),", var["definition"])
                assert metric and metric.group(1) in ALLOWED, f"{path.name}: {var['definition']}"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_every_panel_query_parses(tmp_path: Path):
    rules = [
        {"record": f"tyard_dashboard:panel_{i}", "expr": _concrete(expr)}
        for i, (_, expr) in enumerate(_exprs())
    ]
    path = tmp_path / "dashboards.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    done = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
