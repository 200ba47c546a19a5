"""GPU serving on Kubernetes: a deployment's replicas as a Deployment or a LeaderWorkerSet.

A deployment with a GPU engine (vLLM, SGLang: :mod:`tensoryard.serving.gpu_engines`) runs on
the cluster the Kubernetes executor uses, in its namespace, on its GPU nodes:

- one node per replica (``nodes: 1``): an ``apps/v1`` **Deployment**, one pod per replica,
  rolling updates with ``maxUnavailable: 0`` (a new pod must be Ready before an old one goes);
- several nodes per replica (``nodes: N``): a **LeaderWorkerSet**
  (``leaderworkerset.x-k8s.io/v1``), one group of N pods per replica; the leader runs the
  engine's HTTP server, the workers join it (LWS sets ``LWS_LEADER_ADDRESS`` in every pod), a
  failed pod recreates its whole group (``RecreateGroupOnPodRestart``).

Every pod:

- pulls the version's weights from the artifact store in an init container
  (``python -m tensoryard.serving.pull``, the control plane's image) into an emptyDir; its JSON
  report (bytes, seconds) comes back through the termination message, and the time from the
  engine's start to readiness is measured from the pod's status: both are the replica's load
  time in ``tyard deployments describe``;
- is **ready only when the model answers a one-token generation** (an exec readiness probe that
  POSTs ``/v1/completions`` with ``max_tokens: 1`` on the pod's loopback); a startup probe on
  ``/health`` gives a large model up to 30 minutes to load, a liveness probe restarts a wedged
  engine;
- asks for ``gpus_per_node`` GPUs (``nvidia.com/gpu``), tolerates the GPU taint, gets a
  memory-backed ``/dev/shm`` (NCCL and the engines' worker processes need more than 64 MiB).

The supervisor (:class:`KubeServing`) is idempotent: it renders the object, creates it when
missing and replaces it when its spec hash or replica count differ, and lists the pods to hand
the gateway each Ready replica's pod IP. Objects carry the labels in :data:`MANAGED`; one whose
deployment no longer exists in the store is deleted (:meth:`KubeServing.collect`), so a control
plane that died between deleting the row and deleting the object leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tensoryard.executors.kubernetes.client import Kube, KubeApiError
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.serving.gpu_engines import (
    ENGINE_PORT,
    GpuEngineOptions,
    gpu_engine_command,
    gpu_worker_command,
    parse_gpu_engine_options,
)
from tensoryard.serving.pull import STORE_ENV
from tensoryard.store._serving import DeploymentRecord

__all__ = [
    "ARTIFACT_PREFIX",
    "LABEL_DEPLOYMENT",
    "LWS",
    "MANAGED",
    "KubeServing",
    "ServingPod",
    "object_name",
    "readiness_command",
    "render",
]

log = logging.getLogger("tensoryard.serving")

LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
_KINDS = {"Deployment": ("apps", "v1", "deployments"), "LeaderWorkerSet": LWS}
LABEL_DEPLOYMENT = "tensoryard.io/deployment"
LABEL_SPEC_HASH = "tensoryard.io/spec-hash"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # set by LWS on every pod
MANAGED = {"app.kubernetes.io/managed-by": "tensoryard", "app.kubernetes.io/component": "serving"}
ARTIFACT_PREFIX = "artifact:"  # model_path of a registry version: pulled in the pod
MODELS_DIR = "/models"
RECHECK_S = 30.0  # an applied object is read back this often (someone may delete or edit it)
ENGINE_CONTAINER = "engine"
LOADER_CONTAINER = "weights"


def object_name(deployment: str) -> str:
    """The Deployment/LeaderWorkerSet name: ``tyard-<deployment>``, hashed when too long (LWS
    derives pod and Service names from it: a DNS label of at most 63 characters with room for
    ``-<group>-<worker>``)."""
    name = f"tyard-{deployment}"
    if len(name) <= 52:
        return name
    digest = hashlib.sha256(deployment.encode()).hexdigest()[:8]
    return f"tyard-{deployment[:37].rstrip('-')}-{digest}"


def readiness_command(served_name: str, port: int = ENGINE_PORT) -> list[str]:
    """An exec probe that succeeds only when the engine generates one token."""
    script = (
        "import json,sys,urllib.request as u;"
        f"r=u.Request('http://127.0.0.1:{port}/v1/completions',"
        f"data=json.dumps({{'model':{served_name!r},'prompt':'Hi','max_tokens':1,"
        "'temperature':0}).encode(),headers={'Content-Type':'application/json'});"
        "b=json.load(u.urlopen(r,timeout=8));"
        "sys.exit(0 if b.get('choices') else 1)"
    )
    return ["python3", "-c", script]


def _labels(dep: DeploymentRecord) -> dict[str, str]:
    return {**MANAGED, LABEL_DEPLOYMENT: dep.name, "tensoryard.io/team": dep.team}


def _model_dir(dep: DeploymentRecord) -> str:
    if dep.model_path.startswith(ARTIFACT_PREFIX):
        return f"{MODELS_DIR}/{dep.model_path[len(ARTIFACT_PREFIX) :]}"
    return dep.model_path  # a path on a mounted volume, or a hub id the image can reach


def _pod_spec(
    dep: DeploymentRecord,
    opts: GpuEngineOptions,
    cfg: KubernetesConfig,
    *,
    command: list[str],
    leader: bool,
    loader_image: str,
    artifact_store_url: str,
) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": opts.container_image,
        "command": command,
        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "resources": {
            "requests": {cfg.gpu_resource: str(opts.gpus_per_node)},
            "limits": {cfg.gpu_resource: str(opts.gpus_per_node)},
        },
        "volumeMounts": [
            {"name": "models", "mountPath": MODELS_DIR},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    if leader:
        engine["readinessProbe"] = {
            "exec": {"command": readiness_command(dep.name)},
            "periodSeconds": 10,
            "timeoutSeconds": 10,
            "failureThreshold": 3,
        }
        engine["startupProbe"] = {
            "httpGet": {"path": "/health", "port": ENGINE_PORT},
            "periodSeconds": 10,
            "failureThreshold": 180,  # 30 minutes to load a large model
        }
        engine["livenessProbe"] = {
            "httpGet": {"path": "/health", "port": ENGINE_PORT},
            "periodSeconds": 15,
            "timeoutSeconds": 5,
            "failureThreshold": 4,
        }
    spec: dict[str, Any] = {
        "containers": [engine],
        "volumes": [
            {"name": "models", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": cfg.shm_size}},
        ],
        "terminationGracePeriodSeconds": 60,
        "tolerations": [dict(t) for t in cfg.tolerations],
    }
    if dep.model_path.startswith(ARTIFACT_PREFIX):
        digest = dep.model_path[len(ARTIFACT_PREFIX) :]
        spec["initContainers"] = [
            {
                "name": LOADER_CONTAINER,
                "image": loader_image,
                "command": [
                    "python",
                    "-m",
                    "tensoryard.serving.pull",
                    digest,
                    f"{MODELS_DIR}/{digest}",
                ],
                "env": [{"name": STORE_ENV, "value": artifact_store_url}],
                "volumeMounts": [{"name": "models", "mountPath": MODELS_DIR}],
                "terminationMessagePolicy": "File",
            }
        ]
    if cfg.node_selector:
        spec["nodeSelector"] = dict(cfg.node_selector)
    if cfg.priority_class:
        spec["priorityClassName"] = cfg.priority_class
    if cfg.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in cfg.image_pull_secrets]
    if cfg.pvc_name:
        spec["volumes"].append(
            {"name": "shared", "persistentVolumeClaim": {"claimName": cfg.pvc_name}}
        )
        engine["volumeMounts"].append({"name": "shared", "mountPath": cfg.pvc_mount_path})
    return spec


def render(
    dep: DeploymentRecord,
    replicas: int,
    cfg: KubernetesConfig,
    *,
    loader_image: str,
    artifact_store_url: str,
) -> dict[str, Any]:
    """The Deployment (one node per replica) or LeaderWorkerSet (several) of ``dep`` with
    ``replicas`` replicas; the spec hash (everything but the count) is a label."""
    opts = parse_gpu_engine_options(dep.engine, dep.options)
    model_dir = _model_dir(dep)
    labels = _labels(dep)
    common = {"loader_image": loader_image, "artifact_store_url": artifact_store_url}
    leader_spec = _pod_spec(
        dep,
        opts,
        cfg,
        command=gpu_engine_command(opts, model_dir=model_dir, served_name=dep.name),
        leader=True,
        **common,
    )
    annotations = {"tensoryard.io/model": dep.model_ref[:250]}
    name = object_name(dep.name)
    if opts.nodes == 1:
        obj: dict[str, Any] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {LABEL_DEPLOYMENT: dep.name}},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                },
                "template": {"metadata": {"labels": labels}, "spec": leader_spec},
            },
        }
    else:
        worker_spec = _pod_spec(
            dep,
            opts,
            cfg,
            command=gpu_worker_command(opts, model_dir=model_dir, served_name=dep.name),
            leader=False,
            **common,
        )
        obj = {
            "apiVersion": f"{LWS[0]}/{LWS[1]}",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {
                "replicas": replicas,
                "startupPolicy": "LeaderCreated",
                "rolloutStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1},
                },
                "leaderWorkerTemplate": {
                    "size": opts.nodes,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": {"metadata": {"labels": labels}, "spec": leader_spec},
                    "workerTemplate": {"metadata": {"labels": labels}, "spec": worker_spec},
                },
            },
        }
    spec_hash = hashlib.sha256(
        json.dumps({**obj["spec"], "replicas": None}, sort_keys=True).encode()
    ).hexdigest()[:16]
    obj["metadata"]["labels"] = {**labels, LABEL_SPEC_HASH: spec_hash}
    return obj


@dataclass(frozen=True)
class ServingPod:
    """A replica's (leader) pod as the gateway and ``describe`` see it."""

    name: str
    ip: str | None
    ready: bool
    node: str | None
    phase: str
    restarts: int
    pull_s: float | None  # the init container's weights pull (None: not yet / not pulled)
    load_s: float | None  # the engine's start to readiness
    message: str  # why it is not ready, when it is not


