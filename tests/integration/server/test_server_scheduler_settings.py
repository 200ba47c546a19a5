"""`tyard server --scheduler-config FILE --scheduler KEY=VALUE` reaches the scheduling core
the control plane runs (the leader's `CorePolicy`), and the deployed ConfigMap's file parses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli
from tensoryard.scheduler import SchedulerConfig
from tensoryard.scheduler.config import load_scheduler_config
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import build_control_plane
from tensoryard.server.scheduling import CorePolicy

REPO = Path(__file__).resolve().parents[3]


def test_scheduler_settings_reach_the_control_planes_scheduler(
    tmp_path: Path, migrated_sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[ServerConfig] = []

    def fake_run_server(config: ServerConfig, **_: Any) -> None:
        started.append(config)

    monkeypatch.setattr("tensoryard.server.main.run_server", fake_run_server)
    settings = tmp_path / "scheduler.yaml"
    settings.write_text("scheduler:\n  reclaim_min_run_s: 300\n  preemption_grace_s: 45\n")
    result = CliRunner().invoke(
        cli,
        ["server", "--home", str(tmp_path / "home"), "--db-url", migrated_sqlite_url,
         "--scheduler-config", str(settings), "--scheduler", "preemption_grace_s=20",
         "--scheduler", "defragment=false"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "scheduler settings (not the defaults): reclaim_min_run_s=300.0, " in result.output
    (config,) = started
    plane = build_control_plane(config)
    try:
        policy = plane.controller.policy
        assert isinstance(policy, CorePolicy)
        core = policy.scheduler.config
        assert (core.reclaim_min_run_s, core.preemption_grace_s, core.defragment) == (
            300.0,
            20.0,
            False,
        )
        assert core.fair_share_half_life_s == SchedulerConfig().fair_share_half_life_s
    finally:
        plane.store.close()


def test_without_settings_the_control_plane_runs_the_default_policy(
    tmp_path: Path, migrated_sqlite_url: str
) -> None:
    plane = build_control_plane(ServerConfig(home=tmp_path / "home", db_url=migrated_sqlite_url))
    try:
        policy = plane.controller.policy
        assert isinstance(policy, CorePolicy)
        assert policy.scheduler.config == SchedulerConfig()
    finally:
        plane.store.close()


def test_the_deployed_settings_file_parses_to_the_defaults() -> None:
    # deploy/kubernetes/scheduler.yaml becomes the ConfigMap the Deployment mounts; as shipped it
    # sets nothing (every key commented), so a cluster runs the documented defaults
    shipped = REPO / "deploy" / "kubernetes" / "scheduler.yaml"
    assert load_scheduler_config(shipped) == SchedulerConfig()
    for line in shipped.read_text().splitlines():
        key = line.strip().lstrip("#").strip().split(":")[0]
        if line.startswith("  # ") and key:
            assert hasattr(SchedulerConfig(), key), f"{shipped} names unknown setting {key!r}"
