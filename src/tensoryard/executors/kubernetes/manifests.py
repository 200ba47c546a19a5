"""The Kubernetes objects of one job attempt, as plain dicts the API server accepts.

Two shapes, one pod per node in both:

- `render_jobset`: a JobSet (jobset.x-k8s.io/v1alpha2) with one replicated job of `nodes` pods;
  the JobSet controller creates the headless Service that gives each pod a DNS name.
- `render_indexed_job` + `render_headless_service`: the fallback where JobSet is not installed,
  an Indexed Job and the headless Service it needs, owned by the Job (pass its uid once created).

Every pod runs `torchrun` with a static rendezvous on the pod of index 0, reached through the
headless Service's DNS; the node rank is the pod's completion index. Pure functions: no client,
no clock, no I/O. The job token travels in a Secret (`token_secret`, key `token`) that the caller
creates; this module only references it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensoryard import envvars
from tensoryard.errors import ExecutorError
from tensoryard.runtime.megatron import SAVE_ENV as MEGATRON_SAVE_ENV

__all__ = [
    "GPU_RESOURCE",
    "KUEUE_PRIORITY_LABEL",
    "KUEUE_QUEUE_LABEL",
    "LABEL_ATTEMPT",
    "LABEL_ATTEMPT_KEY",
    "LABEL_JOB_ID",
    "LABEL_TEAM",
    "AttemptWorkload",
    "owner_reference",
    "render_headless_service",
    "render_indexed_job",
    "render_jobset",
]

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_JOB_ID = "tensoryard.io/job-id"
LABEL_ATTEMPT = "tensoryard.io/attempt"
LABEL_ATTEMPT_KEY = "tensoryard.io/attempt-key"
LABEL_TEAM = "tensoryard.io/team"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_TAS_PREFIX = "kueue.x-k8s.io/podset-"  # + "required-topology" / "preferred-topology"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
REPLICATED_JOB = "node"
CONTAINER = "trainer"
TOKEN_KEY = "token"

# Set by this module; a user's env may not override them.
RESERVED_ENV = frozenset(
    {
        v.name
        for v in (
            envvars.JOB_ID,
            envvars.ATTEMPT,
            envvars.ATTEMPT_KEY,
            envvars.JOB_TOKEN,
            envvars.IMAGE_EXPECT,
        )
    }
    | {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "NPROC_PER_NODE"}
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The longest pod hostname is "<name>-node-<job index>-<pod index>" (JobSet), at most 63 chars.
_MAX_NAME = 40


@dataclass(frozen=True, kw_only=True)
class AttemptWorkload:
    """What one attempt runs, where, and with what; checked when built (ExecutorError)."""

    job_id: str
    """tensoryard's job id; labels `tensoryard.io/job-id`."""
    attempt: int
    """Attempt number, from 1; labels `tensoryard.io/attempt`."""
    attempt_key: str
    """Unique key of this attempt (executor-made); labels `tensoryard.io/attempt-key`."""
    team: str = ""
    """The job's team; labels `tensoryard.io/team` (metrics join pods to teams by it)."""
    image: str
    """Container image of the training process."""
    command: Sequence[str]
    """The program each node's torchrun starts per GPU, as argv (e.g. ["python", "train.py"])."""
    namespace: str = "default"
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment; may not set the names in RESERVED_ENV."""
    token_secret: str
    """Name of the Secret whose key `token` is the job's report token (TYARD_JOB_TOKEN)."""
    nodes: int = 1
    """Number of nodes, one pod each."""
    gpus_per_node: int = 8
    """`nvidia.com/gpu` limit per pod and torchrun's --nproc-per-node (1 process when 0)."""
    node_names: Sequence[str] = ()
    """Nodes chosen by tensoryard's scheduler (kubernetes.io/hostname); empty: the cluster's
    scheduler chooses. Either way no two pods of the attempt share a node."""
    tolerations: Sequence[Mapping[str, Any]] = (
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
    )
    priority_class: str | None = None
    image_pull_secrets: Sequence[str] = ()
    shm_size: str = "64Gi"
    """Size of the memory-backed /dev/shm (NCCL and data loader workers need more than 64Mi)."""
    pvc_name: str | None = None
    """A PersistentVolumeClaim to mount at `pvc_mount_path` (checkpoints, datasets)."""
    pvc_mount_path: str = "/mnt/shared"
    image_expect: str | None = None
    """What the control plane's matrix entry of `image` pins (JSON: name, ref, torch, python,
    tensoryard): each pod checks its image against it before torchrun starts
    (tensoryard.images.preflight) and fails with exit code 78 on a mismatch. None: a full
    image reference, not checked."""
    volumes: Sequence[tuple[str, str, bool]] = ()
    """The job's own volumes (its spec's `volumes:`): (claim, mount path, read-only) each."""
    rendezvous_port: int = 29500
    termination_grace_s: int = 30
    """Seconds a pod gets between SIGTERM and SIGKILL when deleted (to write a checkpoint)."""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    """Extra annotations on every pod (e.g. for a cluster's admission or monitoring)."""
    ttl_after_finished_s: int | None = None
    """`ttlSecondsAfterFinished` of the JobSet / Job: Kubernetes deletes the finished attempt's
    objects after that long (None: kept until tensoryard or an admin deletes them)."""
    kueue_queue: str | None = None
    """Kueue admits this attempt: the JobSet/Job is created suspended with the label
    `kueue.x-k8s.io/queue-name` (this LocalQueue); Kueue unsuspends it once it fits the
    ClusterQueue's quota and adds the ResourceFlavor's node labels. None: tensoryard admitted it."""
    kueue_priority_class: str | None = None
    """Kueue WorkloadPriorityClass of the attempt (label `kueue.x-k8s.io/priority-class`)."""
    kueue_topology: tuple[str, str] | None = None
    """Kueue Topology-Aware Scheduling request of the pods: ("required" | "preferred", the node
    label of a level of the Kueue Topology, e.g. the leaf switch): the pod-template annotation
    `kueue.x-k8s.io/podset-<required|preferred>-topology`. None: no request."""
    processes_per_node: int | None = None
    """torchrun's --nproc-per-node; None: one per GPU (1 without GPUs)."""
    cpu: float | None = None
    """CPU cores each pod requests (None: no request)."""
    memory_bytes: int | None = None
    """Memory each pod requests and is limited to (None: neither); above it the container is
    OOMKilled, and tensoryard reports the limit."""
    workdir: str | None = None
    """The container's working directory (the spec's `workdir`, a path inside the image or on a
    volume); None: the image's."""
    run_dir: str | None = None
    """The job's run directory (TYARD_RUN_DIR), where the pods write metrics, checkpoints and
    logs; with `runs_claim` it is mounted from there."""
    runs_claim: str | None = None
    """PersistentVolumeClaim holding every job's run directory: each pod mounts its own job's
    subdirectory (subPath, the last part of `run_dir`) at `run_dir`, so the pods and the
    control plane (which mounts the claim at its runs directory) use the same paths."""
    run_as_user: int | None = None
    """runAsUser, runAsGroup and fsGroup of the pods (None: the image's user)."""
    in_place_restarts: int = 0
    """torchrun's --max-restarts inside each pod: worker restarts the control plane granted
    this launch (restart.in_place), each reported as the next attempt; on a multi-node gang
    with the c10d rendezvous (see `_torchrun`)."""
    name: str = ""
    """Object name; default `ty-<job id>-<attempt>` (a DNS label of at most 40 characters)."""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", _default_name(self.job_id, self.attempt))
        _check(
            _DNS_LABEL.match(self.name) and len(self.name) <= _MAX_NAME,
            "name",
            f"{self.name!r} must be a DNS label (a-z, 0-9, '-') of at most {_MAX_NAME} chars",
        )
        _check(self.attempt >= 1, "attempt", "must be at least 1")
        _check(self.nodes >= 1, "nodes", "must be at least 1")
        _check(self.in_place_restarts >= 0, "in_place_restarts", "must be 0 or more")
        _check(self.gpus_per_node >= 0, "gpus_per_node", "must be 0 or more")
        _check(
            self.processes_per_node is None or self.processes_per_node >= 1,
            "processes_per_node",
            "must be 1 or more",
        )
        _check(
            not self.runs_claim or bool(self.run_dir and self.run_dir.startswith("/")),
            "run_dir",
            "must be an absolute path when runs_claim mounts it",
        )
        _check(self.termination_grace_s >= 0, "termination_grace_s", "must be 0 or more")
        _check(
            self.ttl_after_finished_s is None or self.ttl_after_finished_s >= 0,
            "ttl_after_finished_s",
            "must be 0 or more (None keeps finished attempts)",
        )
        _check(bool(self.command), "command", "must name a program to run")
        _check(
            not self.node_names or len(self.node_names) == self.nodes,
            "node_names",
            f"must list one node per pod ({self.nodes}), or none",
        )
        _check(
            len(set(self.node_names)) == len(self.node_names),
            "node_names",
            "must not repeat a node (one pod per node)",
        )
        taken = {"/dev/shm", self.pvc_mount_path if self.pvc_name else "", self.run_dir or ""}
        for claim, mount, _ in self.volumes:
            _check(
                mount.startswith("/") and mount not in taken,
                "volumes",
                f"{claim} cannot be mounted at {mount!r} (an absolute path the platform does not "
                "use itself)",
            )
        reserved = sorted(RESERVED_ENV & set(self.env))
        _check(not reserved, "env", f"may not set {', '.join(reserved)} (set by tensoryard)")
        for field_name, value in (
            ("job_id", str(self.job_id)),
            ("attempt_key", self.attempt_key),
            ("team", self.team),
            ("kueue_queue", self.kueue_queue or ""),
            ("kueue_priority_class", self.kueue_priority_class or ""),
        ):
            _check(
                bool(_LABEL_VALUE.match(value)) and len(value) <= 63,
                field_name,
                f"{value!r} is not a valid label value (63 chars of [A-Za-z0-9-_.])",
            )

    @property
    def procs(self) -> int:
        """Worker processes per pod."""
        return self.processes_per_node or max(self.gpus_per_node, 1)

    def labels(self) -> dict[str, str]:
        labels = {
            LABEL_JOB_ID: str(self.job_id),
            LABEL_ATTEMPT: str(self.attempt),
            LABEL_ATTEMPT_KEY: self.attempt_key,
        }
        if self.team:
            labels[LABEL_TEAM] = self.team
        return labels


