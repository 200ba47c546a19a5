"""Submit -> every rank running on real Kubernetes nodes: tensoryard next to `kubectl apply`.

On the test cluster of scripts/k8s-testenv with four **real** nodes (kubelet, containerd, runc,
CNI, kube-proxy, CoreDNS; `up --real-nodes 4`) and the CPU image of `tyard images build cpu`
imported into every node, the same workload (one process per pod that writes the time it
started, then exits) is started for gangs of 1, 2 and 4 pods, alternately:

- tensoryard: a JobSpec (image `cpu`) submitted through the REST API to `tyard server
  --executor kubernetes` with its defaults (plus what the test cluster needs: the real nodes'
  taint tolerated, the runs claim, the address pods reach);
- kubectl: the JobSet tensoryard created for the same gang size (taken from the API server),
  renamed, without tensoryard's node affinity and token, created with `kubectl apply -f`;
- container (gang of 1 only): the same command in the same image started by hand on one node's
  containerd (`ctr run`): the time a container takes without Kubernetes at all.

Submit -> running is the time from the submission call until the last rank wrote its start time.
Medians of the repeats are compared; ratio tensoryard/kubectl is the platform's cost on top of
Kubernetes' own. Goal (issue 30): under 10%.

    python benchmarks/k8s_pods.py                        # gangs of 1, 2, 4 x 3 repeats
    python benchmarks/k8s_pods.py --repeats 1 --no-results-line --json /tmp/p.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results_line  # noqa: E402

from tensoryard.client import Client  # noqa: E402

NAME = "k8s_pods"
SCRIPT = REPO / "scripts" / "k8s-testenv"
GOAL_RATIO = 1.10
NAMESPACE = "bench"
RUNS_CLAIM = "tensoryard-runs"
REAL_NODE = "tensoryard.io/real-node"
# Each rank writes when it started to <out>/rank-<RANK>: out is the job's run dir (tensoryard)
# or the directory the kubectl / container arm mounts there.
MARKER = (
    "import os, sys, time; t = time.time(); "
    "out = os.environ.get('BENCH_OUT') or os.environ['TYARD_RUN_DIR']; "
    "p = os.path.join(out, 'rank-' + os.environ.get('RANK', '0')); "
    "open(p + '.tmp', 'w').write(repr(t)); os.replace(p + '.tmp', p)"
)


def wait(check: Callable[[], Any], timeout: float, what: str, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


def started_at(out: Path, ranks: int) -> float | None:
    files = [out / f"rank-{r}" for r in range(ranks)]
    if not all(f.exists() for f in files):
        return None
    return max(float(f.read_text()) for f in files)


def run(argv: list[Any], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, **kw)


class Bench:
    def __init__(self, work: Path, env_dir: Path, image: str) -> None:
        self.work, self.env_dir, self.image = work, env_dir, image
        self.kubeconfig = env_dir / "kubeconfig"
        self.runs = work / "home" / "runs"
        self.count = 0
        self.templates: dict[int, dict[str, Any]] = {}

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return run(["kubectl", "--kubeconfig", self.kubeconfig, *args], input=stdin).stdout

    def idle(self) -> None:
        def none_alive() -> bool:
            pods = json.loads(self.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json"))
            return not [
                p for p in pods["items"] if p["status"].get("phase") in ("Pending", "Running")
            ]

        wait(none_alive, 180, "the cluster to be idle", every=0.2)

    def tensoryard(self, client: Client, nodes: int) -> float:
        spec = {
            "name": f"bench-{nodes}",
            "image": "cpu",
            "command": ["python", "-c", MARKER],
            "resources": {
                "nodes": nodes, "gpus_per_node": 0, "processes_per_node": 1,
                "cpu": 0.1, "memory": "512Mi",
            },
            "restart": {"max_restarts": 0},
        }  # fmt: skip
        t0 = time.time()
        job = client.submit(spec)
        out = Path(wait(lambda: client.job(job["id"]).get("run_dir"), 30, "the run dir"))
        last = wait(lambda: started_at(out, nodes), 300, f"tensoryard, {nodes} pod(s)")
        wait(
            lambda: client.job(job["id"])["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"),
            120,
            "the job to end",
            every=0.2,
        )
        if nodes not in self.templates:
            self.templates[nodes] = json.loads(
                self.kubectl("get", "jobset", "-n", NAMESPACE, f"ty-{job['id']}-1", "-o", "json")
            )
        return float(last) - t0

    def kubectl_apply(self, nodes: int) -> float:
        self.count += 1
        name = f"plain-{nodes}-{self.count}"
        out = self.runs / name
        out.mkdir(mode=0o777)
        os.chown(out, 1000, 1000)
        obj = _plain_jobset(self.templates[nodes], name, str(out))
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(obj))
        t0 = time.time()
        self.kubectl("apply", "-f", str(path))
        last = wait(lambda: started_at(out, nodes), 300, f"kubectl apply, {nodes} pod(s)")
        self.kubectl("delete", "jobset", "-n", NAMESPACE, name, "--wait=false")
        return float(last) - t0

    def container(self) -> float:
        """The same command in the same image on real-1's containerd, without Kubernetes."""
        self.count += 1
        out = self.work / f"ctr-{self.count}"
        out.mkdir()
        os.chown(out, 1000, 1000)
        sock = self.env_dir / "nodes" / "real-1" / "containerd.sock"
        t0 = time.time()
        run(
            [
                "ctr",
                "--address",
                sock,
                "-n",
                "k8s.io",
                "run",
                "--rm",
                "--user",
                "1000:1000",
                "--env",
                "BENCH_OUT=/out",
                "--mount",
                f"type=bind,src={out},dst=/out,options=rbind:rw",
                self.image,
                f"bench-ctr-{self.count}",
                "python",
                "-c",
                MARKER,
            ],
            timeout=120,
        )
        return float(wait(lambda: started_at(out, 1), 30, "the container")) - t0


