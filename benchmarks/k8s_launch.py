"""Launch on Kubernetes: tensoryard's control plane next to `kubectl apply` of the same JobSets.

On the test control plane (scripts/k8s-testenv: real kube-apiserver, kube-scheduler, Job and
JobSet controllers; kwok simulates the GPU nodes and completes each pod 1-5 s after it runs),
with N fake nodes x 8 GPUs, the same mix of gang sizes is run twice, in one run:

- kubectl: every job's token Secret and JobSet, rendered exactly as the executor renders them
  (without node affinity: kube-scheduler places), created with one `kubectl apply -f`;
- tensoryard: the jobs submitted through the REST API (batch endpoint) to a control plane with
  the Kubernetes executor (in this process, on its own namespace and the same nodes), which
  places them with its own scheduler and creates the objects.

Measured for each: seconds from the first submission until every job's pods have all been seen
Running (a watch records the first time each pod runs), and for tensoryard the API calls its
executor and cluster view made per job (watch streams not counted), and whether any pod was
bound to a node other than the one tensoryard chose. Goal: tensoryard's time <= 1.2 x
kubectl's, and no pod bound elsewhere. For tensoryard also where each launch's time goes, per
job (`launch_hops`: its calls, the JobSet controller, the Job controller, the pods' start, the
ending on record, the next launch). `--controller-qps N` starts the test cluster with
kube-controller-manager's client QPS at N instead of upstream's 20; that run keeps its own JSON
(k8s_launch_controller_qps_N.json) and row.

    python benchmarks/k8s_launch.py            # 128 x 1000; JSON in benchmarks/results/, the row
    python benchmarks/k8s_launch.py --nodes 32 --jobs 100 --no-results-line --json PATH
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import benchmark_main, provenance, scratch  # noqa: E402

from tensoryard.executors.kubernetes.manifests import (  # noqa: E402
    LABEL_JOB_ID,
    AttemptWorkload,
    render_jobset,
)

NAME = "k8s_launch"
GOAL_RATIO = 1.2
POOL = "tensoryard.io/bench-pool"
IMAGE = "registry.invalid/tensoryard/trainer:bench"
GANGS = ((1, 0.5), (2, 0.25), (4, 0.15), (8, 0.10))  # nodes per job, share of jobs


def gang_sizes(jobs: int, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    sizes = [n for n, _ in GANGS]
    return rng.choices(sizes, weights=[w for _, w in GANGS], k=jobs)


PORTS = 12  # scripts/k8s-testenv's ports per environment
CONTROLLER_QPS_ENV = "TYARD_K8S_CONTROLLER_QPS"  # scripts/k8s-testenv: kube-controller-manager
UPSTREAM_QPS = 20  # kube-controller-manager's --kube-api-qps default


@contextmanager
def test_cluster(kubeconfig: Path | None, *up_args: str) -> Iterator[Path]:
    """A running test control plane: the given kubeconfig, or `scripts/k8s-testenv up` (with
    `up_args`, e.g. --kueue) on free ports for the duration."""
    if kubeconfig is not None:
        yield kubeconfig
        return
    script = REPO / "scripts" / "k8s-testenv"
    with tempfile.TemporaryDirectory(prefix="k8s-bench-") as tmp:
        env = {**os.environ, "TYARD_K8S_PORT_BASE": str(_free_base())}
        up = subprocess.run(
            [script, "up", "--dir", tmp, *up_args], env=env, capture_output=True, text=True
        )
        if up.returncode != 0:
            raise SystemExit(f"scripts/k8s-testenv up failed:\n{up.stderr[-3000:]}")
        try:
            yield Path(tmp) / "kubeconfig"
        finally:
            subprocess.run([script, "down", "--dir", tmp], env=env, capture_output=True)


def _free_base() -> int:
    for _ in range(50):
        base = random.randrange(20000, 32000)  # below the kernel's ephemeral ports
        try:
            for port in range(base, base + PORTS):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def create_fake_nodes(
    core: Any,
    names: list[str],
    pool: str,
    *,
    labels: dict[str, dict[str, str]] | None = None,
    tainted: bool = True,
    timeout_s: float = 120,
) -> list[str]:
    """8-GPU kwok nodes in label pool `pool` (extra `labels` per name), once kwok has made
    them all Ready. `tainted`: with the GPU taint, as a configured GPU node has it."""
    resources = {"cpu": "224", "memory": "2000Gi", "pods": "110", "nvidia.com/gpu": "8"}
    for name in names:
        node: dict[str, Any] = {
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "type": "kwok",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    POOL: pool,
                    **(labels or {}).get(name, {}),
                },
            },
            "status": {"capacity": resources, "allocatable": resources},
        }
        if tainted:
            node["spec"] = {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
        core.create_node(node)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = [
            n
            for n in core.list_node(label_selector=f"{POOL}={pool}").items
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        ]
        if len(ready) == len(names):
            return names
        time.sleep(0.5)
    raise RuntimeError("kwok did not make the nodes Ready")


def make_nodes(core: Any, count: int, pool: str) -> list[str]:
    names = [f"bench-{pool}-{i}" for i in range(count)]
    switches = {name: {"tensoryard.io/switch": f"leaf-{i // 8}"} for i, name in enumerate(names)}
    return create_fake_nodes(core, names, pool, labels=switches)


def _watch(stopped: Callable[[], bool], list_fn: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
    """Every object a watch of `list_fn` reports (as a plain dict), restarting the watch every
    30 s, until `stopped()`."""
    from kubernetes import watch

    while not stopped():
        w = watch.Watch()  # type: ignore[no-untyped-call]
        for event in w.stream(list_fn, *args, timeout_seconds=30, **kwargs):  # type: ignore[no-untyped-call]
            yield event["raw_object"]
            if stopped():
                w.stop()  # type: ignore[no-untyped-call]


class RunningWatch:
    """Records the first time each pod of a namespace is seen Running, per job label (and, in
    wall-clock time for the hops below, when each pod was first seen, first Running and first
    Succeeded)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.first_running: dict[str, float] = {}
        self.seen_at: dict[str, float] = {}  # wall clock, as the store's times
        self.running_at: dict[str, float] = {}
        self.done_at: dict[str, float] = {}
        self.job_of: dict[str, str] = {}
        self.pods_of: dict[str, set[str]] = {}
        self.node_of: dict[str, str] = {}
        self.allowed: dict[str, list[str]] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        for pod in _watch(
            lambda: self._stop, core.list_namespaced_pod, self.namespace,
            label_selector=LABEL_JOB_ID,
        ):  # fmt: skip
            name = pod["metadata"]["name"]
            job = pod["metadata"]["labels"][LABEL_JOB_ID]
            self.pods_of.setdefault(job, set()).add(name)
            self.job_of[name] = job
            now = time.time()
            self.seen_at.setdefault(name, now)
            phase = pod.get("status", {}).get("phase")
            if phase == "Succeeded":
                self.done_at.setdefault(name, now)
            if phase in ("Running", "Succeeded"):
                self.running_at.setdefault(name, now)
                self.first_running.setdefault(name, time.monotonic())
                self.node_of[name] = pod["spec"].get("nodeName", "")
                self.allowed[name] = _affinity_nodes(pod)

    def started(self, expected: dict[str, int]) -> int:
        """How many jobs have had all `expected[job]` pods running."""
        return sum(
            1
            for job, n in expected.items()
            if sum(1 for p in self.pods_of.get(job, ()) if p in self.first_running) >= n
        )

    def stop(self) -> None:
        self._stop = True


