"""The rendered platform manifests pass the real API server's validation (server-side dry-run).

Prometheus Operator kinds (ServiceMonitor, PodMonitor, PrometheusRule) are left out here: the test
control plane has no Prometheus Operator CRDs; tests/unit/cluster/test_cluster_deploy.py checks
them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_k8s.conftest import K8sEnv
from tests.unit.cluster.deploy_render import render

pytestmark = pytest.mark.slow
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def kubectl(env: K8sEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(env.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def platform_namespace(api_client: Any) -> Iterator[str]:
    from kubernetes import client

    # Namespaced objects can only be dry-run into a namespace that exists.
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": "tensoryard"}})
    yield "tensoryard"
    core.delete_namespace("tensoryard", propagation_policy="Background")


@pytest.mark.parametrize("overlay", ["dev", "production"])
def test_every_rendered_object_passes_a_server_side_dry_run(
    overlay: str, k8s_env: K8sEnv, platform_namespace: str, tmp_path: Path
) -> None:
    objects = [
        o for o in render(overlay, tmp_path) if o["kind"] not in OPERATOR_KINDS | {"Namespace"}
    ]
    manifest = tmp_path / "all.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    done = kubectl(k8s_env, "apply", "--server-side", "--dry-run=server", "-f", str(manifest))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("(server dry run)") == len(objects)