def _plain_jobset(template: dict[str, Any], name: str, out: str) -> dict[str, Any]:
    """tensoryard's JobSet as a user would apply it: its own name, no tensoryard labels, node
    affinity or token; the ranks write to `out` (a directory of the same volume)."""
    obj = copy.deepcopy(template)
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    obj.pop("status", None)
    spec = obj["spec"]
    spec["network"]["subdomain"] = name
    for rj in spec["replicatedJobs"]:
        tmpl = rj["template"]
        tmpl["metadata"] = {}
        pod = tmpl["spec"]["template"]
        pod["metadata"] = {}
        pod_spec = pod["spec"]
        pod_spec["affinity"].pop("nodeAffinity", None)
        pod_spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            0
        ]["labelSelector"] = {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": name}}
        for c in pod_spec["containers"]:
            c["env"] = [
                e
                for e in c["env"]
                if not e["name"].startswith("TYARD_")
                and ("valueFrom" not in e or e["name"] == "NODE_RANK")
            ] + [{"name": "BENCH_OUT", "value": out}]
            for m in c.get("volumeMounts", []):
                if m["name"] == "run-dir":
                    m["mountPath"], m["subPath"] = out, Path(out).name
            c["command"] = [
                x.replace(f"{template['metadata']['name']}-", f"{name}-") for x in c["command"]
            ]
            for e in c["env"]:
                if e["name"] == "MASTER_ADDR":
                    e["value"] = f"{name}-node-0-0.{name}"
    return obj


def pv_and_claim(bench: Bench) -> None:
    pv: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"bench-runs-{bench.work.name}".lower()[:60]},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": str(bench.runs), "type": "Directory"},
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
            "volumeName": pv["metadata"]["name"],
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }
    bench.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([pv, pvc]))


