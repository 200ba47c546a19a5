"""Settings of the Kubernetes executor and of the cluster view built from Node objects.

Plain data (no client import), so the server config and the CLI can hold it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tensoryard import __version__
from tensoryard.executors.kubernetes.manifests import GPU_RESOURCE

__all__ = ["GPU_PRODUCT_LABEL", "Admission", "KubernetesConfig", "WorkloadKind"]

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by GPU Feature Discovery (GPU Operator)

WorkloadKind = Literal["auto", "jobset", "job"]
Admission = Literal["tensoryard", "kueue"]


@dataclass(frozen=True, kw_only=True)
class KubernetesConfig:
    """Where and how attempts run on a Kubernetes cluster. Every field has a default."""

    kubeconfig: Path | None = None
    """Kubeconfig file; None: $KUBECONFIG or ~/.kube/config, else the in-cluster identity."""
    context: str | None = None
    """Kubeconfig context; None: its current context."""
    namespace: str = "default"
    """Namespace of every object the executor creates (it must exist)."""
    workload: WorkloadKind = "auto"
    """"jobset" (JobSet CRD), "job" (Indexed Job + headless Service), or "auto": JobSet when
    its CRD is installed."""
    admission: Admission = "tensoryard"
    """Who admits jobs: "tensoryard" (its scheduler: quotas, fair share, gang placement on
    chosen nodes) or "kueue" (every job is handed at once to Kueue as a suspended JobSet/Job in
    the LocalQueue named after its team; Kueue's quotas, borrowing and preemption decide)."""
    default_image: str | None = None
    """Image for jobs whose spec names none (`image:`); None: such jobs are refused at launch."""
    loader_image: str = f"tensoryard/tensoryard:{__version__}"
    """Image of the init container that pulls a model version's weights from the artifact
    store into a GPU serving pod (`python -m tensoryard.serving.pull`): tensoryard installed."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Only nodes with these labels are tensoryard's to schedule on (empty: every node)."""
    autoscaler: bool = False
    """Nodes can be added to the cluster (a cluster autoscaler, Karpenter, a cloud node pool
    that grows): a job that no set of today's nodes could hold is accepted and stays pending
    with "cannot fit the cluster as it is: ..." until nodes that fit it come, instead of being
    refused at submit (HTTP 422). False: the selected nodes are all there will be."""
    switch_label: str = "tensoryard.io/switch"
    """Node label naming the leaf switch a node hangs off (topology-aware placement)."""
    block_label: str = "tensoryard.io/block"
    """Node label naming the spine block above the switch."""
    gpu_product_label: str = GPU_PRODUCT_LABEL
    """Node label naming the GPU model (GPU Feature Discovery's)."""
    gpu_resource: str = GPU_RESOURCE
    tolerations: Sequence[Mapping[str, Any]] = (
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
    )
    """Tolerations of every pod; taints they tolerate do not hide a node from the scheduler."""
    priority_class: str | None = None
    image_pull_secrets: Sequence[str] = ()
    pvc_name: str | None = None
    """PersistentVolumeClaim mounted at `pvc_mount_path` (checkpoints, run dirs)."""
    pvc_mount_path: str = "/mnt/shared"
    runs_claim: str | None = None
    """PersistentVolumeClaim (ReadWriteMany) holding the run directories: the control plane
    mounts it at its runs directory (`<home>/runs`), and each pod mounts its own job's
    subdirectory at the same path, so metrics, logs and checkpoints are written by the pods and
    read by the control plane (checkpoints, the registry, `tyard ckpt`) through the volume.
    None: run directories stay on the control plane's disk, where pods cannot write them."""
    team_volumes: Mapping[str, Sequence[tuple[str, str, bool]]] = field(default_factory=dict)
    """team -> (claim, mount path, read-only) mounted into every pod of that team's jobs
    (`--team-volume TEAM=CLAIM:/PATH[:ro]`): a team's datasets or shared cache, without naming
    it in each job; a job's own `volumes:` come beside them and may not overlap them."""
    run_as_user: int | None = 1000
    """runAsUser / runAsGroup / fsGroup of the training pods: the user of the images `tyard
    images build` makes. A control plane running as root makes each job's directory on
    `runs_claim` this user's; otherwise run it as the same user. None: the image's user."""
    shm_size: str = "64Gi"
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    """Extra annotations on every pod."""
    request_timeout_s: float = 10.0
    """Connect and read timeout of every API call (an unreachable API server fails fast)."""
    watch: bool = True
    """Keep pods, JobSets/Jobs and nodes in list-then-watch caches (410 Gone: relist);
    False: every poll and every cluster refresh makes LIST calls."""
    cordon_nodes: bool = True
    """Mirror tensoryard's cordon/drain onto the Node objects (spec.unschedulable, the taint
    tensoryard.io/unhealthy, annotations; see executors/kubernetes/nodes.py). Needs `patch
    nodes`; False: the Nodes are never written (tensoryard still places nothing there)."""
    capacity_ttl_s: float = 2.0
    """How long one listing of nodes and pods serves the scheduler before it is refreshed."""
    log_tail_lines: int = 500
    """Lines of each pod's log kept in the run dir when an attempt ends."""
    keep_finished_s: int | None = 3600
    """Seconds a finished attempt's JobSet/Job (and with it its pods, Service and token Secret)
    stays for inspection before Kubernetes deletes it (`ttlSecondsAfterFinished`); the outcome
    and log tails are kept in the run dir first. None: never deleted by tensoryard."""
