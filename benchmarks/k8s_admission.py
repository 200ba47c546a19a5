"""Admission on Kubernetes: tensoryard's scheduler next to Kueue, the same burst in one run.

On the test control plane started with Kueue (scripts/k8s-testenv up --kueue: real
kube-apiserver, kube-scheduler, Job, JobSet and Kueue 0.17 controllers; kwok runs the fake GPU
nodes and completes each pod 1-5 s after it runs), N fake nodes x 8 GPUs and T teams of equal
quota in one cohort (idle quota is lent), the same burst of jobs (mixed gang sizes of 1-8 whole
nodes, teams round robin) is submitted twice through tensoryard's REST API (batch endpoint) to
an in-process control plane with the Kubernetes executor:

- tensoryard: `--admission tensoryard`: its scheduler admits and places each gang (node
  affinity), the executor creates the JobSets;
- kueue: `--admission kueue`: every job becomes a suspended JobSet in its team's LocalQueue at
  once; Kueue's ClusterQueues (written by `tyard cluster plan` for the same inventory and
  quotas) admit them, and kube-scheduler places the pods.

- limit (`--order tensoryard,kueue,limit`): the physical limit of this cluster on this machine,
  an admission engine that costs nothing: the benchmark launches each job through tensoryard's
  Kubernetes executor (the tensoryard arm's launch path) the moment enough GPUs are free by its
  own count, first fit, no quotas; kube-scheduler places the pods. No admission engine can
  admit faster here, so limit/Kueue is the largest admissions/s ratio over Kueue the machine
  allows, and each arm is reported as a share of the limit.

Each job runs 1-5 s (kwok) and the burst drains completely, so every job is admitted once.
Measured per arm: admissions per second over the burst (jobs / time from the first submission to
the last admission; tensoryard: the job's ADMITTED time, Kueue: the Workload first seen
Admitted by a watch), p50/p99 from submission to all of a job's pods bound to nodes (a pod
watch), the time until every job succeeded, and GPU allocation (GPUs held by bound, unfinished
pods over all GPUs) averaged while jobs were still waiting. Goal: tensoryard admits at least 5x
as many jobs per second as Kueue, with allocation no worse.

    python benchmarks/k8s_admission.py                  # 128 x 2000
    python benchmarks/k8s_admission.py --nodes 32 --jobs 400 --order tensoryard,kueue,limit
    python benchmarks/k8s_admission.py --nodes 16 --jobs 100 --no-results-line --json PATH

A run with a Kueue arm keeps its JSON in benchmarks/results/k8s_admission_kueue_<nodes>x<jobs>.json
(committed) and writes its row, `k8s_admission (<nodes>x<jobs>)`, from it; a run of tensoryard and
the limit alone keeps it in k8s_admission_<nodes>x<jobs>.json, its row `k8s_admission vs limit
(<nodes>x<jobs>)`. `--row-from-json` (with the same --nodes, --jobs and --order) writes the row
again from that file.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import provenance, scratch, write_results_line  # noqa: E402
from k8s_launch import GANGS, create_fake_nodes, gang_sizes, test_cluster  # noqa: E402

from tensoryard.executors.kubernetes.manifests import LABEL_JOB_ID  # noqa: E402

NAME = "k8s_admission"
GOAL_RATIO = 5.0
POOL = "tensoryard.io/bench-pool"
IMAGE = "registry.invalid/tensoryard/trainer:bench"


def inventory(nodes: int, teams: int, namespace: str) -> dict[str, Any]:
    """Nodes of one model in racks of 8; the GPUs split between the teams as evenly as whole
    numbers allow (their sum is every GPU, so neither side leaves any unquota'd)."""
    total = nodes * 8
    share = [total // teams + (1 if i < total % teams else 0) for i in range(teams)]
    return {
        "cluster": {
            "name": "bench",
            "namespace": namespace,
            "software": {
                "driver": "570.133.20",
                "cuda": "12.8",
                "pytorch": "2.7",
                "nccl": "2.26.2",
            },
        },
        "nodes": [
            {
                "name": f"adm-{i}",
                "gpu": {"model": "H100", "count": 8, "interconnect": "nvswitch"},
                "rack": f"r{i // 8}",
                "leaf": f"leaf-{i // 8}",
                "spine": f"block-{i // 64}",
                "cpu": 224,
                "memory": "2Ti",
                "nvme": "30Ti",
            }
            for i in range(nodes)
        ],
        "quotas": {
            "queues": [
                {"name": f"team-{i}", "cohort": "bench", "nominal": {"H100": share[i]}}
                for i in range(teams)
            ],
            "cohorts": [{"name": "bench"}],
        },
    }


def make_nodes(api: Any, kubeconfig: Path, inv: dict[str, Any], pool: str) -> list[str]:
    """The inventory's nodes as kwok nodes, labelled and tainted by `tyard cluster plan`."""
    from kubernetes import client

    from tensoryard.cluster import build_plan, parse_inventory, write_plan

    core = client.CoreV1Api(api)
    plan = write_plan(build_plan(parse_inventory(inv)), Path(tempfile.mkdtemp()) / "plan")
    names = [n["name"] for n in inv["nodes"]]
    # registered untainted, as a kubelet would, and Ready before the plan is applied: the
    # node controller's not-ready taint would conflict with the plan's
    create_fake_nodes(core, names, pool, tainted=False, timeout_s=180)
    kubectl(
        kubeconfig, "apply", "--server-side", "--field-manager=tyard-cluster-plan",
        "-f", str(plan / "nodes.yaml"),
    )  # fmt: skip
    return names


def kubectl(kubeconfig: Path, *args: str) -> None:
    subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args], check=True, capture_output=True
    )