def _stamp(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def pod_view(pod: Mapping[str, Any]) -> ServingPod:
    """A pod (the API's JSON) as a ServingPod: readiness, address and load times."""
    meta, status = pod.get("metadata", {}), pod.get("status", {}) or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    ready_cond = conds.get("Ready", {})
    ready = ready_cond.get("status") == "True" and bool(status.get("podIP"))
    pull_s: float | None = None
    message = ""
    for init in status.get("initContainerStatuses") or []:
        term = (init.get("state") or {}).get("terminated") or {}
        text = term.get("message") or ""
        try:
            report = json.loads(text) if text else {}
        except ValueError:
            report = {}
        if "pull_s" in report:
            pull_s = float(report["pull_s"])
        if report.get("error"):
            message = str(report["error"])
        waiting = (init.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            message = f"{init.get('name')}: {waiting['reason']}"
    load_s: float | None = None
    restarts = 0
    for c in status.get("containerStatuses") or []:
        if c.get("name") != ENGINE_CONTAINER:
            continue
        restarts = int(c.get("restartCount") or 0)
        state = c.get("state") or {}
        started = _stamp((state.get("running") or {}).get("startedAt"))
        became = _stamp(ready_cond.get("lastTransitionTime"))
        if ready and started and became and became >= started:
            load_s = round((became - started).total_seconds(), 1)
        waiting = state.get("waiting") or {}
        if waiting.get("reason"):
            message = f"engine: {waiting['reason']}"
    if not ready and not message:
        message = str(ready_cond.get("message") or status.get("phase") or "Pending")
    return ServingPod(
        name=str(meta.get("name", "")),
        ip=status.get("podIP"),
        ready=ready,
        node=(pod.get("spec") or {}).get("nodeName"),
        phase=str(status.get("phase") or "Pending"),
        restarts=restarts,
        pull_s=pull_s,
        load_s=load_s,
        message="" if ready else message,
    )


class KubeServing:
    """Creates, scales, updates and deletes the serving objects; lists their pods."""

    def __init__(self, kube: Kube, *, loader_image: str, artifact_store_url: str) -> None:
        self.kube = kube
        self.cfg = kube.config
        self.ns = kube.config.namespace
        self.loader_image = loader_image
        self.artifact_store_url = artifact_store_url
        self._applied: dict[str, tuple[str, int]] = {}  # name -> (spec hash, replicas) applied
        self._checked: dict[str, float] = {}  # name -> when the object was last read back

    # -- objects -------------------------------------------------------------------------------

    def render(self, dep: DeploymentRecord, replicas: int) -> dict[str, Any]:
        return render(
            dep,
            replicas,
            self.cfg,
            loader_image=self.loader_image,
            artifact_store_url=self.artifact_store_url,
        )

    def ensure(self, dep: DeploymentRecord, replicas: int) -> bool:
        """Make the object match ``dep`` with ``replicas`` (create or replace); True when a
        call changed something. Cheap when nothing changed since the last call."""
        obj = self.render(dep, replicas)
        want = (obj["metadata"]["labels"][LABEL_SPEC_HASH], replicas)
        fresh = time.monotonic() - self._checked.get(dep.name, float("-inf")) < RECHECK_S
        if self._applied.get(dep.name) == want and fresh:
            return False
        kind, name = obj["kind"], obj["metadata"]["name"]
        current = self._read(kind, name)
        self._checked[dep.name] = time.monotonic()  # deleted or edited by hand: seen again
        if current is None:
            self._create(obj)
            log.info("serving: created %s %s (%d replicas)", kind, name, replicas)
        else:
            have = (
                (current.get("metadata", {}).get("labels") or {}).get(LABEL_SPEC_HASH),
                (current.get("spec") or {}).get("replicas"),
            )
            if have == want:
                self._applied[dep.name] = want
                return False
            obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self._replace(obj)
            log.info("serving: updated %s %s (%d replicas)", kind, name, replicas)
        self._applied[dep.name] = want
        return True

    def delete(self, deployment: str) -> None:
        """Delete both possible objects of a deployment (absent ones are fine)."""
        self._forget(deployment)
        name = object_name(deployment)
        for kind in ("Deployment", "LeaderWorkerSet"):
            self._delete(kind, name)

    def collect(self, keep: Iterable[str]) -> list[str]:
        """Delete managed objects whose deployment is not in ``keep``; their names."""
        keep = set(keep)
        selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
        found: list[tuple[str, dict[str, Any]]] = []
        found += [("Deployment", o) for o in self._list("Deployment", selector)]
        found += [("LeaderWorkerSet", o) for o in self._list("LeaderWorkerSet", selector)]
        gone = []
        for kind, obj in found:
            dep = (obj.get("metadata", {}).get("labels") or {}).get(LABEL_DEPLOYMENT)
            if dep and dep not in keep:
                self._forget(dep)
                self._delete(kind, obj["metadata"]["name"])
                gone.append(f"{kind}/{obj['metadata']['name']}")
        return gone

    def _forget(self, deployment: str) -> None:
        self._applied.pop(deployment, None)
        self._checked.pop(deployment, None)

    def pods(self, dep: DeploymentRecord) -> list[ServingPod]:
        """The pods that serve requests (every pod of a Deployment, the leaders of an LWS)."""
        k = self.kube
        result = k.call(
            f"list pods in namespace {self.ns}",
            k.core.list_namespaced_pod,
            self.ns,
            label_selector=f"{LABEL_DEPLOYMENT}={dep.name}",
        )
        out = []
        for raw in result.items:
            pod = k.plain(raw)
            labels = pod.get("metadata", {}).get("labels") or {}
            if labels.get(LWS_WORKER_INDEX, "0") != "0":
                continue  # an LWS worker: the leader serves
            if pod.get("metadata", {}).get("deletionTimestamp"):
                continue
            out.append(pod_view(pod))
        return sorted(out, key=lambda p: p.name)

    # -- API calls: one path for both kinds (the generic API serves apps/v1 as well) ---------

    def _call(self, verb: str, kind: str, fn: str, *args: Any, **kwargs: Any) -> Any:
        group, version, plural = _KINDS[kind]
        what = f"{verb} {plural}.{group} in namespace {self.ns}"
        k = self.kube
        return k.call(what, getattr(k.custom, fn), group, version, self.ns, plural, *args, **kwargs)

    def _read(self, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self._call("get", kind, "get_namespaced_custom_object", name))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _create(self, obj: dict[str, Any]) -> None:
        try:
            self._call("create", obj["kind"], "create_namespaced_custom_object", obj)
        except KubeApiError as exc:
            if exc.status == 404 and obj["kind"] == "LeaderWorkerSet":
                raise KubeApiError(
                    f"{exc} (the LeaderWorkerSet CRD is not installed; fix: install LWS, "
                    "https://lws.sigs.k8s.io, or serve on one node per replica: options.nodes=1)",
                    404,
                ) from exc
            raise

    def _replace(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self._call("update", obj["kind"], "replace_namespaced_custom_object", name, obj)

    def _delete(self, kind: str, name: str) -> None:
        body = {"propagationPolicy": "Foreground"}
        try:
            self._call("delete", kind, "delete_namespaced_custom_object", name, body=body)
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    def _list(self, kind: str, selector: str) -> list[dict[str, Any]]:
        try:
            got = self._call("list", kind, "list_namespaced_custom_object", label_selector=selector)
        except KubeApiError as exc:
            if exc.status == 404:  # LWS not installed: nothing of that kind exists
                return []
            raise
        return list(got.get("items") or [])
