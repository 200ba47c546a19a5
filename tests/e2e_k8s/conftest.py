"""A real Kubernetes control plane for the tests in this folder.

`k8s_env` (package scope) starts `scripts/k8s-testenv up` in a temporary directory on free
loopback ports and stops it after this folder's last test, or reuses the environment whose
kubeconfig is named by TYARD_K8S_KUBECONFIG. When the binaries are not built the tests skip, naming
`scripts/k8s-testenv build`; with CI set and TYARD_K8S_REQUIRED=1 they fail instead.

Everything is real (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the JobSet
controller) except nodes and pod lifecycles, which kwok simulates: `gpu_nodes` creates fake
GPU nodes that kwok keeps Ready, and kwok moves pods bound to them to Running (and Job pods on to
Succeeded). Beside them `k8s_env` starts TYARD_K8S_REAL_NODES (default 3) real nodes (kubelet,
containerd, CNI, kube-proxy, CoreDNS; `up --real-nodes`), tainted so that only pods tolerating
REAL_NODE_TOLERATION run there; `real_nodes` names them.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s-testenv"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
PORTS_PER_ENV = 15  # see the port list at the top of scripts/k8s-testenv

GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
POOL_LABEL = "tensoryard.io/test-pool"

T = TypeVar("T")


def _unavailable(message: str) -> None:
    if os.environ.get("CI") and os.environ.get("TYARD_K8S_REQUIRED") == "1":
        pytest.fail(f"the Kubernetes test environment is required: {message}", pytrace=False)
    pytest.skip(f"Kubernetes test environment unavailable: {message}")


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux; a default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _free_port_base() -> int:
    """The first of PORTS_PER_ENV consecutive loopback ports that are all free right now.

    Chosen outside the ephemeral range: there the components' own outgoing connections (the
    API server has hundreds open to etcd) could take a port before its listener binds it.
    """
    low, high = _ephemeral_ports()
    candidates = [
        b for b in range(20000, 60000 - PORTS_PER_ENV) if b + PORTS_PER_ENV <= low or b > high
    ]
    if not candidates:
        candidates = list(range(20000, 60000 - PORTS_PER_ENV))
    for _ in range(50):
        base = random.choice(candidates)
        try:
            for port in range(base, base + PORTS_PER_ENV):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free range of loopback ports found")


@dataclass(frozen=True)
class K8sEnv:
    kubeconfig: Path
    dir: Path | None  # None when reusing an environment started elsewhere


@pytest.fixture(scope="package")
def k8s_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sEnv]:
    """The kubeconfig of a running control plane (started for this folder's tests unless
    reused)."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        _unavailable("the `kubernetes` client is not installed: pip install -e '.[k8s]'")
    reused = os.environ.get("TYARD_K8S_KUBECONFIG")
    if reused:
        # An environment of `scripts/k8s-testenv up` keeps its kubeconfig in its directory.
        parent = Path(reused).resolve().parent
        yield K8sEnv(
            kubeconfig=Path(reused), dir=parent if (parent / "port-base").is_file() else None
        )
        return
    yield from _environment(tmp_path_factory, "k8s-testenv", "--real-nodes", _real_nodes_wanted())


