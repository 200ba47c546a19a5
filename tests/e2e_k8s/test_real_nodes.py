"""Real nodes in the test cluster: kubelet, containerd, runc, CNI, kube-proxy and CoreDNS.

`scripts/k8s-testenv up --real-nodes 2` (the `k8s_env` fixture) starts two real nodes beside the
kwok ones; every pod here runs in a real container from the environment's test image (busybox),
tolerating the real nodes' taint and pinned to a node by name label. The node-failure test runs
last: it stops a node and starts it again.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e_k8s.conftest import (
    REAL_NODE_TOLERATION,
    SCRIPT,
    K8sEnv,
    wait_until,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def test_image() -> str:
    return subprocess.run(
        [SCRIPT, "test-image"], check=True, capture_output=True, text=True
    ).stdout.strip()


def pod(
    name: str,
    node: str,
    image: str,
    script: str,
    *,
    labels: dict[str, str] | None = None,
    memory: str | None = None,
    volume_claim: str | None = None,
    subdomain: str | None = None,
) -> dict[str, Any]:
    """A one-container pod on `node` running `script` under /bin/sh, never restarted."""
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", script],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [REAL_NODE_TOLERATION],
        "containers": [container],
    }
    if memory:
        container["resources"] = {"limits": {"memory": memory}, "requests": {"memory": memory}}
    if volume_claim:
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": volume_claim}}]
    if subdomain:
        spec["hostname"] = name
        spec["subdomain"] = subdomain
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def finished(core: Any, namespace: str, name: str) -> Any:
    """The pod once it has Succeeded or Failed, else None."""
    p = core.read_namespaced_pod(name, namespace)
    return p if p.status.phase in ("Succeeded", "Failed") else None


def describe(core: Any, namespace: str, name: str) -> str:
    p = core.read_namespaced_pod(name, namespace)
    try:
        logs = core.read_namespaced_pod_log(name, namespace)
    except Exception as exc:  # only for the failure message
        logs = f"(no log: {exc})"
    statuses = p.status.container_statuses
    return f"phase={p.status.phase} node={p.spec.node_name} statuses={statuses}\nlog:\n{logs}"


def run_to_end(core: Any, namespace: str, manifest: dict[str, Any], timeout: float = 90) -> Any:
    name = manifest["metadata"]["name"]
    core.create_namespaced_pod(namespace, manifest)
    return wait_until(
        lambda: finished(core, namespace, name), timeout=timeout, what=f"pod {name} to finish"
    )


def test_a_pod_runs_in_a_real_container_on_each_real_node(
    core: Any, namespace: str, real_nodes: list[str], test_image: str
) -> None:
    for node in real_nodes:
        manifest = pod(f"hello-{node}", node, test_image, "echo hello from $(hostname); exit 0")
        core.create_namespaced_pod(namespace, manifest)
    for node in real_nodes:
        name = f"hello-{node}"
        p = wait_until(
            lambda n=name: finished(core, namespace, n), timeout=90, what=f"pod {name} to finish"
        )
        assert p.status.phase == "Succeeded", describe(core, namespace, name)
        assert p.spec.node_name == node
        terminated = p.status.container_statuses[0].state.terminated
        assert terminated.exit_code == 0
        # A real container: its own hostname (the pod's name) and a pod address on the node's
        # CNI bridge, its output read back from the kubelet through the API server.
        assert core.read_namespaced_pod_log(name, namespace).strip() == f"hello from {name}"
        assert p.status.pod_ip and p.status.pod_ip.startswith("10.252.")


def test_headless_service_names_resolve_and_connect_across_nodes(
    core: Any, namespace: str, real_nodes: list[str], test_image: str
) -> None:
    """Two pods of a headless Service on two nodes find each other by DNS name (CoreDNS) and
    talk over TCP; a ClusterIP Service (kube-proxy) reaches one of them by its Service name."""
    service = "peers"
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": service},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "peer"},
                "ports": [{"name": "http", "port": 7000}],
            },
        },
    )
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "selector": {"peer": "a"},
                "ports": [{"name": "http", "port": 80, "targetPort": 7000}],
            },
        },
    )
    pods = {"a": real_nodes[0], "b": real_nodes[1]}
    for me, node in pods.items():
        peer = "b" if me == "a" else "a"
        peer_name = f"{peer}.{service}.{namespace}.svc.cluster.local"
        # Serve our name over HTTP; fetch the peer's by its DNS name (and, from b, a's through
        # the ClusterIP Service); keep serving a while so the peer can fetch ours too.
        script = f"""
fetch() {{ printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 "$1" "$2" 2>/dev/null | tail -n 1; }}
mkdir -p /tmp/www && echo "hello-from-$(hostname)" > /tmp/www/index.html
httpd -p 7000 -h /tmp/www
got=""
for i in $(seq 1 60); do
  got=$(fetch {peer_name} 7000)
  [ "$got" = "hello-from-{peer}" ] && break
  sleep 1
done
echo "peer says: $got"
nslookup {peer_name} | sed -n 's/^Address: /peer address: /p'
if [ "{me}" = b ]; then
  via=""
  for i in $(seq 1 30); do
    via=$(fetch web.{namespace}.svc.cluster.local 80)
    [ "$via" = "hello-from-a" ] && break
    sleep 1
  done
  echo "service says: $via"