class Watches:
    """Pod binding (per job: when all its pods had a node) and Workload admission times."""

    def __init__(self, api: Any, namespace: str, gpus_per_pod: int = 8) -> None:
        self.api, self.namespace, self.gpus_per_pod = api, namespace, gpus_per_pod
        self.bound: dict[str, float] = {}  # pod -> first seen with a node
        self.done: set[str] = set()  # pods that ended or are deleted
        self.pods_of: dict[str, set[str]] = {}  # job id -> pods
        self.admitted: dict[str, float] = {}  # workload owner JobSet name -> admitted time
        self.samples: list[tuple[float, int]] = []  # (time, GPUs held by bound live pods)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._pods, daemon=True),
            threading.Thread(target=self._workloads, daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pods(self) -> None:
        from kubernetes import client

        from tensoryard.executors.kubernetes.watch import raw_watch

        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            try:  # the JSON only: a V1Pod per event cost this measuring process CPU
                self._pods_once(core, raw_watch())
            except Exception as exc:  # a broken stream: watch again (events are idempotent)
                print(f"  pod watch: {exc!r}; again", file=sys.stderr)
                self._pods_rv = None  # (410 Gone among them): replay from the start
                time.sleep(1)

    # Each watch resumes where the last one stopped: a watch without a resourceVersion replays
    # every object as ADDED, and at 2,000 jobs that replay every 30 s took this process's CPU
    # (shared with the control plane it measures) for nothing.
    _pods_rv: str | None = None
    _workloads_rv: str | None = None

    def _pods_once(self, core: Any, w: Any) -> None:
        for event in w.stream(
            core.list_namespaced_pod, self.namespace, label_selector=LABEL_JOB_ID,
            timeout_seconds=30, resource_version=self._pods_rv,
        ):  # fmt: skip
            pod = event["raw_object"]
            if event["type"] == "ERROR":  # 410 Gone: the version is too old
                raise RuntimeError(f"watch error: {pod.get('message', pod)}")
            self._pods_rv = pod["metadata"].get("resourceVersion", self._pods_rv)
            if event["type"] == "BOOKMARK":
                continue
            name = pod["metadata"]["name"]
            job = pod["metadata"]["labels"][LABEL_JOB_ID]
            now = time.time()
            with self._lock:
                self.pods_of.setdefault(job, set()).add(name)
                if pod["spec"].get("nodeName"):
                    self.bound.setdefault(name, now)
                phase = pod.get("status", {}).get("phase")
                if event["type"] == "DELETED" or phase in ("Succeeded", "Failed"):
                    self.done.add(name)
            if self._stop.is_set():
                w.stop()

    def _workloads(self) -> None:
        from kubernetes import client, watch
        from kubernetes.client.exceptions import ApiException

        custom = client.CustomObjectsApi(self.api)
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    custom.list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2",
                    self.namespace, "workloads", timeout_seconds=30,
                    resource_version=self._workloads_rv,
                ):  # fmt: skip
                    wl = event["raw_object"]
                    if event["type"] == "ERROR":  # 410 Gone: replay from the start
                        self._workloads_rv = None
                        break
                    self._workloads_rv = wl["metadata"].get("resourceVersion", self._workloads_rv)
                    if event["type"] == "BOOKMARK":
                        continue
                    conds = wl.get("status", {}).get("conditions") or []
                    if any(c["type"] == "Admitted" and c["status"] == "True" for c in conds):
                        owner = next(iter(wl["metadata"].get("ownerReferences") or []), {})
                        with self._lock:
                            self.admitted.setdefault(owner.get("name", ""), time.time())
                    if self._stop.is_set():
                        w.stop()
            except (ApiException, Exception):  # not installed yet, or a broken stream
                self._workloads_rv = None
                time.sleep(1)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                held = sum(1 for p in self.bound if p not in self.done) * self.gpus_per_pod
            self.samples.append((time.time(), held))

    def all_bound(self, job: str, nodes: int) -> float | None:
        with self._lock:
            pods = self.pods_of.get(job, set())
            times = [self.bound[p] for p in pods if p in self.bound]
        return max(times) if len(times) >= nodes else None

    def all_done(self, job: str, nodes: int) -> bool:
        with self._lock:
            pods = self.pods_of.get(job, set())
            return len(pods) >= nodes and all(p in self.done for p in pods)

    def stop(self) -> None:
        self._stop.set()


