"""Server settings that cannot work are refused before anything is created, naming the option
and the fix; GPU engines asked of a control plane without Kubernetes are refused naming
`engine` (tests/integration/serving/test_serving_gpu_gateway.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoryard.errors import ConfigError
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import build_control_plane


def test_node_netns_needs_two_local_nodes(tmp_path: Path, migrated_sqlite_url: str) -> None:
    config = ServerConfig(
        home=tmp_path / "home", db_url=migrated_sqlite_url, node_netns=True, local_nodes=("n1",)
    )
    with pytest.raises(ConfigError, match="--node-netns needs --local-nodes with at least two"):
        build_control_plane(config)


def test_node_netns_without_root_says_so(
    tmp_path: Path, migrated_sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    config = ServerConfig(
        home=tmp_path / "home",
        db_url=migrated_sqlite_url,
        node_netns=True,
        local_nodes=("n1", "n2"),
    )
    with pytest.raises(ConfigError, match="--node-netns: network namespaces need root"):
        build_control_plane(config)
