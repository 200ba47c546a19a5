"""Render the Kustomize overlays in deploy/ for tests (shared by unit and e2e tests)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
# deploy/kubernetes/rbac.yaml comes with the Kubernetes executor (another change). Until it is
# in this checkout, renders use this stand-in: only the ServiceAccount the Deployment names.
RBAC_STAND_IN = {
    "apiVersion": "v1",
    "kind": "ServiceAccount",
    "metadata": {"name": "tensoryard-control-plane"},
}


def render(overlay: str, workdir: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize deploy/kubernetes-overlays/<overlay>` on a copy of deploy/."""
    copy = workdir / "deploy"
    shutil.copytree(DEPLOY / "kubernetes", copy / "kubernetes")
    shutil.copytree(DEPLOY / "kubernetes-overlays", copy / "kubernetes-overlays")
    rbac = copy / "kubernetes" / "rbac.yaml"
    if not rbac.exists():
        rbac.write_text(yaml.safe_dump(RBAC_STAND_IN))
    done = subprocess.run(
        ["kubectl", "kustomize", str(copy / "kubernetes-overlays" / overlay)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]