REAL_NODE_LABEL = "tensoryard.io/real-node"
REAL_NODE_TOLERATION = {"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
REAL_NODE_BINARIES = ("kubelet", "kube-proxy", "coredns")


def _real_nodes_wanted() -> str:
    """How many real nodes (kubelet + containerd) `k8s_env` starts: TYARD_K8S_REAL_NODES
    (default 3: a gang of two has a spare), none when they are not built or this is not root
    (the real-node tests then report why)."""
    wanted = os.environ.get("TYARD_K8S_REAL_NODES", "3")
    if os.geteuid() != 0 or any(not (_bin_dir() / b).is_file() for b in REAL_NODE_BINARIES):
        return "0"
    return wanted


def _bin_dir() -> Path:
    return Path(
        subprocess.run(
            [SCRIPT, "bin-dir"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )


def _environment(
    tmp_path_factory: pytest.TempPathFactory, name: str, *up_args: str
) -> Iterator[K8sEnv]:
    """`scripts/k8s-testenv up` in a fresh directory on free ports; `down` afterwards."""
    bin_dir = _bin_dir()
    missing = [name for name in REQUIRED_BINARIES if not (bin_dir / name).is_file()]
    if missing:
        _unavailable(
            f"{', '.join(missing)} not built in {bin_dir}: run `scripts/k8s-testenv build` "
            "(about 35 min on a cold Go cache with 2 busy cores; under a second when built)"
        )
    # Two tries: the free port base is chosen before the components bind their ports, and
    # once (CI, 2026-12-04) kwok exited at start with an empty log; a second environment on
    # other ports is cheaper than 31 errors.
    for tries_left in (1, 0):
        env_dir = tmp_path_factory.mktemp(name)
        env = {**os.environ, "TYARD_K8S_PORT_BASE": str(_free_port_base())}
        up = subprocess.run(
            [SCRIPT, "up", "--dir", env_dir, *up_args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if up.returncode == 0 or not tries_left:
            break
        subprocess.run(
            [SCRIPT, "down", "--dir", env_dir], env=env, capture_output=True, timeout=120
        )
    try:
        if up.returncode != 0:
            pytest.fail(
                f"scripts/k8s-testenv up failed (logs in {env_dir}/logs):\n{up.stderr[-4000:]}",
                pytrace=False,
            )
        yield K8sEnv(kubeconfig=env_dir / "kubeconfig", dir=env_dir)
    finally:
        subprocess.run(
            [SCRIPT, "down", "--dir", env_dir], env=env, capture_output=True, timeout=120
        )
        # The real nodes' containerd roots hold the imported CPU image, ~6 GB per node: freed
        # as the package's tests end, not when the session does (the image tests after these
        # import and push it again). The logs stay for a failure's reader.
        for node in (env_dir / "nodes").glob("*/containerd"):
            shutil.rmtree(node, ignore_errors=True)


@pytest.fixture(scope="package")
def k8s_kueue_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sEnv]:
    """A second control plane with the Kueue controller (`up --kueue`), for the tests of
    Kueue admission: Kueue's webhooks would otherwise sit in front of every other test's Jobs."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        _unavailable("the `kubernetes` client is not installed: pip install -e '.[k8s]'")
    if not (_bin_dir() / "kueue").is_file():
        _unavailable("kueue is not built: run `scripts/k8s-testenv build`")
    yield from _environment(tmp_path_factory, "k8s-kueue-env", "--kueue", "--real-nodes", "0")


@pytest.fixture
def servers() -> Iterator[list[Any]]:
    """Control planes a test started (`tests.e2e.conftest.ServerProcess`), stopped after it."""
    started: list[Any] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture(scope="package")
def api_client(k8s_env: K8sEnv) -> Iterator[Any]:
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(k8s_env.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def core(api_client: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client)


@pytest.fixture
def namespace(core: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = f"t-{secrets.token_hex(4)}"
    core.create_namespace({"metadata": {"name": name}})
    wait_until(lambda: _default_service_account(core, name), timeout=60, what=f"{name}/default SA")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def _default_service_account(core: Any, namespace: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        core.read_namespaced_service_account("default", namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def fake_gpu_node(name: str, pool: str, gpus: int = 8) -> dict[str, Any]:
    """A Node that kwok manages (annotation kwok.x-k8s.io/node=fake), shaped like a DGX H100."""
    resources = {
        "cpu": "224",
        "memory": "2000Gi",
        "pods": "110",
        "ephemeral-storage": "30Ti",
        "nvidia.com/gpu": str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": str(gpus),
                POOL_LABEL: pool,
            },
        },
        "spec": {"taints": [GPU_TAINT]},
        "status": {"capacity": resources, "allocatable": resources},
    }


@pytest.fixture
def gpu_nodes(core: Any, namespace: str) -> Iterator[Callable[[int], list[str]]]:
    """Create N fake 8-GPU nodes in a pool of their own (label POOL_LABEL=<namespace>).

    Returns the node names once kwok reports them Ready; they are deleted after the test.
    """
    created: list[str] = []

    def make(count: int) -> list[str]:
        names = [f"{namespace}-gpu-{i}" for i in range(count)]
        for name in names:
            core.create_node(fake_gpu_node(name, pool=namespace))
            created.append(name)
        for name in names:
            wait_until(lambda n=name: _node_ready(core, n), timeout=60, what=f"node {name} Ready")
        return names

    yield make
    # Pods first (at once: nothing runs in them), so none is left behind on a deleted node.
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    for name in created:
        core.delete_node(name)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class HeartbeatNode:
    """A fake GPU node that kwok does not manage: this object is its kubelet, so a test can
    break it. While alive it renews the node's Lease and Ready condition every `interval_s`
    and moves the pods bound to it to Running (what kwok does for its own nodes, which it
    keeps Ready whatever happens). `stop()` stops posting: the controller-manager marks the
    node Unknown after its grace period (20 s in scripts/k8s-testenv) and taints it
    unreachable, as for a node whose kubelet died. `not_ready()` posts Ready=False first, as a
    kubelet that says its node is not ready (KubeletNotReady), then stops."""

    def __init__(self, core: Any, name: str, pool: str, *, interval_s: float = 2.0) -> None:
        from kubernetes import client

        self.core, self.name, self.interval_s = core, name, interval_s
        self.leases = client.CoordinationV1Api(core.api_client)
        self._stop = threading.Event()
        node = fake_gpu_node(name, pool)
        del node["metadata"]["annotations"]["kwok.x-k8s.io/node"]  # not kwok's to keep Ready
        node["metadata"]["labels"]["type"] = "heartbeat"
        uid = core.create_node(node).metadata.uid
        self.leases.create_namespaced_lease(
            "kube-node-lease",
            {
                "metadata": {
                    "name": name,
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
                    ],
                },
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40},
            },
        )
        self._beat()
        self._thread = threading.Thread(target=self._run, name=f"kubelet {name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
            except Exception:  # an API hiccup: the next beat tries again, as a kubelet does
                continue

    def _ready(self, status: str, reason: str, message: str) -> None:
        now = _now()
        node = self.core.read_node_status(self.name)
        old = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
        since = old.last_transition_time.strftime("%Y-%m-%dT%H:%M:%SZ") if old else now
        if old is None or old.status != status:
            since = now
        condition = {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": since,
        }
        self.core.patch_node_status(self.name, {"status": {"conditions": [condition]}})

    def _beat(self) -> None:
        self._ready("True", "KubeletReady", "kubelet is posting ready status")
        renew = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.leases.patch_namespaced_lease(
            self.name, "kube-node-lease", {"spec": {"renewTime": renew}}
        )
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}")
        for pod in pods.items:
            if pod.metadata.deletion_timestamp is not None:  # the kubelet finishes a delete
                self.core.delete_namespaced_pod(
                    pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                )
            elif pod.status.phase == "Pending":
                self._run_pod(pod)

    def _run_pod(self, pod: Any) -> None:
        now = _now()
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("Initialized", "Ready", "ContainersReady")
        ]
        running = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod.spec.containers
        ]
        done = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
            for c in pod.spec.init_containers or []
        ]
        status = {
            "phase": "Running",
            "conditions": conditions,
            "containerStatuses": running,
            "initContainerStatuses": done,
            "hostIP": "10.0.0.2",
            "podIP": "10.244.250.1",
            "startTime": now,
        }
        self.core.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": status}
        )

    def stop(self) -> None:
        """The kubelet dies: nothing is posted any more."""
        self._stop.set()
        self._thread.join(timeout=30)

    def not_ready(self) -> None:
        """The kubelet reports its node not ready, then stops posting."""
        self.stop()
        self._ready("False", "KubeletNotReady", "container runtime is down")


@pytest.fixture
def heartbeat_nodes(core: Any, namespace: str) -> Iterator[Callable[[str], HeartbeatNode]]:
    """Make fake GPU nodes of this test's pool whose heartbeat the test controls
    (`HeartbeatNode`); stopped and deleted after the test."""
    made: list[HeartbeatNode] = []

    def make(suffix: str) -> HeartbeatNode:
        node = HeartbeatNode(core, f"{namespace}-{suffix}", pool=namespace)
        made.append(node)
        wait_until(lambda: _node_ready(core, node.name), timeout=60, what=f"{node.name} Ready")
        return node

    yield make
    for node in made:
        node.stop()
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    for node in made:
        core.delete_node(node.name)


def _node_ready(core: Any, name: str) -> bool:
    node = core.read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


@pytest.fixture(scope="package")
def real_nodes(k8s_env: K8sEnv, api_client: Any) -> list[str]:
    """The names of the environment's real nodes (label tensoryard.io/real-node=true), at
    least two; otherwise the test is unavailable (fails under CI with TYARD_K8S_REQUIRED=1)."""
    from kubernetes import client

    if os.geteuid() != 0:
        _unavailable("real nodes need root (network namespaces, mounts, cgroups)")
    missing = [b for b in REAL_NODE_BINARIES if not (_bin_dir() / b).is_file()]
    if missing:
        _unavailable(f"{', '.join(missing)} not built: run `scripts/k8s-testenv build`")
    nodes = client.CoreV1Api(api_client).list_node(label_selector=f"{REAL_NODE_LABEL}=true")
    names = sorted(str(n.metadata.name) for n in nodes.items)
    if len(names) < 2:
        _unavailable(
            f"the environment has {len(names)} real nodes, the tests need 2: "
            "`scripts/k8s-testenv up --real-nodes 2`"
        )
    return names


def _load_built(k8s_env: K8sEnv, name: str, build: str) -> str:
    """The built image `name` imported into every real node's containerd: its reference."""
    from tensoryard.images.builder import find_built

    built = find_built(name)
    if built is None or not Path(built["archive"]).is_file():
        _unavailable(f"the {name} image is not built: run `{build}` (as root)")
    if k8s_env.dir is None:
        _unavailable("the test environment's directory is unknown (reused by kubeconfig)")
    assert built is not None and k8s_env.dir is not None
    subprocess.run(
        [SCRIPT, "load-image", built["archive"], "--dir", str(k8s_env.dir)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return str(built["ref"])


@pytest.fixture(scope="package")
def cpu_image(k8s_env: K8sEnv, real_nodes: list[str]) -> str:
    """The CPU image's reference, imported into every real node's containerd."""
    return _load_built(k8s_env, "cpu", "tyard images build cpu")


@pytest.fixture(scope="package")
def registry(k8s_env: K8sEnv, real_nodes: list[str]) -> tuple[str, Path]:
    """The test cluster's image registry (`scripts/k8s-testenv registry`): its address, and the
    directory holding its CA (for `tyard images push --cert-dir`). Nodes pull from it."""
    if k8s_env.dir is None:
        _unavailable("the test environment's directory is unknown (reused by kubeconfig)")
    assert k8s_env.dir is not None
    address = subprocess.run(
        [SCRIPT, "registry", "--dir", str(k8s_env.dir)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return address, k8s_env.dir / "registry-ca"


def jobset_served(api_client: Any) -> bool:
    """Whether this environment has the JobSet CRD (and so its controller)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
            "jobsets.jobset.x-k8s.io"
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def wait_until(probe: Callable[[], T], *, timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll until `probe` returns something truthy; fail the test naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}", pytrace=False)
        time.sleep(interval)


@pytest.fixture
def identity(k8s_env: K8sEnv, api_client: Any, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """The kubeconfig of the control plane's ServiceAccount (deploy/kubernetes/rbac.yaml),
    for this test's namespace; its cluster-wide objects are removed afterwards."""
    from tests.e2e_k8s.platform import (
        SERVICE_ACCOUNT,
        apply_rbac,
        delete_cluster_rbac,
        token_kubeconfig,
    )

    apply_rbac(api_client, namespace)
    yield token_kubeconfig(
        k8s_env.kubeconfig, api_client, namespace, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig"
    )
    delete_cluster_rbac(api_client, namespace)
