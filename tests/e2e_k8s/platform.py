"""tensoryard's control plane against the test cluster, as a user and an operator run it.

`control_plane_kubeconfig` applies deploy/kubernetes/rbac.yaml (for one namespace) and writes a
kubeconfig holding a token of its ServiceAccount: the control plane in these tests runs with
that least-privilege identity, never as cluster-admin. `start_server` runs `tyard server
--executor kubernetes` in a subprocess on a free port; `tyard` runs the CLI like a user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ServerProcess, free_port
from tests.e2e_k8s.conftest import REPO, K8sEnv

RBAC = REPO / "deploy" / "kubernetes" / "rbac.yaml"
SERVICE_ACCOUNT = "tensoryard-control-plane"
# kwok completes Job pods 1-5 s after they run; these make them run for `seconds` instead.
COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
COMPLETE_JITTER = "pod-complete.stage.kwok.x-k8s.io/jitter-delay"
UNPULLABLE_IMAGE = "registry.invalid/tensoryard/unpullable:test"  # see scripts/k8s-testenv
IMAGE = "registry.invalid/tensoryard/trainer:test"


def kubectl(
    env: K8sEnv, *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """kubectl against the test control plane; a failure fails the test with its output."""
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(env.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def rbac_objects(namespace: str) -> list[dict[str, Any]]:
    """deploy/kubernetes/rbac.yaml for `namespace` (cluster-scoped names suffixed with it)."""
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    for doc in docs:
        meta = doc["metadata"]
        if "namespace" in meta:
            meta["namespace"] = namespace
        else:
            meta["name"] = f"{meta['name']}-{namespace}"
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = f"{doc['roleRef']['name']}-{namespace}"
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
    return docs


def apply_rbac(api_client: Any, namespace: str) -> None:
    from kubernetes import client

    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    for doc in rbac_objects(namespace):
        kind = doc["kind"]
        if kind == "ServiceAccount":
            core.create_namespaced_service_account(namespace, doc)
        elif kind == "ClusterRole":
            rbac.create_cluster_role(doc)
        elif kind == "ClusterRoleBinding":
            rbac.create_cluster_role_binding(doc)
        elif kind == "Role":
            rbac.create_namespaced_role(namespace, doc)
        elif kind == "RoleBinding":
            rbac.create_namespaced_role_binding(namespace, doc)
        else:
            raise AssertionError(f"rbac.yaml holds an unexpected {kind}")


def delete_cluster_rbac(api_client: Any, namespace: str) -> None:
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api_client)
    for doc in rbac_objects(namespace):
        if doc["kind"] == "ClusterRole":
            rbac.delete_cluster_role(doc["metadata"]["name"])
        elif doc["kind"] == "ClusterRoleBinding":
            rbac.delete_cluster_role_binding(doc["metadata"]["name"])


def token_kubeconfig(
    admin_kubeconfig: Path, api_client: Any, namespace: str, account: str, path: Path
) -> Path:
    """A kubeconfig that authenticates as ServiceAccount `account` (a TokenRequest token)."""
    from kubernetes import client

    token = (
        client.CoreV1Api(api_client)
        .create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 3600}}
        )
        .status.token
    )
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": account}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def start_server(
    home: Path, kubeconfig: Path, namespace: str, *extra: str
) -> tuple[ServerProcess, Any]:
    """`tyard server --executor kubernetes` for the nodes of this test's pool."""
    home.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(
        home=home,
        port=free_port(),
        extra_args=[
            "--executor",
            "kubernetes",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            namespace,
            "--node-selector",
            f"tensoryard.io/test-pool={namespace}",
            "--cancel-grace",
            "2",
            *extra,
        ],
    )
    return server, server.start()


def tyard(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI against `server` like a user; never raises on a non-zero exit."""
    env = {
        **os.environ,
        "TYARD_SERVER": server.url,
        "TYARD_TOKEN": (server.home / "admin.token").read_text().strip(),
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "tensoryard.cli.main", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def job_spec(
    path: Path,
    *,
    nodes: int = 2,
    gpus: int = 8,
    image: str = IMAGE,
    checkpoint_dir: str | None = None,
) -> Path:
    spec = {
        "name": "pretrain",
        "image": image,
        "command": ["python", "-m", "train", "--steps", "100"],
        "env": {"WANDB_MODE": "offline"},
        "resources": {"nodes": nodes, "gpus_per_node": gpus},
        "restart": {"max_restarts": 2, "backoff": "0s"},
        "scheduling": {"topology": "required"},
    }
    if checkpoint_dir is not None:  # e.g. on the pods' shared volume
        spec["checkpoint"] = {"dir": checkpoint_dir}
    path.write_text(yaml.safe_dump(spec))
    return path