def _wait_namespace_gone(core: Any, ns: str, limit_s: float = 1800) -> float | None:
    """Wait until an arm's namespace (its JobSets, Jobs, pods and Workloads) is deleted, so that
    the next arm does not share the API server and controllers with thousands of deletions:
    a second arm started right after the first ran 10x slower while the first's 2,000 JobSets
    were still being collected. Seconds it took (None: still there after `limit_s`)."""
    from kubernetes.client.rest import ApiException

    t0 = time.monotonic()
    last = 0.0
    while time.monotonic() - t0 < limit_s:
        try:
            core.read_namespace(ns)
        except ApiException as exc:
            if exc.status == 404:
                return round(time.monotonic() - t0, 1)
            raise
        if time.monotonic() - last > 30:
            last = time.monotonic()
            pods = len(core.list_namespaced_pod(ns, limit=500).items)
            left = f"{pods}+" if pods == 500 else str(pods)
            print(
                f"  waiting for namespace {ns} to be deleted ({left} pods left, "
                f"{time.monotonic() - t0:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(2)
    print(f"  namespace {ns} still there after {limit_s:.0f}s; going on", file=sys.stderr)
    return None


def run_arm(
    api: Any,
    kubeconfig: Path,
    mode: str,
    sizes: list[int],
    teams: list[str],
    inv: dict[str, Any],
    pool: str,
    total_gpus: int,
    timeout: float,
    last: bool = False,
) -> dict[str, Any]:
    from fastapi.testclient import TestClient
    from kubernetes import client

    from tensoryard.cluster.inventory import parse_inventory
    from tensoryard.cluster.kueue import kueue_objects
    from tensoryard.cluster.labels import LABEL_BLOCK, LABEL_SWITCH
    from tensoryard.executors.kubernetes.config import KubernetesConfig
    from tensoryard.server.config import ServerConfig
    from tensoryard.server.main import build_control_plane, tune_process
    from tensoryard.store.records import JobState

    core = client.CoreV1Api(api)
    ns = f"adm-{mode}-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})
    time.sleep(2)  # the namespace's default ServiceAccount
    quotas = {q["name"]: q["nominal"]["H100"] for q in inv["quotas"]["queues"]}
    kueue_file = None
    if mode == "kueue":
        inv = {**inv, "cluster": {**inv["cluster"], "namespace": ns}}
        import yaml

        kueue_file = Path(tempfile.mkdtemp()) / "kueue.yaml"
        kueue_file.write_text(yaml.safe_dump_all(kueue_objects(parse_inventory(inv))))
        kubectl(kubeconfig, "apply", "--server-side", "-f", str(kueue_file))
        time.sleep(3)  # Kueue sees the queues become active
    home = Path(tempfile.mkdtemp(prefix=f"tyard-adm-{mode}-"))
    config = ServerConfig(
        home=home,
        executor="kubernetes",
        kubernetes=KubernetesConfig(
            kubeconfig=kubeconfig,
            namespace=ns,
            node_selector={POOL: pool},
            switch_label=LABEL_SWITCH,
            block_label=LABEL_BLOCK,
            default_image=IMAGE,
            admission="kueue" if mode == "kueue" else "tensoryard",
        ),
        cancel_grace_s=0,
    )
    plane = build_control_plane(config)
    tune_process()  # as `tyard server` does (the GIL switch interval, a frozen heap)
    for team in teams:
        # tensoryard's quotas mirror Kueue's nominal quotas; the cohort lends idle GPUs
        plane.store.ensure_team(team, gpu_quota=quotas[team])
    watches = Watches(api, ns)
    plane.controller.start()
    http = TestClient(plane.app(), headers={"Authorization": f"Bearer {plane.admin_token}"})
    specs = [
        {
            "name": f"adm-{i}",
            "team": teams[i % len(teams)],
            "command": ["python", "train.py"],
            "resources": {"nodes": n, "gpus_per_node": 8},
            "restart": {"max_restarts": 0},
        }
        for i, n in enumerate(sizes)
    ]
    time.sleep(1)
    start = time.time()
    ids: list[int] = []
    submitted: dict[int, float] = {}
    try:
        for chunk in range(0, len(specs), 500):
            answer = http.post("/api/v1/jobs/batch", json={"specs": specs[chunk : chunk + 500]})
            answer.raise_for_status()
            now = time.time()
            for job_id in answer.json()["ids"]:
                ids.append(int(job_id))
                submitted[int(job_id)] = now
        nodes_of = dict(zip(ids, sizes, strict=True))
        deadline = time.monotonic() + timeout
        last_report = 0.0
        timed_out = False
        while True:
            finished = plane.store.list_jobs(states=[JobState.SUCCEEDED], limit=1).total
            bad = plane.store.list_jobs(states=[JobState.FAILED, JobState.CANCELLED], limit=5)
            if bad.total:
                first = bad.items[0]
                raise RuntimeError(f"{mode}: {bad.total} job(s) ended badly: {first.id} "
                                   f"{first.state}: {first.reason}")  # fmt: skip
            if finished == len(ids):
                break
            if time.monotonic() > deadline:  # measured as far as it got, marked unfinished
                print(f"  {mode}: only {finished} of {len(ids)} succeeded in {timeout}s",
                      file=sys.stderr, flush=True)  # fmt: skip
                timed_out = True
                break
            if time.monotonic() - last_report > 15:
                last_report = time.monotonic()
                print(f"  {mode}: {finished}/{len(ids)} succeeded after {time.time() - start:.0f}s",
                      file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(1)
        makespan = None if timed_out else time.time() - start
        jobs = _all_jobs(plane.store)
    finally:
        watches.stop()
        plane.controller.stop()
        plane.executor.close()  # type: ignore[attr-defined]
    if mode == "kueue":
        admitted = {i: watches.admitted.get(f"ty-{i}-1") for i in ids}
    else:
        admitted = {
            i: jobs[i].admitted_at.timestamp() if jobs[i].admitted_at else None for i in ids
        }
    bound = {i: watches.all_bound(str(i), nodes_of[i]) for i in ids}
    latencies = [b - submitted[i] for i, b in bound.items() if b is not None]
    measured = _measures(watches, start, admitted, latencies, total_gpus)
    plane.store.close()
    core.delete_namespace(ns, propagation_policy="Background")
    if kueue_file is not None:
        subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "delete", "--wait=false",
             "--ignore-not-found", "-f", str(kueue_file)],
            capture_output=True,
        )  # fmt: skip
    # the next arm starts on a quiet cluster; after the last one the cluster is torn down
    cleanup_s = None if last else _wait_namespace_gone(core, ns)
    return {
        "cleanup_s": cleanup_s,
        "jobs": len(ids),
        **measured,
        "makespan_s": round(makespan, 1) if makespan is not None else None,
        "succeeded": finished,
        "timed_out": timed_out,
        # attempts beyond the first: every one is a preemption (tensoryard's reclaim, or a
        # Kueue eviction), since no job fails here
        "restarted_attempts": sum(max(jobs[i].attempts - 1, 0) for i in ids),
    }


