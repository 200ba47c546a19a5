"""The control plane's PostgreSQL image (`tyard images build postgres`): cached, non-root, its
entrypoint as the image's command, pushed like the matrix images. It runs for real in
tests/e2e_k8s/test_in_cluster.py (the control plane deployed from deploy/ keeps its state there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.integration.images.conftest import _unavailable
from typer.testing import CliRunner

from tensoryard.cli.main import app
from tensoryard.images.builder import TOOLS, BuildResult
from tensoryard.images.postgres import ENTRYPOINT, PGDATA, build_postgres


@pytest.fixture(scope="module")
def postgres_image() -> BuildResult:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        _unavailable(f"building images needs {', '.join(missing)}")
    if os.geteuid() != 0:
        _unavailable("building images needs root")
    return build_postgres()


def test_an_unchanged_image_is_not_rebuilt(postgres_image: BuildResult) -> None:
    again = build_postgres()
    assert again.cached and again.archive == postgres_image.archive
    assert again.layers == postgres_image.layers


def test_it_runs_its_entrypoint_as_a_non_root_numeric_user(postgres_image: BuildResult) -> None:
    inspected = subprocess.run(
        ["skopeo", "inspect", "--config", f"oci-archive:{postgres_image.archive}"],
        capture_output=True,
        text=True,
        check=True,
    )
    config = json.loads(inspected.stdout)["config"]
    uid, _, gid = config["User"].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit()  # runAsNonRoot can verify it
    assert config["Entrypoint"] == [ENTRYPOINT]
    assert f"PGDATA={PGDATA}" in config["Env"]
    assert "5432/tcp" in config["ExposedPorts"]


def test_the_cli_pushes_it_with_skopeo(postgres_image: BuildResult, tmp_path: Path) -> None:
    destination = f"oci:{tmp_path / 'layout'}:postgres"
    result = CliRunner().invoke(app, ["images", "push", "postgres", destination, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["destination"] == destination
    inspected = subprocess.run(
        ["skopeo", "inspect", destination], capture_output=True, text=True, check=True
    )
    assert json.loads(inspected.stdout)["Layers"] == postgres_image.layers
