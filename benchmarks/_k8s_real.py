"""The real-node test cluster the Kubernetes benchmarks run on (k8s_pods.py, failures.py).

`RealCluster` starts scripts/k8s-testenv with N real nodes (kubelet, containerd, CNI, kube-proxy,
CoreDNS) in a fresh directory, imports the CPU image of `tyard images build cpu` into every node,
creates a namespace with the runs claim (a hostPath volume of the control plane's runs
directory), and starts `tyard server --executor kubernetes` with its defaults plus what the test
cluster needs (the real nodes' taint tolerated, the runs claim, the address pods reach).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _results import wait

from tensoryard.client import Client

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "k8s-testenv"
NAMESPACE = "bench"
RUNS_CLAIM = "tensoryard-runs"
REAL_NODE = "tensoryard.io/real-node"


def run(argv: list[Any], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, **kw)


class RealCluster:
    """The test cluster, its runs claim and a control plane on it (a context manager)."""

    def __init__(self, prefix: str, real_nodes: int) -> None:
        from tensoryard.images.builder import find_built

        built = find_built("cpu")
        if built is None:
            raise SystemExit("the CPU image is not built: run `tyard images build cpu` first")
        self.built = built
        self.real_nodes = real_nodes
        self.work = Path(tempfile.mkdtemp(prefix=prefix))
        self.env_dir = self.work / "cluster"
        self.kubeconfig = self.env_dir / "kubeconfig"
        self.home = self.work / "home"
        self.runs = self.home / "runs"
        self.runs.mkdir(parents=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.setup_s = 0.0

    def __enter__(self) -> RealCluster:
        started = time.monotonic()
        run([SCRIPT, "up", "--dir", self.env_dir, "--real-nodes", self.real_nodes], timeout=900)
        try:
            run([SCRIPT, "load-image", self.built["archive"], "--dir", self.env_dir], timeout=1200)
            self.setup_s = time.monotonic() - started
            self.gateway = run([SCRIPT, "gateway", "--dir", self.env_dir]).stdout.strip()
            self.kubectl("create", "namespace", NAMESPACE)
            self._claim()
            self.client = self._start_plane()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
        done = subprocess.run([str(SCRIPT), "down", "--dir", str(self.env_dir)], timeout=300)
        if done.returncode == 0:  # the nodes' image stores are gigabytes: nothing kept
            shutil.rmtree(self.work, ignore_errors=True)

    @property
    def image(self) -> str:
        return str(self.built["ref"])

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return run(["kubectl", "--kubeconfig", self.kubeconfig, *args], input=stdin).stdout

    def node(self, verb: str, name: str, *args: str) -> None:
        run([SCRIPT, verb, name, *args, "--dir", self.env_dir], timeout=300)

    def idle(self) -> None:
        def none_alive() -> bool:
            pods = json.loads(self.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json"))
            return not [
                p for p in pods["items"] if p["status"].get("phase") in ("Pending", "Running")
            ]

        wait(none_alive, 180, "the cluster to be idle", every=0.2)

    def _claim(self) -> None:
        name = f"bench-runs-{self.work.name}".lower().replace("_", "-")[:60]
        pv: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "hostPath": {"path": str(self.runs), "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": RUNS_CLAIM},
            },
        }
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": RUNS_CLAIM, "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": name,
                "resources": {"requests": {"storage": "10Gi"}},
            },
        }
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([pv, pvc]))

    def _start_plane(self) -> Client:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        log = (self.work / "server.out").open("ab")
        argv = [
            sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(self.home),
            "--host", self.gateway, "--port", str(port), "--executor", "kubernetes",
            "--kubeconfig", str(self.kubeconfig), "--namespace", NAMESPACE,
            "--node-selector", f"{REAL_NODE}=true", "--toleration", f"{REAL_NODE}:NoSchedule",
            "--runs-claim", RUNS_CLAIM,
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        url = f"http://{self.gateway}:{port}"
        probe = Client(url, None, timeout=2)
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError((self.work / "server.out").read_text()[-3000:])
            try:
                probe.healthz()
            except Exception:
                return False
            return True

        wait(up, 60, "the control plane", every=0.2)
        return Client(url, (self.home / "admin.token").read_text().strip())