def _check(ok: object, name: str, message: str) -> None:
    if not ok:
        raise ExecutorError(f"AttemptWorkload.{name}: {message}")


def _default_name(job_id: str, attempt: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", str(job_id).lower()).strip("-")
    return f"ty-{slug}-{attempt}"[:_MAX_NAME].rstrip("-")


# ---- pods -----------------------------------------------------------------------------------


def _metadata(w: AttemptWorkload, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": w.namespace,
        "labels": w.labels(),
        "annotations": dict(w.labels()),
    }


def _env(w: AttemptWorkload, master_addr: str) -> list[dict[str, Any]]:
    rank_from_index = {
        "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}
    }
    token = {"secretKeyRef": {"name": w.token_secret, "key": TOKEN_KEY}}
    ours: list[dict[str, Any]] = [
        {"name": envvars.JOB_ID.name, "value": str(w.job_id)},
        {"name": envvars.ATTEMPT.name, "value": str(w.attempt)},
        {"name": envvars.ATTEMPT_KEY.name, "value": w.attempt_key},
        {"name": envvars.JOB_TOKEN.name, "valueFrom": token},
        *([{"name": envvars.IMAGE_EXPECT.name, "value": w.image_expect}] if w.image_expect else []),
        {"name": "NODE_RANK", "valueFrom": rank_from_index},
        {"name": "NNODES", "value": str(w.nodes)},
        {"name": "NPROC_PER_NODE", "value": str(w.procs)},
        {"name": "MASTER_ADDR", "value": master_addr},
        {"name": "MASTER_PORT", "value": str(w.rendezvous_port)},
    ]
    return [{"name": k, "value": v} for k, v in sorted(w.env.items())] + ours


def _torchrun(w: AttemptWorkload) -> list[str]:
    """Static rendezvous on rank 0; Kubernetes expands $(VAR) from the container's env. A
    Megatron job's torchrun runs under the runtime's follower, which reports its progress and
    checkpoints from its output (tensoryard.runtime.megatron).

    A multi-node gang granted in-place restarts uses the c10d rendezvous instead (a static one
    has no second round), hosted by node 0's torchrun (tensoryard.runtime.gang ``launch``
    tells each pod whether it hosts), and each worker runs under ``gang round``, which numbers
    the restart rounds alike on every node."""
    preflight = ["python", "-m", "tensoryard.images.preflight", "--"] if w.image_expect else []
    follow = ["python", "-m", "tensoryard.runtime.megatron", "follow", "--"]
    gang = ["python", "-m", "tensoryard.runtime.gang"]
    elastic = w.nodes > 1 and w.in_place_restarts > 0
    rendezvous = (
        [
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
            f"--rdzv-id={w.attempt_key}",
        ]
        if elastic
        else [
            "--node-rank=$(NODE_RANK)",
            "--master-addr=$(MASTER_ADDR)",
            "--master-port=$(MASTER_PORT)",
        ]
    )
    return [
        *preflight,
        *(follow if MEGATRON_SAVE_ENV in w.env else []),
        *([*gang, "launch", "--"] if elastic else []),
        "torchrun",
        "--nnodes=$(NNODES)",
        "--nproc-per-node=$(NPROC_PER_NODE)",
        *rendezvous,
        f"--max-restarts={w.in_place_restarts}",
        *_entry(w.command, wrapped=elastic),
    ]


def _entry(command: Sequence[str], *, wrapped: bool) -> list[str]:
    """What torchrun starts per worker: a script `train.py ...` runs under the image's Python
    (as the local executor runs it); anything else is a program (`--no-python`)."""
    gang_round = ["python", "-m", "tensoryard.runtime.gang", "round", "--"] if wrapped else []
    if command[0].endswith(".py") and not wrapped:
        return list(command)
    if command[0].endswith(".py"):
        return ["--no-python", *gang_round, "python", *command]
    return ["--no-python", *gang_round, *command]


def _affinity(w: AttemptWorkload) -> dict[str, Any]:
    one_per_node = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {LABEL_ATTEMPT_KEY: w.attempt_key}},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    }
    affinity: dict[str, Any] = {"podAntiAffinity": one_per_node}
    if w.node_names:
        term = {"key": "kubernetes.io/hostname", "operator": "In", "values": list(w.node_names)}
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [term]}]
            }
        }
    return affinity