def run_limit_arm(
    api: Any,
    kubeconfig: Path,
    sizes: list[int],
    teams: list[str],
    pool: str,
    total_gpus: int,
    timeout: float,
    last: bool = False,
) -> dict[str, Any]:
    """The physical limit of this machine's cluster for the burst: an admission engine that
    costs nothing. The benchmark itself launches each job through tensoryard's Kubernetes
    executor (the same Secret + JobSet + owner patch as the tensoryard arm, 4 launch threads
    as the control plane has) the moment enough GPUs are free by its own count (first fit
    over the queue in submission order, no quotas, no topology; kube-scheduler places the
    pods), and counts a job's GPUs free again when all its pods ended. No scheduler, no
    control loop, no store: what is left is the API server, the JobSet, Job and
    kube-scheduler controllers and kwok on the same cores. No admission engine can admit
    faster than this here."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    from tensoryard.executors.base import LaunchRequest
    from tensoryard.executors.kubernetes.client import connect
    from tensoryard.executors.kubernetes.config import KubernetesConfig
    from tensoryard.executors.kubernetes.executor import KubernetesExecutor
    from tensoryard.spec.job import parse_job_spec

    core = client.CoreV1Api(api)
    ns = f"adm-limit-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})
    time.sleep(2)  # the namespace's default ServiceAccount
    kube = connect(
        KubernetesConfig(
            kubeconfig=kubeconfig, namespace=ns, node_selector={POOL: pool}, default_image=IMAGE
        )
    )
    executor = KubernetesExecutor(kube, grace_s=0)
    run_dir = Path(tempfile.mkdtemp(prefix="tyard-adm-limit-"))
    specs = [
        parse_job_spec(
            {
                "name": f"adm-{i}",
                "team": teams[i % len(teams)],
                "command": ["python", "train.py"],
                "resources": {"nodes": n, "gpus_per_node": 8},
                "image": IMAGE,
            }
        )
        for i, n in enumerate(sizes)
    ]
    watches = Watches(api, ns)
    pool_threads = ThreadPoolExecutor(4)
    time.sleep(1)
    start = time.time()
    admitted: dict[int, float] = {}
    waiting = list(range(len(sizes)))
    running: set[int] = set()
    finished: set[int] = set()
    free = total_gpus
    timed_out = False
    deadline = time.monotonic() + timeout
    last_report = 0.0

    def launch(i: int) -> None:
        executor.launch(
            LaunchRequest(
                job_id=str(i), attempt=1, spec=specs[i], run_dir=run_dir / str(i),
                env={"TYARD_JOB_TOKEN": "bench"}, attempt_key=f"limit-{i}",
            )
        )  # fmt: skip

    futures = []
    try:
        while len(finished) < len(sizes):
            for i in [j for j in running if watches.all_done(str(j), sizes[j])]:
                running.discard(i)
                finished.add(i)
                free += sizes[i] * 8
            kept = []
            for i in waiting:  # first fit in submission order
                if sizes[i] * 8 <= free:
                    free -= sizes[i] * 8
                    admitted[i] = time.time()
                    running.add(i)
                    futures.append(pool_threads.submit(launch, i))
                else:
                    kept.append(i)
            waiting = kept
            for f in [f for f in futures if f.done()]:
                f.result()  # a failed launch stops the arm
                futures.remove(f)
            if time.monotonic() > deadline:
                print(f"  limit: only {len(finished)} of {len(sizes)} done in {timeout}s",
                      file=sys.stderr, flush=True)  # fmt: skip
                timed_out = True
                break
            if time.monotonic() - last_report > 15:
                last_report = time.monotonic()
                print(f"  limit: {len(finished)}/{len(sizes)} done after "
                      f"{time.time() - start:.0f}s", file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(0.2)
        makespan = None if timed_out else time.time() - start
    finally:
        pool_threads.shutdown(wait=True, cancel_futures=True)
        watches.stop()
        executor.close()
    bound = {i: watches.all_bound(str(i), sizes[i]) for i in range(len(sizes))}
    latencies = [b - start for b in bound.values() if b is not None]
    measured = _measures(watches, start, dict(admitted), latencies, total_gpus)
    core.delete_namespace(ns, propagation_policy="Background")
    cleanup_s = None if last else _wait_namespace_gone(core, ns)
    return {
        "cleanup_s": cleanup_s,
        "jobs": len(sizes),
        **measured,
        "makespan_s": round(makespan, 1) if makespan is not None else None,
        "succeeded": len(finished),
        "timed_out": timed_out,
        "restarted_attempts": 0,
    }


def _measures(
    watches: Watches,
    start: float,
    admitted: dict[int, float | None],
    latencies: list[float],
    total_gpus: int,
) -> dict[str, Any]:
    """An arm's admission rate, submit-to-bound percentiles, first wave and allocation."""
    seen = [t for t in admitted.values() if t is not None]
    last_admission = max(seen)
    latencies = sorted(latencies)
    window = [h for t, h in watches.samples if start <= t <= last_admission]
    # The first wave: from the submission until the empty cluster is 90% allocated (or 90% of
    # the most it ever held), the admission engine and the launch path alone set the pace.
    peak = max((h for t, h in watches.samples if t >= start), default=0)
    target = 0.9 * min(total_gpus, peak)
    fill_t = next((t for t, h in watches.samples if t >= start and h >= target > 0), None)
    wave = [t for t in seen if fill_t and t <= fill_t]
    return {
        "admitted_seen": len(seen),
        "admissions_per_s": round(len(seen) / max(last_admission - start, 1e-9), 2),
        "last_admission_s": round(last_admission - start, 1),
        "submit_to_bound_p50_s": round(_pct(latencies, 50), 2),
        "submit_to_bound_p99_s": round(_pct(latencies, 99), 2),
        "fill_90pct_s": round(fill_t - start, 1) if fill_t else None,
        "first_wave_jobs": len(wave),
        "first_wave_admissions_per_s": round(len(wave) / (fill_t - start), 2) if fill_t else None,
        "gpu_allocation_while_waiting": round(statistics.mean(window) / total_gpus, 3)
        if window
        else None,
    }