fi
sleep 12
[ "$got" = "hello-from-{peer}" ]
"""
        core.create_namespaced_pod(
            namespace,
            pod(
                me, node, test_image, script, labels={"app": "peer", "peer": me}, subdomain="peers"
            ),
        )
    for me in pods:
        p = wait_until(
            lambda n=me: finished(core, namespace, n), timeout=150, what=f"pod {me} to finish"
        )
        assert p.status.phase == "Succeeded", describe(core, namespace, me)
    addresses = {me: core.read_namespaced_pod(me, namespace).status.pod_ip for me in pods}
    assert addresses["a"] != addresses["b"]
    assert {core.read_namespaced_pod(me, namespace).spec.node_name for me in pods} == set(
        real_nodes[:2]
    )
    for me in pods:
        peer = "b" if me == "a" else "a"
        log = core.read_namespaced_pod_log(me, namespace)
        assert f"peer says: hello-from-{peer}" in log, log
        # CoreDNS answered with the peer's pod address (from the headless Service's endpoints).
        assert f"peer address: {addresses[peer]}" in log, log
    assert "service says: hello-from-a" in core.read_namespaced_pod_log("b", namespace)


def test_a_volume_claim_binds_and_keeps_files_between_pods(
    api_client: Any, core: Any, namespace: str, real_nodes: list[str], test_image: str
) -> None:
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "work"},
            "spec": {
                "storageClassName": "tensoryard-local",
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "64Mi"}},
            },
        },
    )
    claim = wait_until(
        lambda: (
            (c := core.read_namespaced_persistent_volume_claim("work", namespace))
            and c.status.phase == "Bound"
            and c
        ),
        timeout=60,
        what="claim work to be Bound",
    )
    volume = claim.spec.volume_name
    writer = run_to_end(
        core,
        namespace,
        pod("writer", real_nodes[0], test_image, "echo step-42 > /data/ckpt", volume_claim="work"),
    )
    assert writer.status.phase == "Succeeded", describe(core, namespace, "writer")
    reader = run_to_end(
        core,
        namespace,
        pod("reader", real_nodes[1], test_image, "cat /data/ckpt", volume_claim="work"),
    )
    assert reader.status.phase == "Succeeded", describe(core, namespace, "reader")
    assert core.read_namespaced_pod_log("reader", namespace).strip() == "step-42"
    # Released with its claim: the provisioner deletes the volume (reclaimPolicy Delete).
    core.delete_namespaced_pod("writer", namespace, grace_period_seconds=0)
    core.delete_namespaced_pod("reader", namespace, grace_period_seconds=0)
    core.delete_namespaced_persistent_volume_claim("work", namespace)
    wait_until(
        lambda: volume not in {v.metadata.name for v in core.list_persistent_volume().items},
        timeout=60,
        what=f"volume {volume} to be deleted",
    )


def test_an_image_that_does_not_exist_is_reported_as_a_pull_error(
    core: Any, namespace: str, real_nodes: list[str]
) -> None:
    image = "localhost/tensoryard-does-not-exist:never"
    core.create_namespaced_pod(namespace, pod("nope", real_nodes[0], image, "true"))

    def pull_error() -> str | None:
        statuses = core.read_namespaced_pod("nope", namespace).status.container_statuses or []
        for status in statuses:
            waiting = status.state.waiting
            if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff"):
                return f"{waiting.reason}: {waiting.message}"
        return None

    started = time.monotonic()
    reason = wait_until(pull_error, timeout=60, what="ErrImagePull on pod nope")
    assert image in reason
    assert time.monotonic() - started < 60


def test_a_pod_over_its_memory_limit_is_oom_killed(
    core: Any, namespace: str, real_nodes: list[str], test_image: str
) -> None:
    hog = pod(
        "hog",
        real_nodes[-1],
        test_image,
        "exec dd if=/dev/zero of=/dev/null bs=256M count=1",
        memory="32Mi",
    )
    p = run_to_end(core, namespace, hog)
    terminated = p.status.container_statuses[0].state.terminated
    assert p.status.phase == "Failed", describe(core, namespace, "hog")
    assert terminated.reason == "OOMKilled", describe(core, namespace, "hog")
    assert terminated.exit_code == 137


@pytest.fixture
def env_dir(k8s_env: K8sEnv) -> Iterator[Any]:
    if k8s_env.dir is None:
        pytest.skip("an environment started elsewhere (TYARD_K8S_KUBECONFIG): its nodes stay up")
    yield k8s_env.dir


def test_a_stopped_kubelet_makes_its_node_not_ready_and_it_comes_back(
    core: Any, real_nodes: list[str], env_dir: Any
) -> None:
    node = real_nodes[-1]

    def ready() -> str:
        conditions = core.read_node(node).status.conditions or []
        return next((c.status for c in conditions if c.type == "Ready"), "Unknown")

    assert ready() == "True"
    stop = subprocess.run(
        [SCRIPT, "node-stop", node, "--dir", env_dir], capture_output=True, text=True, timeout=120
    )
    assert stop.returncode == 0, stop.stderr
    stopped = time.monotonic()
    try:
        # The test cluster's node-monitor grace period is 20 s (upstream: 50 s).
        wait_until(lambda: ready() != "True", timeout=60, what=f"node {node} NotReady")
        assert time.monotonic() - stopped < 45
        assert ready() == "Unknown"  # the node controller's verdict: the kubelet stopped posting
    finally:
        start = subprocess.run(
            [SCRIPT, "node-start", node, "--dir", env_dir],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert start.returncode == 0, start.stderr
    assert ready() == "True"