def _pod_template(w: AttemptWorkload, master_addr: str) -> dict[str, Any]:
    resources = _resources(w)
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": w.shm_size}}
    ]
    if w.pvc_name:
        mounts.append({"name": "shared", "mountPath": w.pvc_mount_path})
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": w.pvc_name}})
    for i, (claim, mount, read_only) in enumerate(w.volumes):
        name = f"volume-{i}"
        mounts.append({"name": name, "mountPath": mount, "readOnly": read_only})
        claimed: dict[str, Any] = {"claimName": claim, "readOnly": read_only}
        volumes.append({"name": name, "persistentVolumeClaim": claimed})
    if w.runs_claim and w.run_dir:
        sub = w.run_dir.rstrip("/").rsplit("/", 1)[-1]
        mounts.append({"name": "run-dir", "mountPath": w.run_dir, "subPath": sub})
        volumes.append({"name": "run-dir", "persistentVolumeClaim": {"claimName": w.runs_claim}})
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": w.termination_grace_s,
        "containers": [
            {
                "name": CONTAINER,
                "image": w.image,
                "command": _torchrun(w),
                "env": _env(w, master_addr),
                "ports": [{"name": "rendezvous", "containerPort": w.rendezvous_port}],
                # the preflight's message, else the end of the log, when a container fails
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "resources": resources,
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
        "affinity": _affinity(w),
        "tolerations": [dict(t) for t in w.tolerations],
    }
    if w.workdir:
        spec["containers"][0]["workingDir"] = w.workdir
    if w.run_as_user is not None:
        spec["securityContext"] = {
            "runAsUser": w.run_as_user,
            "runAsGroup": w.run_as_user,
            "fsGroup": w.run_as_user,
        }
    if w.priority_class:
        spec["priorityClassName"] = w.priority_class
    if w.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in w.image_pull_secrets]
    annotations = {**w.pod_annotations, **w.labels()}
    if w.kueue_queue and w.kueue_topology:
        how, level = w.kueue_topology
        annotations[f"{KUEUE_TAS_PREFIX}{how}-topology"] = level
    return {"metadata": {"labels": w.labels(), "annotations": annotations}, "spec": spec}