def limit_ratios(arms: dict[str, Any]) -> dict[str, float | None]:
    """Each arm against the physical limit (the `limit` arm), where both drained the burst:
    admissions/s as a share of the limit's, the limit's makespan over the arm's, and the
    largest admissions/s ratio over Kueue this machine allows (limit / Kueue)."""
    lim = arms.get("limit")
    if lim is None or lim["timed_out"]:
        return {}
    out: dict[str, float | None] = {}
    for name in ("tensoryard", "kueue"):
        arm = arms.get(name)
        if arm is None or arm["timed_out"]:
            continue
        out[f"{name}_of_limit_admissions_per_s"] = round(
            arm["admissions_per_s"] / lim["admissions_per_s"], 3
        )
        out[f"limit_over_{name}_makespan"] = round(lim["makespan_s"] / arm["makespan_s"], 3)
    if "kueue_of_limit_admissions_per_s" in out:
        out["limit_over_kueue_admissions_per_s"] = round(
            lim["admissions_per_s"] / arms["kueue"]["admissions_per_s"], 2
        )
    return out


def _all_jobs(store: Any) -> dict[int, Any]:
    out: dict[int, Any] = {}
    cursor = None
    while True:
        page = store.list_jobs(limit=500, cursor=cursor, newest_first=False)
        out.update((j.id, j) for j in page.items)
        cursor = page.next_cursor
        if cursor is None:
            return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


