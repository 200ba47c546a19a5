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
    python benchmarks/k8s_pods.py --repeats 1 --no-results-line --json pods.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _k8s_real import NAMESPACE, RealCluster, run
from _results import benchmark_main, provenance, started_at, wait

from tensoryard.client import Client

NAME = "k8s_pods"
GOAL_RATIO = 1.10
# Each rank writes when it started to <out>/rank-<RANK>: out is the job's run dir (tensoryard)
# or the directory the kubectl / container arm mounts there.
MARKER = (
    "import os, sys, time; t = time.time(); "
    "out = os.environ.get('BENCH_OUT') or os.environ['TYARD_RUN_DIR']; "
    "p = os.path.join(out, 'rank-' + os.environ.get('RANK', '0')); "
    "open(p + '.tmp', 'w').write(repr(t)); os.replace(p + '.tmp', p)"
)


class Bench:
    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self.count = 0
        self.templates: dict[int, dict[str, Any]] = {}

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
                self.cluster.kubectl(
                    "get", "jobset", "-n", NAMESPACE, f"ty-{job['id']}-1", "-o", "json"
                )
            )
        return float(last) - t0

    def kubectl_apply(self, nodes: int) -> float:
        self.count += 1
        name = f"plain-{nodes}-{self.count}"
        out = self.cluster.runs / name
        out.mkdir(mode=0o777)
        os.chown(out, 1000, 1000)
        obj = _plain_jobset(self.templates[nodes], name, str(out))
        path = self.cluster.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(obj))
        t0 = time.time()
        self.cluster.kubectl("apply", "-f", str(path))
        last = wait(lambda: started_at(out, nodes), 300, f"kubectl apply, {nodes} pod(s)")
        self.cluster.kubectl("delete", "jobset", "-n", NAMESPACE, name, "--wait=false")
        return float(last) - t0

    def container(self) -> float:
        """The same command in the same image on real-1's containerd, without Kubernetes."""
        self.count += 1
        out = self.cluster.work / f"ctr-{self.count}"
        out.mkdir()
        os.chown(out, 1000, 1000)
        sock = self.cluster.env_dir / "nodes" / "real-1" / "containerd.sock"
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
                "--env",
                "BENCH_OUT=/out",
                "--mount",
                f"type=bind,src={out},dst=/out,options=rbind:rw",
                self.cluster.image,
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


def measure(args: argparse.Namespace) -> dict[str, Any]:
    samples: dict[int, dict[str, list[float]]] = {
        n: {"tensoryard": [], "kubectl": [], "container": []} for n in args.nodes
    }
    with RealCluster("tensoryard-k8s-pods-", max(args.nodes)) as cluster:
        bench, client = Bench(cluster), cluster.client
        # One unmeasured tensoryard run per size first: it makes the JobSet the kubectl arm
        # applies, and warms the image's page cache on every node alike for both arms.
        for nodes in args.nodes:
            cluster.idle()
            bench.tensoryard(client, nodes)
        for repeat in range(args.repeats):
            for nodes in args.nodes:
                order = ["tensoryard", "kubectl"] + (["container"] if nodes == 1 else [])
                if repeat % 2:
                    order.reverse()
                for arm in order:
                    cluster.idle()
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
        cluster.idle()
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
        **provenance("k8s_pods.py"),
        "image": {"ref": cluster.image, "archive_bytes": cluster.built["archive_bytes"]},
        "real_nodes": cluster.real_nodes,
        "setup_s": round(cluster.setup_s, 1),
        "repeats": args.repeats,
        "pods": per_size,
        "goal": {"ratio_max": GOAL_RATIO},
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=gang_sizes, default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)


def gang_sizes(text: str) -> list[int]:
    sizes = [int(n) for n in text.split(",")]
    if max(sizes) > 7 or min(sizes) < 1:
        raise argparse.ArgumentTypeError("gang sizes between 1 and 7 (the test cluster's nodes)")
    return sizes


if __name__ == "__main__":
    benchmark_main(
        NAME,
        __doc__,
        "tensoryard adds < 10% to `kubectl apply`'s submit -> running",
        measure,
        summary,
        add_arguments,
        needs_root="real nodes need root (network namespaces, mounts, cgroups)",
    )