def _resources(w: AttemptWorkload) -> dict[str, Any]:
    """Requests and limits of a pod: its GPUs (limit), CPU (request: no throttling), memory
    (request and limit alike, so the scheduler's view and the OOM killer's agree)."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if w.gpus_per_node:
        limits[GPU_RESOURCE] = str(w.gpus_per_node)
    if w.cpu is not None:
        requests["cpu"] = f"{round(w.cpu * 1000)}m"
    if w.memory_bytes is not None:
        requests["memory"] = limits["memory"] = _bytes_quantity(w.memory_bytes)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _bytes_quantity(n: int) -> str:
    """Bytes as the quantity a person reads back in `kubectl describe` ("2Gi", "512Mi")."""
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def _job_spec(w: AttemptWorkload, pod_template: dict[str, Any]) -> dict[str, Any]:
    """All pods start together and any failure ends the attempt: restarts are new attempts,
    resumed from the last checkpoint by tensoryard, not retried pods."""
    return {
        "completionMode": "Indexed",
        "completions": w.nodes,
        "parallelism": w.nodes,
        "backoffLimit": 0,
        "template": pod_template,
    }


# ---- JobSet ---------------------------------------------------------------------------------


def render_jobset(w: AttemptWorkload) -> dict[str, Any]:
    """A JobSet with one replicated job of `nodes` pods.

    JobSet names pods `<name>-node-0-<index>` and serves them under the headless Service
    `<name>`, so rank 0 is `<name>-node-0-0.<name>`.
    """
    master = f"{w.name}-{REPLICATED_JOB}-0-0.{w.name}"
    job_template = {
        "metadata": {"labels": w.labels(), "annotations": dict(w.labels())},
        "spec": _job_spec(w, _pod_template(w, master)),
    }
    return _kueue(
        w,
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": _metadata(w, w.name),
            "spec": {
                "network": {"enableDNSHostnames": True, "subdomain": w.name},
                "failurePolicy": {"maxRestarts": 0},
                "successPolicy": {"operator": "All"},
                "replicatedJobs": [
                    {"name": REPLICATED_JOB, "replicas": 1, "template": job_template}
                ],
                **_ttl(w),
            },
        },
    )


def _kueue(w: AttemptWorkload, owner: dict[str, Any]) -> dict[str, Any]:
    """Hand the owner to Kueue: its LocalQueue label, created suspended (Kueue's webhook would
    suspend it too; explicit, so no pod starts should that webhook be missing)."""
    if w.kueue_queue:
        owner["metadata"]["labels"][KUEUE_QUEUE_LABEL] = w.kueue_queue
        if w.kueue_priority_class:
            owner["metadata"]["labels"][KUEUE_PRIORITY_LABEL] = w.kueue_priority_class
        owner["spec"]["suspend"] = True
    return owner


# ---- Indexed Job + headless Service ---------------------------------------------------------


def render_indexed_job(w: AttemptWorkload) -> dict[str, Any]:
    """An Indexed Job of `nodes` pods, hostnames `<name>-<index>` under the Service `<name>`."""
    template = _pod_template(w, master_addr=f"{w.name}-0.{w.name}")
    template["spec"]["subdomain"] = w.name
    return _kueue(
        w,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _metadata(w, w.name),
            "spec": {**_job_spec(w, template), **_ttl(w)},
        },
    )


def _ttl(w: AttemptWorkload) -> dict[str, int]:
    """The owner's ttlSecondsAfterFinished (never on a JobSet's child Jobs: the JobSet owns
    them and goes first)."""
    return (
        {}
        if w.ttl_after_finished_s is None
        else {"ttlSecondsAfterFinished": w.ttl_after_finished_s}
    )


def render_headless_service(w: AttemptWorkload, *, owner_uid: str | None = None) -> dict[str, Any]:
    """The headless Service that gives the Indexed Job's pods their DNS names.

    With `owner_uid` (the created Job's uid) the Service is owned by the Job and goes with it.
    Addresses are published before readiness: rank 0 must resolve while the others start.
    """
    service: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(w, w.name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_ATTEMPT_KEY: w.attempt_key},
            "ports": [{"name": "rendezvous", "port": w.rendezvous_port}],
        },
    }
    if owner_uid:
        service["metadata"]["ownerReferences"] = [
            owner_reference("batch/v1", "Job", w.name, owner_uid)
        ]
    return service


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """An owner reference that makes the garbage collector delete the dependent with its owner
    (e.g. the job-token Secret with the JobSet)."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