def wait_pods_gone(api: Any, pool: str, timeout: float = 300) -> None:
    """Until no pod holds a GPU on the benchmark's nodes (between the arms)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_pod_for_all_namespaces(label_selector=LABEL_JOB_ID).items
        if not [p for p in pods if p.status.phase in ("Pending", "Running")]:
            return
        time.sleep(2)
    raise RuntimeError("pods of the first arm still hold GPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--json",
        type=Path,
        help="the run's JSON (default benchmarks/results/k8s_admission_kueue_<nodes>x<jobs>.json"
        " with a Kueue arm, else k8s_admission_<nodes>x<jobs>.json)",
    )
    parser.add_argument(
        "--row-from-json",
        action="store_true",
        help="measure nothing: write the RESULTS.md row from the JSON file of an earlier run",
    )
    parser.add_argument("--nodes", type=int, default=128, help="Fake 8-GPU nodes.")
    parser.add_argument("--jobs", type=int, default=2000, help="Jobs in the burst.")
    parser.add_argument("--teams", type=int, default=10, help="Teams of equal quota.")
    parser.add_argument("--seed", type=int, default=7, help="Seed of the gang sizes.")
    parser.add_argument(
        "--order",
        default="tensoryard,kueue",
        help="Arms in run order (the second sees a warmer API server; swap to check); one "
        "arm alone reports its numbers without a ratio.",
    )
    parser.add_argument("--kubeconfig", type=Path, help="A running test cluster with Kueue.")
    parser.add_argument("--timeout", type=float, default=3600, help="Seconds per arm.")
    parser.add_argument(
        "--no-results-line", action="store_true", help="Do not write benchmarks/RESULTS.md."
    )
    args = parser.parse_args()
    kueue = "_kueue" if "kueue" in args.order.split(",") else ""
    args.json = args.json or (
        Path(__file__).resolve().parent / "results" / f"{NAME}{kueue}_{args.nodes}x{args.jobs}.json"
    )
    if args.row_from_json:
        stored = json.loads(args.json.read_text())
        write_row(stored) if "kueue" in stored else write_limit_row(stored)
        return
    unknown = set(args.order.split(",")) - {"tensoryard", "kueue", "limit"}
    if unknown or not args.order:
        parser.error(
            f"--order: unknown arm(s) {sorted(unknown)}; use tensoryard, kueue and/or limit"
        )

    from kubernetes import client, config

    sizes = [min(n, args.nodes) for n in gang_sizes(args.jobs, seed=args.seed)]
    teams = [f"team-{i}" for i in range(args.teams)]
    arms: dict[str, Any] = {}
    with scratch("tyard-adm-"), test_cluster(args.kubeconfig, "--kueue") as kubeconfig:
        api = config.new_client_from_config(config_file=str(kubeconfig))
        pool = secrets.token_hex(3)
        inv = inventory(args.nodes, args.teams, "default")
        for node in inv["nodes"]:
            node["name"] = f"adm-{pool}-{node['name'].split('-')[1]}"
        nodes = make_nodes(api, kubeconfig, inv, pool)
        try:
            order = args.order.split(",")
            for i, mode in enumerate(order):
                last = i == len(order) - 1
                print(f"{mode}: {args.jobs} jobs on {args.nodes}x8 GPUs", file=sys.stderr)
                if mode == "limit":
                    arms[mode] = run_limit_arm(
                        api, kubeconfig, sizes, teams, pool, args.nodes * 8, args.timeout,
                        last=last,
                    )  # fmt: skip
                else:
                    arms[mode] = run_arm(
                        api, kubeconfig, mode, sizes, teams, inv, pool, args.nodes * 8,
                        args.timeout, last=last,
                    )  # fmt: skip
                print(f"{mode}: {json.dumps(arms[mode])}", file=sys.stderr, flush=True)
                if not last:
                    wait_pods_gone(api, pool)
        finally:
            core = client.CoreV1Api(api)
            for name in nodes:
                core.delete_node(name)
    limit = limit_ratios(arms)
    prov = provenance("k8s_admission.py")
    if args.kubeconfig:  # the command names no path of this machine
        prov["command"] = prov["command"].replace(str(args.kubeconfig), "KUBECONFIG")
    if "tensoryard" not in arms or "kueue" not in arms:  # no tensoryard/Kueue ratio
        result = {
            **prov,
            "nodes": args.nodes,
            "jobs": args.jobs,
            "teams": args.teams,
            "order": args.order,
            **arms,
            **limit,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"arms {args.order}: no tensoryard/Kueue ratio; {limit}; numbers in {args.json}")
        if "tensoryard" in arms and "limit" in arms and not args.no_results_line:
            write_limit_row(result)
        return
    ty, kq = arms["tensoryard"], arms["kueue"]
    # over the whole burst only when both drained it (an arm cut off at --timeout did less
    # work); the first wave is compared either way
    complete = not ty["timed_out"] and not kq["timed_out"]
    ratio = ty["admissions_per_s"] / kq["admissions_per_s"] if complete else None
    wave_ratio = (ty["first_wave_admissions_per_s"] or 0) / (
        kq["first_wave_admissions_per_s"] or 1e-9
    )
    fill_ratio = (kq["fill_90pct_s"] or 0) / (ty["fill_90pct_s"] or 1e-9)
    alloc_ok = (ty["gpu_allocation_while_waiting"] or 0) >= (
        kq["gpu_allocation_while_waiting"] or 0
    )
    result = {
        **prov,
        "nodes": args.nodes,
        "gpus": args.nodes * 8,
        "jobs": args.jobs,
        "teams": args.teams,
        "order": args.order,
        "timeout_s": args.timeout,
        "gang_sizes": {str(n): sizes.count(n) for n, _ in GANGS},
        "tensoryard": ty,
        "kueue": kq,
        "admissions_per_s_ratio": round(ratio, 2) if ratio is not None else None,
        "first_wave_admissions_per_s_ratio": round(wave_ratio, 2),
        "fill_90pct_ratio_kueue_over_tensoryard": round(fill_ratio, 2),
        "p50_bound_ratio_kueue_over_tensoryard": round(
            kq["submit_to_bound_p50_s"] / ty["submit_to_bound_p50_s"], 2
        ),
        "makespan_ratio_kueue_over_tensoryard": round(kq["makespan_s"] / ty["makespan_s"], 2)
        if complete
        else None,
        **({"limit": arms["limit"]} if "limit" in arms else {}),
        **limit,
        "goal": f"admissions/s >= {GOAL_RATIO}x Kueue, allocation no worse",
        "met": ratio is not None and min(ratio, wave_ratio) >= GOAL_RATIO and alloc_ok,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if not args.no_results_line:
        write_row(result)


def write_row(result: dict[str, Any]) -> None:
    """This run's RESULTS.md row, `k8s_admission (<nodes>x<jobs>)`, from its JSON."""
    ty, kq = result["tensoryard"], result["kueue"]
    ratio, wave_ratio = (
        result["admissions_per_s_ratio"],
        result["first_wave_admissions_per_s_ratio"],
    )
    text = (
        f"{result['jobs']} jobs, {result['teams']} teams, {result['nodes']}x8 fake GPUs, arms in "
        f"order {result['order']}: admissions/s tensoryard {ty['admissions_per_s']} vs Kueue "
        f"{kq['admissions_per_s']} ("
        + (
            f"{ratio:.2f}x"
            if ratio is not None
            else "no ratio: "
            + ", ".join(
                f"{name} had {arm['succeeded']} of {arm['jobs']} done at the "
                f"{result['timeout_s']:g} s limit"
                for name, arm in (("tensoryard", ty), ("Kueue", kq))
                if arm["timed_out"]
            )
        )
        + "); "
        f"first wave (empty cluster to 90% allocated) {ty['first_wave_admissions_per_s']} vs "
        f"{kq['first_wave_admissions_per_s']} jobs/s ({wave_ratio:.2f}x), filled after "
        f"{ty['fill_90pct_s']} vs {kq['fill_90pct_s']} s (Kueue/tensoryard "
        f"{result['fill_90pct_ratio_kueue_over_tensoryard']}x); submit->pods bound p50/p99 "
        f"{ty['submit_to_bound_p50_s']}/{ty['submit_to_bound_p99_s']} s vs "
        f"{kq['submit_to_bound_p50_s']}/{kq['submit_to_bound_p99_s']} s (p50 Kueue/tensoryard "
        f"{result['p50_bound_ratio_kueue_over_tensoryard']}x); all done after "
        f"{ty['makespan_s']} vs {kq['makespan_s']} s (Kueue/tensoryard "
        f"{result['makespan_ratio_kueue_over_tensoryard']}x); preempted attempts "
        f"{ty['restarted_attempts']} vs {kq['restarted_attempts']}; GPU allocation while "
        f"jobs waited "
        f"{ty['gpu_allocation_while_waiting']} vs {kq['gpu_allocation_while_waiting']}"
    )
    if "limit" in result:
        lim = result["limit"]
        text += (
            f"; the physical limit (an admission engine that costs nothing, same launch path): "
            f"{lim['admissions_per_s']} admissions/s, all done after {lim['makespan_s']} s, "
            f"so at most {result.get('limit_over_kueue_admissions_per_s')}x Kueue's "
            f"admissions/s is attainable here; tensoryard reached "
            f"{result.get('tensoryard_of_limit_admissions_per_s')} of the limit's admissions/s "
            f"and Kueue {result.get('kueue_of_limit_admissions_per_s')}; makespan "
            f"limit/tensoryard {result.get('limit_over_tensoryard_makespan')}, limit/Kueue "
            f"{result.get('limit_over_kueue_makespan')}"
        )
    text += f"; load average at the end {result['load_average']}"
    write_results_line(
        f"{NAME} ({result['nodes']}x{result['jobs']})",
        result["command"],
        text,
        f"admissions/s >= {GOAL_RATIO}x Kueue (burst and first wave), allocation no worse",
        "yes" if result["met"] else "no",
        date=result["date"][:10],
    )