class OwnersWatch:
    """When each job's JobSet (created by tensoryard) and its first Job (created by the JobSet
    controller) were first seen, wall clock, by job label: splits a launch's "create" hop."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.jobset_at: dict[str, float] = {}
        self.job_at: dict[str, float] = {}
        self._stop = False
        self._name_to_job: dict[str, str] = {}
        self._lock = threading.Lock()
        for target in (self._jobsets, self._jobs):
            threading.Thread(target=target, daemon=True).start()

    def _jobsets(self) -> None:
        from kubernetes import client

        custom = client.CustomObjectsApi(self.api)
        for jobset in _watch(
            lambda: self._stop, custom.list_namespaced_custom_object, "jobset.x-k8s.io",
            "v1alpha2", self.namespace, "jobsets", label_selector=LABEL_JOB_ID,
        ):  # fmt: skip
            meta = jobset["metadata"]
            with self._lock:
                self._name_to_job[meta["name"]] = meta["labels"][LABEL_JOB_ID]
                self.jobset_at.setdefault(meta["labels"][LABEL_JOB_ID], time.time())

    def _jobs(self) -> None:
        from kubernetes import client

        batch = client.BatchV1Api(self.api)
        for obj in _watch(lambda: self._stop, batch.list_namespaced_job, self.namespace):
            labels = obj["metadata"].get("labels") or {}
            now = time.time()
            with self._lock:
                job = labels.get(LABEL_JOB_ID) or self._name_to_job.get(
                    labels.get("jobset.sigs.k8s.io/jobset-name", "")
                )
                if job:
                    self.job_at.setdefault(job, now)

    def stop(self) -> None:
        self._stop = True


def _affinity_nodes(pod: dict[str, Any]) -> list[str]:
    try:
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        return list(terms[0]["matchExpressions"][0]["values"])
    except (KeyError, IndexError, TypeError):
        return []


def wait_started(watcher: RunningWatch, expected: dict[str, int], timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while watcher.started(expected) < len(expected):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {watcher.started(expected)} of {len(expected)} jobs started in {timeout}s"
            )
        time.sleep(0.2)
    return max(watcher.first_running.values())


def run_kubectl(api: Any, kubeconfig: Path, sizes: list[int], timeout: float) -> dict[str, Any]:
    from kubernetes import client

    core = client.CoreV1Api(api)
    ns = f"bench-kubectl-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
    docs: list[dict[str, Any]] = []
    expected: dict[str, int] = {}
    for i, nodes in enumerate(sizes, start=1):
        w = AttemptWorkload(
            job_id=str(i),
            attempt=1,
            attempt_key=f"j{i}-a1-kubectl",
            image=IMAGE,
            command=["python", "train.py"],
            namespace=ns,
            token_secret=f"ty-{i}-1-token",
            nodes=nodes,
            gpus_per_node=8,
        )
        meta = {"name": w.token_secret, "namespace": ns, "labels": w.labels()}
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
                     "stringData": {"token": "t"}})  # fmt: skip
        docs.append(render_jobset(w))
        expected[str(i)] = nodes
    path = Path(tempfile.mkdtemp()) / "jobs.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    watcher = RunningWatch(api, ns)
    time.sleep(1)
    start = time.monotonic()
    subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "apply", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    applied = time.monotonic() - start
    last = wait_started(watcher, expected, timeout)
    watcher.stop()
    core.delete_namespace(ns, propagation_policy="Background")
    return {"seconds": round(last - start, 2), "apply_seconds": round(applied, 2)}


def run_tensoryard(
    api: Any, kubeconfig: Path, sizes: list[int], pool: str, timeout: float
) -> dict[str, Any]:
    from fastapi.testclient import TestClient
    from kubernetes import client

    from tensoryard.executors.kubernetes.config import KubernetesConfig
    from tensoryard.server.config import ServerConfig
    from tensoryard.server.main import build_control_plane, tune_process

    core = client.CoreV1Api(api)
    ns = f"bench-tyard-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
    time.sleep(2)  # the namespace's default ServiceAccount
    home = Path(tempfile.mkdtemp(prefix="tyard-k8s-bench-"))
    config = ServerConfig(
        home=home,
        executor="kubernetes",
        kubernetes=KubernetesConfig(
            kubeconfig=kubeconfig,
            namespace=ns,
            node_selector={POOL: pool},
            default_image=IMAGE,
        ),
        cancel_grace_s=0,
    )
    plane = build_control_plane(config)
    tune_process()  # as `tyard server` does (the GIL switch interval, a frozen heap)
    kube = plane.executor.kube  # type: ignore[attr-defined]
    watcher = RunningWatch(api, ns)
    owners = OwnersWatch(api, ns)
    plane.controller.start()
    http = TestClient(plane.app(), headers={"Authorization": f"Bearer {plane.admin_token}"})
    specs = [
        {
            "name": f"bench-{i}",
            "command": ["python", "train.py"],
            "resources": {"nodes": n, "gpus_per_node": 8},
            "restart": {"max_restarts": 0},
        }
        for i, n in enumerate(sizes)
    ]
    time.sleep(1)
    calls_before = kube.calls
    start = time.monotonic()
    ids: list[int] = []
    for chunk in range(0, len(specs), 1000):
        answer = http.post("/api/v1/jobs/batch", json={"specs": specs[chunk : chunk + 1000]})
        answer.raise_for_status()
        ids += [int(i) for i in answer.json()["ids"]]
    expected = {str(job_id): n for job_id, n in zip(ids, sizes, strict=True)}
    try:
        last = wait_started(watcher, expected, timeout)
    finally:
        watcher.stop()
        owners.stop()
        plane.controller.stop()
        plane.executor.close()  # type: ignore[attr-defined]
        plane.store.close()
    calls = kube.calls - calls_before
    hops = launch_hops(home / "tensoryard.db", watcher, owners)
    misplaced = [
        p
        for p, node in watcher.node_of.items()
        if watcher.allowed.get(p) and node not in watcher.allowed[p]
    ]
    core.delete_namespace(ns, propagation_policy="Background")
    return {
        "seconds": round(last - start, 2),
        "api_calls": calls,
        "api_calls_per_job": round(calls / len(sizes), 2),
        "pods_checked": len(watcher.node_of),
        "pods_bound_elsewhere": len(misplaced),
        "hops_s": hops,
    }


def launch_hops(
    db: Path, watcher: RunningWatch, owners: OwnersWatch | None = None
) -> dict[str, dict[str, float]]:
    """Where a launch's time goes, per job (median, p90 and max in seconds): the store's
    attempt times (launch started, attempt ended) against the pods' times seen by the watch.

    - create: launch started -> the job's first pod exists (tensoryard's API calls, then the
      JobSet and Job controllers), split into launch started -> JobSet exists (tensoryard:
      `jobset`), JobSet -> its first Job exists (the JobSet controller: `job`) and that Job ->
      its first pod (the Job controller: `pod`);
    - run: first pod exists -> every pod of the job Running (kube-scheduler, kwok);
    - end: the last pod Succeeded -> the attempt's end on record (watch, ending, store);
    - next: an end on record -> the launch started next after it (the loop's scheduling), for
      launches after the first wave."""
    import sqlite3
    from datetime import UTC, datetime

    def wall(text: str | None) -> float | None:
        if not text:
            return None
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()

    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT job_id, started_at, finished_at FROM attempts").fetchall()
    pods: dict[str, list[str]] = {}
    for pod, job in watcher.job_of.items():
        pods.setdefault(job, []).append(pod)
    create, run, end, starts, ends = [], [], [], [], []
    split: dict[str, list[float]] = {"jobset": [], "job": [], "pod": []}
    for job_id, started, finished in rows:
        start, stop = wall(started), wall(finished)
        names = pods.get(str(job_id), [])
        if start is None or not names:
            continue
        starts.append(start)
        seen = min(watcher.seen_at[n] for n in names)
        create.append(seen - start)
        js = owners.jobset_at.get(str(job_id)) if owners else None
        jb = owners.job_at.get(str(job_id)) if owners else None
        if js is not None and jb is not None:
            split["jobset"].append(js - start)
            split["job"].append(jb - js)
            split["pod"].append(seen - jb)
        if all(n in watcher.running_at for n in names):
            run.append(max(watcher.running_at[n] for n in names) - seen)
        if stop is not None:
            ends.append(stop)
            if all(n in watcher.done_at for n in names):
                end.append(stop - max(watcher.done_at[n] for n in names))
    next_ = []
    first = min(starts, default=0.0)
    for start in starts:
        before = [e for e in ends if e <= start]
        if start > first + 1.0 and before:
            next_.append(start - max(before))
    return {
        name: _spread(values)
        for name, values in (
            ("create", create),
            *((f"create.{k}", v) for k, v in split.items()),
            ("run", run),
            ("end", end),
            ("next", next_),
        )
        if values
    }


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(ordered[len(ordered) // 2], 2),
        "p90": round(ordered[int(len(ordered) * 0.9)], 2),
        "max": round(ordered[-1], 2),
        "n": len(ordered),
    }


GOAL = f"ratio <= {GOAL_RATIO}, 0 pods elsewhere"


def summary(result: dict[str, Any]) -> tuple[str, str]:
    """The RESULTS.md row's result and met columns, from a run's JSON."""
    tyard, kubectl = result["tensoryard"], result["kubectl"]
    ratio = result["ratio_tensoryard_to_kubectl"]
    qps = result.get("controller_qps", UPSTREAM_QPS)
    text = (
        f"{result['jobs']} jobs on {result['nodes']}x8 fake GPUs: all pods running after "
        f"{tyard['seconds']:.1f}s (tensoryard) vs {kubectl['seconds']:.1f}s (kubectl apply), "
        f"ratio {ratio:.2f}; {tyard['api_calls_per_job']:.1f} API calls/job; "
        f"{tyard['pods_bound_elsewhere']} of {tyard['pods_checked']} pods bound elsewhere; "
        f"{_hops_text(tyard.get('hops_s') or {})}"
        f"kube-controller-manager client QPS {qps}"
        f"{' (upstream default)' if qps == UPSTREAM_QPS else ''}; "
        f"load average at the end {result['load_average']}"
    )
    met = ratio <= GOAL_RATIO and tyard["pods_bound_elsewhere"] == 0
    return text, "yes" if met else "no"


def _hops_text(hops: dict[str, dict[str, float]]) -> str:
    if not hops:
        return ""

    def one(key: str, name: str) -> str:
        v = hops[key]
        return f"{name} {v['median']:.1f} s (p90 {v['p90']:.1f})"

    parts = []
    if "create" in hops:
        split = [
            one(k, name)
            for k, name in (
                ("create.jobset", "launch -> JobSet exists"),
                ("create.job", "JobSet -> Job (the JobSet controller)"),
                ("create.pod", "Job -> pod"),
            )
            if k in hops
        ]
        parts.append(
            one("create", "launch -> pods exist") + (f" [{', '.join(split)}]" if split else "")
        )
    for key, name in (
        ("run", "pods exist -> running"),
        ("end", "pods done -> ended on record"),
        ("next", "ended -> next launch"),
    ):
        if key in hops:
            parts.append(one(key, name))
    return "tensoryard per job, median: " + ", ".join(parts) + "; "


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from kubernetes import client, config

    sizes = gang_sizes(args.jobs)
    if args.controller_qps is not None:
        if args.kubeconfig is not None:
            raise SystemExit("--controller-qps: only for a test cluster this script starts")
        os.environ[CONTROLLER_QPS_ENV] = str(args.controller_qps)
    with scratch("tyard-k8s-launch-"), test_cluster(args.kubeconfig) as kubeconfig:
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        core = client.CoreV1Api(api)
        pool = secrets.token_hex(3)
        nodes = make_nodes(core, args.nodes, pool)
        try:
            kubectl = run_kubectl(api, kubeconfig, sizes, args.timeout)
            time.sleep(5)
            tyard = run_tensoryard(api, kubeconfig, sizes, pool, args.timeout)
        finally:
            for name in nodes:
                core.delete_node(name)
    prov = provenance("k8s_launch.py")
    if args.kubeconfig:  # the command names no path of this machine
        prov["command"] = prov["command"].replace(str(args.kubeconfig), "KUBECONFIG")
    result = {
        **prov,
        "nodes": args.nodes,
        "gpus": args.nodes * 8,
        "jobs": args.jobs,
        "gang_sizes": {str(n): sizes.count(n) for n, _ in GANGS},
        "controller_qps": args.controller_qps or UPSTREAM_QPS,
        "kubectl": kubectl,
        "tensoryard": tyard,
        "ratio_tensoryard_to_kubectl": round(tyard["seconds"] / kubectl["seconds"], 3),
        "goal_ratio": GOAL_RATIO,
    }
    print(json.dumps(result, indent=2))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=128, help="Fake 8-GPU nodes.")
    parser.add_argument("--jobs", type=int, default=1000, help="Jobs of mixed gang sizes.")
    parser.add_argument(
        "--kubeconfig", type=Path, help="A running test cluster (default: start one)."
    )
    parser.add_argument("--timeout", type=float, default=1800, help="Seconds per side.")
    parser.add_argument(
        "--controller-qps",
        type=int,
        help="Requests a second each kube-controller-manager controller may send (the Job "
        f"controller's among them) in the test cluster this script starts (default: upstream's "
        f"{UPSTREAM_QPS}); the run keeps its own JSON and row.",
    )


def json_name(args: argparse.Namespace) -> str:
    qps = args.controller_qps
    return NAME if qps in (None, UPSTREAM_QPS) else f"{NAME}_controller_qps_{qps}"


def row_name(result: dict[str, Any]) -> str:
    qps = result.get("controller_qps", UPSTREAM_QPS)
    return NAME if qps == UPSTREAM_QPS else f"{NAME} (controller QPS {qps})"


if __name__ == "__main__":
    benchmark_main(
        NAME, __doc__, GOAL, measure, summary, add_arguments, json_name=json_name, row_name=row_name
    )