def start_plane(bench: Bench, gateway: str) -> tuple[subprocess.Popen[bytes], Client]:
    import socket

    home = bench.work / "home"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    log = (bench.work / "server.out").open("ab")
    argv = [
        sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(home),
        "--host", gateway, "--port", str(port), "--executor", "kubernetes",
        "--kubeconfig", str(bench.kubeconfig), "--namespace", NAMESPACE,
        "--node-selector", f"{REAL_NODE}=true", "--toleration", f"{REAL_NODE}:NoSchedule",
        "--runs-claim", RUNS_CLAIM,
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://{gateway}:{port}"
    probe = Client(url, None, timeout=2)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError((bench.work / "server.out").read_text()[-3000:])
        try:
            probe.healthz()
        except Exception:
            return False
        return True

    wait(up, 60, "the control plane", every=0.2)
    return proc, Client(url, (home / "admin.token").read_text().strip())


def git_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from tensoryard.images.builder import find_built

    built = find_built("cpu")
    if built is None:
        raise SystemExit("the CPU image is not built: run `tyard images build cpu` first")
    work = Path(tempfile.mkdtemp(prefix="tensoryard-k8s-pods-"))
    env_dir = work / "cluster"
    (work / "home" / "runs").mkdir(parents=True)
    real = max(args.nodes)
    started = time.monotonic()
    run([SCRIPT, "up", "--dir", env_dir, "--real-nodes", real], timeout=900)
    proc = None
    try:
        run([SCRIPT, "load-image", built["archive"], "--dir", env_dir], timeout=1200)
        setup_s = time.monotonic() - started
        gateway = run([SCRIPT, "gateway", "--dir", env_dir]).stdout.strip()
        bench = Bench(work, env_dir, str(built["ref"]))
        bench.kubectl("create", "namespace", NAMESPACE)
        pv_and_claim(bench)
        proc, client = start_plane(bench, gateway)
        samples: dict[int, dict[str, list[float]]] = {
            n: {"tensoryard": [], "kubectl": [], "container": []} for n in args.nodes
        }
        # One unmeasured tensoryard run per size first: it makes the JobSet the kubectl arm
        # applies, and warms the image's page cache on every node alike for both arms.
        for nodes in args.nodes:
            bench.idle()
            bench.tensoryard(client, nodes)
        for repeat in range(args.repeats):
            for nodes in args.nodes:
                order = ["tensoryard", "kubectl"] + (["container"] if nodes == 1 else [])
                if repeat % 2:
                    order.reverse()
                for arm in order:
                    bench.idle()
                    if arm == "tensoryard":
                        took = bench.tensoryard(client, nodes)
                    elif arm == "kubectl":
                        took = bench.kubectl_apply(nodes)
                    else:
                        took = bench.container()
                    samples[nodes][arm].append(took)
                    print(
                        f"[{repeat + 1}/{args.repeats}] {nodes} pod(s) {arm:10s} "
                        f"submit -> running {took:.3f} s",
                        flush=True,
                    )
        bench.idle()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        subprocess.run([str(SCRIPT), "down", "--dir", str(env_dir)], timeout=300)
    per_size: dict[str, Any] = {}
    for nodes, arms in samples.items():
        ours, plain = statistics.median(arms["tensoryard"]), statistics.median(arms["kubectl"])
        row: dict[str, Any] = {
            "tensoryard_s": arms["tensoryard"],
            "kubectl_s": arms["kubectl"],
            "tensoryard_median_s": ours,
            "kubectl_median_s": plain,
            "ratio": ours / plain,
            "extra_s": ours - plain,
        }
        if arms["container"]:
            row["container_s"] = arms["container"]
            row["container_median_s"] = statistics.median(arms["container"])
        per_size[str(nodes)] = row
    return {
        "benchmark": NAME,
        "command": "python benchmarks/k8s_pods.py "
        + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "commit": git_commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "image": {"ref": built["ref"], "archive_bytes": built["archive_bytes"]},
        "real_nodes": real,
        "setup_s": round(setup_s, 1),
        "repeats": args.repeats,
        "pods": per_size,
        "goal": {"ratio_max": GOAL_RATIO},
        "load_average": " / ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def summary(result: dict[str, Any]) -> tuple[str, str]:
    parts, met = [], []
    for nodes, row in result["pods"].items():
        text = (
            f"{nodes} pod(s): tensoryard {row['tensoryard_median_s']:.2f} s vs kubectl apply "
            f"{row['kubectl_median_s']:.2f} s = {row['ratio']:.2f}x ({row['extra_s']:+.2f} s)"
        )
        if "container_median_s" in row:
            text += f", a container by hand (ctr run) {row['container_median_s']:.2f} s"
        parts.append(text)
        met.append(f"{nodes} pod(s) {'yes' if row['ratio'] <= GOAL_RATIO else 'no'}")
    text = (
        f"submit -> every rank running on {result['real_nodes']} real kubelet nodes of this "
        f"machine (CPU image, one process per pod), median of {result['repeats']} alternating "
        "runs: " + "; ".join(parts) + f"; load average at the end {result['load_average']}"
    )
    return text, ", ".join(met)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=lambda s: [int(n) for n in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--json", type=Path, default=REPO / "benchmarks" / "results" / f"{NAME}.json"
    )
    parser.add_argument("--no-results-line", action="store_true", help="leave RESULTS.md alone")
    parser.add_argument(
        "--row-from-json",
        action="store_true",
        help="measure nothing: write the RESULTS.md row from the JSON file of an earlier run",
    )
    args = parser.parse_args()
    if max(args.nodes) > 7 or min(args.nodes) < 1:
        parser.error("--nodes: gang sizes between 1 and 7 (real nodes of the test cluster)")
    if args.row_from_json:
        result = json.loads(args.json.read_text())
    else:
        if os.geteuid() != 0:
            parser.error("real nodes need root (network namespaces, mounts, cgroups)")
        result = measure(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    text, met = summary(result)
    print(text)
    if not args.no_results_line:
        write_results_line(
            NAME,
            result["command"],
            text,
            "tensoryard adds < 10% to `kubectl apply`'s submit -> running",
            met,
        )


if __name__ == "__main__":
    main()