LIMIT_GOAL = 0.95  # issue 32: tensoryard's admissions/s as a share of the zero-cost engine's


def write_limit_row(result: dict[str, Any]) -> None:
    """The row of a run with tensoryard and the limit only (no Kueue arm): how close the
    control loop comes to an admission engine that costs nothing, on the same launch path."""
    ty, lim = result["tensoryard"], result["limit"]
    share = result.get("tensoryard_of_limit_admissions_per_s")
    words = str(result["command"]).split()

    def option(name: str) -> str:  # a JSON written before it kept these: its command has them
        return words[words.index(name) + 1] if name in words[:-1] else "?"

    teams, order = result.get("teams", option("--teams")), result.get("order", option("--order"))
    text = (
        f"{result['jobs']} jobs, {teams} teams, {result['nodes']}x8 fake GPUs, "
        f"arms in order {order} (no Kueue arm): admissions/s "
        f"tensoryard {ty['admissions_per_s']} vs limit {lim['admissions_per_s']} (tensoryard "
        f"{share} of the limit); all done after {ty['makespan_s']} vs {lim['makespan_s']} s "
        f"(limit/tensoryard makespan {result.get('limit_over_tensoryard_makespan')}); "
        f"submit->pods bound p50/p99 {ty['submit_to_bound_p50_s']}/{ty['submit_to_bound_p99_s']}"
        f" s vs {lim['submit_to_bound_p50_s']}/{lim['submit_to_bound_p99_s']} s; first wave "
        f"{ty['first_wave_admissions_per_s']} vs {lim['first_wave_admissions_per_s']} jobs/s; "
        f"preempted attempts {ty['restarted_attempts']} vs {lim['restarted_attempts']}; GPU "
        f"allocation while jobs waited {ty['gpu_allocation_while_waiting']} vs "
        f"{lim['gpu_allocation_while_waiting']}; load average at the end "
        f"{result.get('load_average', '?')}"
    )
    met = share is not None and share >= LIMIT_GOAL
    write_results_line(
        f"{NAME} vs limit ({result['nodes']}x{result['jobs']})",
        result["command"],
        text,
        f"tensoryard >= {LIMIT_GOAL} of the zero-cost admission engine's admissions/s",
        "yes" if met else f"no ({share})",
        date=result["date"][:10],
    )


if __name__ == "__main__":
    main()
