"""`tyard cluster plan` output applied to the real Kubernetes control plane: the Kueue CRDs are
installed as Kueue ships them (the API server enforces their schemas and CEL rules), the node
labels and taints are applied server-side to kwok nodes, the Kueue objects are created, and the
scheduler's view of the labelled nodes carries the switch and block the inventory declared."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tensoryard.cluster import build_plan, parse_inventory, write_plan
from tensoryard.cluster.labels import node_from_labels
from tests.e2e_k8s.conftest import K8sEnv, fake_gpu_node, wait_until
from tests.e2e_k8s.platform import kubectl
from tests.shared_data import missing_shared

pytestmark = [pytest.mark.slow, pytest.mark.shared]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cluster" / "inventory.yaml"
KUEUE_CRDS = REPO.parent / "shared" / "k8s" / "crds" / "kueue"
USED = ("topologies", "resourceflavors", "workloadpriorityclasses", "cohorts", "clusterqueues")
USED += ("localqueues",)


@pytest.fixture(scope="module")
def kueue_crds(k8s_env: K8sEnv) -> None:
    if not KUEUE_CRDS.is_dir():
        missing_shared(f"{KUEUE_CRDS} is absent; clone ../shared to run this test")
    for name in USED:
        kubectl(
            k8s_env, "apply", "--server-side", "-f", str(KUEUE_CRDS / f"kueue.x-k8s.io_{name}.yaml")
        )
    for name in USED:
        kubectl(k8s_env, "wait", "--for=condition=Established", f"crd/{name}.kueue.x-k8s.io")


@pytest.fixture
def plan_dir(namespace: str, tmp_path: Path) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["cluster"]["namespace"] = namespace  # LocalQueues go to the test's namespace
    for node in data["nodes"]:
        node["name"] = f"{namespace}-{node['name']}"
    return write_plan(build_plan(parse_inventory(data)), tmp_path / "plan")


@pytest.fixture
def registered_nodes(core: Any, plan_dir: Path) -> Iterator[list[str]]:
    """The plan's nodes as a kubelet would register them: no tensoryard labels yet."""
    names = [
        d["metadata"]["name"] for d in yaml.safe_load_all((plan_dir / "nodes.yaml").read_text())
    ]
    for name in names:
        node = fake_gpu_node(name, pool="cluster-plan")
        node["spec"] = {}
        core.create_node(node)
    yield names
    for name in names:
        core.delete_node(name)


def test_the_plan_applies_to_the_real_api_server_and_feeds_placement(
    k8s_env: K8sEnv,
    kueue_crds: None,
    core: Any,
    api_client: Any,
    plan_dir: Path,
    registered_nodes: list[str],
    namespace: str,
) -> None:
    from kubernetes import client

    kubectl(
        k8s_env,
        "apply",
        "--server-side",
        "--field-manager=tyard-cluster-plan",
        "-f",
        str(plan_dir / "nodes.yaml"),
    )
    kubectl(
        k8s_env,
        "apply",
        "--server-side",
        "--field-manager=tyard-cluster-plan",
        "-f",
        str(plan_dir / "kueue" / "kueue.yaml"),
    )

    node = core.read_node(registered_nodes[4])  # hgx-b01: rack r02, leaf-02, block-a
    taints = [(t.key, t.value, t.effect) for t in node.spec.taints]
    assert taints == [("nvidia.com/gpu", "present", "NoSchedule")]
    seen = node_from_labels(node.metadata.name, node.metadata.labels, node.status.allocatable)
    assert (seen.switch, seen.block, seen.gpu_model, seen.gpus_total) == (
        "leaf-02",
        "block-a",
        "H100",
        8,
    )

    custom = client.CustomObjectsApi(api_client)
    queue = custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", "nlp")
    gpu = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": 16, "borrowingLimit": 24}
    local = custom.list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", namespace, "localqueues"
    )
    assert sorted(o["spec"]["clusterQueue"] for o in local["items"]) == ["eval", "nlp", "pretrain"]
    wait_until(
        lambda: custom.get_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "topologies", "tensoryard-topology"
        ),
        timeout=10,
        what="topology",
    )


def test_the_api_server_rejects_limits_kueue_forbids_outside_a_cohort(
    k8s_env: K8sEnv, kueue_crds: None, tmp_path: Path
) -> None:
    # The generator leaves borrowingLimit out for queues without a cohort; this is why.
    queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "no-cohort-borrowing"},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "gpu-h100",
                            "resources": [
                                {"name": "nvidia.com/gpu", "nominalQuota": 8, "borrowingLimit": 8}
                            ],
                        }
                    ],
                }
            ]
        },
    }
    path = tmp_path / "cq.yaml"
    path.write_text(yaml.safe_dump(queue))
    done = kubectl(
        k8s_env, "apply", "--server-side", "--dry-run=server", "-f", str(path), check=False
    )
    assert done.returncode != 0
    assert "borrowingLimit must be nil when cohort is empty" in done.stderr
