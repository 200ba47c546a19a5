"""KubernetesExecutor: each attempt is a JobSet (or an Indexed Job plus a headless Service).

    launch:  Secret (job token) ─> JobSet | Job (+ Service owned by the Job) ─> Secret owned
             by the JobSet/Job, so deleting the JobSet/Job deletes everything of the attempt
    poll:    read the JobSet/Job by name, list its pods by the attempt-key label ─> status
    cancel:  delete the pods with the grace period (SIGTERM; the runtime checkpoints), then the
             JobSet/Job in the foreground (it goes once its pods are gone)

Every object carries the labels tensoryard.io/job-id, /attempt and /attempt-key, so `launch`
is idempotent by attempt key (AlreadyExists with the same key means already launched) and
`terminate`/`reattach` find the objects from the stored handle alone. The platform's scheduler
chose the nodes; the pods carry node affinity to exactly those. The JobSet's own restarts are
off: attempt N+1 is new objects, resumed from the last checkpoint by the platform.

When an attempt ends, the last lines of each pod's log are kept in the run dir
(`attempt-N/rank-K.log`) so `tyard logs` works after the pods are gone.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tensoryard import __version__, envvars
from tensoryard.errors import ConfigError, ExecutorError
from tensoryard.executors.base import AttemptPhase, AttemptStatus, LaunchRequest
from tensoryard.executors.kubernetes.client import JOBSET, Kube, KubeApiError, check_volumes
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.kubernetes.kueue import KueueAdmission
from tensoryard.executors.kubernetes.manifests import (
    LABEL_ATTEMPT_KEY,
    LABEL_JOB_ID,
    RESERVED_ENV,
    TOKEN_KEY,
    AttemptWorkload,
    owner_reference,
    render_headless_service,
    render_indexed_job,
    render_jobset,
)
from tensoryard.executors.kubernetes.status import (
    Obj,
    alive,
    attempt_status,
    get,
    node_loss,
    placement_nodes,
    pod_rank,
)
from tensoryard.executors.kubernetes.watch import WatchCache
from tensoryard.images import ImageRefError, default_matrix, resolve_image

__all__ = ["KubernetesExecutor", "KubernetesHandle", "render_attempt", "workload_for"]

_HANDLE_VERSION = 1
_LOG_READERS = 8  # concurrent reads of a gang's pod logs when an attempt ends
_ENDERS = 4  # attempts ended (logs kept, outcome recorded) at once off the control loop
# While an attempt lacks pods, its Jobs' FailedCreate events are read at most this often.
FAILED_CREATE_EVERY_S = 5.0
_JOBSET_API = f"{JOBSET[0]}/{JOBSET[1]}"


@dataclass(frozen=True)
class KubernetesHandle:
    """What the control plane stores for a Kubernetes attempt (as a JSON-able dict)."""

    job_id: str
    attempt: int
    attempt_key: str
    namespace: str
    name: str
    kind: str  # "JobSet" or "Job"
    nodes: int
    attempt_dir: str

    def to_dict(self) -> dict[str, Any]:
        return {"executor": "kubernetes", "version": _HANDLE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KubernetesHandle:
        if data.get("executor") != "kubernetes":
            raise ExecutorError(
                f"handle belongs to executor {data.get('executor')!r}, not 'kubernetes'"
            )
        try:
            return cls(
                job_id=str(data["job_id"]),
                attempt=int(data["attempt"]),
                attempt_key=str(data["attempt_key"]),
                namespace=str(data["namespace"]),
                name=str(data["name"]),
                kind=str(data["kind"]),
                nodes=int(data["nodes"]),
                attempt_dir=str(data["attempt_dir"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExecutorError(f"malformed kubernetes handle ({exc!r}): {dict(data)}") from exc

    @property
    def selector(self) -> str:
        return f"{LABEL_ATTEMPT_KEY}={self.attempt_key}"

    @property
    def secret(self) -> str:
        return f"{self.name}-token"


def workload_for(
    request: LaunchRequest,
    config: KubernetesConfig,
    *,
    grace_s: float = 30.0,
    kueue_priority_class: str | None = None,
) -> AttemptWorkload:
    """The AttemptWorkload of a launch request (ExecutorError when it cannot run here). With
    Kueue admission, a multi-node job's `scheduling.topology` (required / preferred) becomes a
    Topology-Aware Scheduling request at the leaf-switch level (`config.switch_label`, which
    must be a level of the Kueue Topology), and `kueue_priority_class` its priority class."""
    spec = request.spec
    kueue = config.admission == "kueue"
    topology = spec.scheduling.topology
    tas = (
        (topology, config.switch_label)
        if kueue and topology != "none" and spec.resources.nodes > 1
        else None
    )
    image = spec.image or config.default_image
    expect = None
    if image:
        named = image
        try:  # a matrix name (`cpu`) becomes its full reference
            image = resolve_image(image)
            expect = _image_expect(named, image)
        except (ImageRefError, ConfigError) as exc:
            raise ExecutorError(str(exc)) from exc
    if not image:
        raise ExecutorError(
            f"job {request.job_id} names no container image (fix: set `image:` in the job spec, "
            "or start the server with --default-image)"
        )
    env = {**spec.env, **request.env}
    env = {k: v for k, v in env.items() if k not in RESERVED_ENV}
    return AttemptWorkload(
        job_id=str(request.job_id),
        attempt=request.attempt,
        attempt_key=request.attempt_key,
        team=spec.team,
        image=image,
        image_expect=expect,
        command=list(spec.command),
        namespace=config.namespace,
        env=env,
        token_secret=f"ty-{_slug(request.job_id)}-{request.attempt}-token",
        nodes=spec.resources.nodes,
        processes_per_node=spec.resources.procs,
        cpu=spec.resources.cpu,
        memory_bytes=spec.resources.memory,
        workdir=spec.workdir,
        run_dir=str(request.run_dir) if config.runs_claim else None,
        runs_claim=config.runs_claim,
        run_as_user=config.run_as_user,
        in_place_restarts=request.in_place_restarts,
        gpus_per_node=spec.resources.gpus_per_node,
        node_names=sorted(request.placement),
        tolerations=tuple(config.tolerations),
        priority_class=config.priority_class,
        image_pull_secrets=tuple(config.image_pull_secrets),
        shm_size=config.shm_size,
        pvc_name=config.pvc_name,
        pvc_mount_path=config.pvc_mount_path,
        volumes=(
            *config.team_volumes.get(spec.team, ()),
            *((v.claim, v.mount, v.read_only) for v in spec.volumes),
        ),
        termination_grace_s=max(int(grace_s), 0),
        pod_annotations={
            **config.pod_annotations,
            "tensoryard.io/leader-epoch": str(request.fencing_epoch),  # the fencing token
        },
        ttl_after_finished_s=config.keep_finished_s,
        kueue_queue=spec.team if kueue else None,
        kueue_priority_class=kueue_priority_class if kueue else None,
        kueue_topology=tas,
    )


def _image_expect(named: str, ref: str) -> str | None:
    """What the matrix entry `named` pins, for the pod's preflight (None: `named` is a full
    reference, or a control-plane image without torch)."""
    matrix = default_matrix()
    if named not in matrix.entries:
        return None
    entry = matrix.entries[named]
    if entry.torch is None:
        return None
    pins = {
        "name": named,
        "ref": ref,
        "torch": entry.torch,
        "python": entry.python,
        "tensoryard": __version__,
    }
    return json.dumps(pins, sort_keys=True)


def _hand_over(run_dir: Path, attempt_dir: Path, uid: int | None) -> None:
    """Make the job's run directory and this attempt's directory writable by the pods' user
    (they are on the runs claim, which the pods mount). Only a control plane running as root
    can give them away; one running as the pods' user owns them already."""
    if uid is None or os.geteuid() != 0:
        return
    # with the NCCL log directories the control plane made there (NCCL creates none itself)
    for path in (run_dir, attempt_dir, run_dir / "nccl", run_dir / "nccl" / "inspector"):
        if path.is_dir():
            os.chown(path, uid, uid)


JobChanged = Callable[[int | None], None]


def _attempt_key_of(obj: Obj) -> list[str]:
    key = (get(obj, "metadata", "labels") or {}).get(LABEL_ATTEMPT_KEY)
    return [str(key)] if key else []


def _slug(job_id: str) -> str:
    import re

    return re.sub(r"[^a-z0-9]+", "-", str(job_id).lower()).strip("-")


def render_attempt(w: AttemptWorkload, kind: str) -> list[dict[str, Any]]:
    """Every object the executor creates for `w`, in creation order. The Secret's data is a
    placeholder here; owner references are added once the owner exists (its uid)."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": w.token_secret,
            "namespace": w.namespace,
            "labels": w.labels(),
            "annotations": dict(w.labels()),
        },
        "type": "Opaque",
        "stringData": {TOKEN_KEY: "<the job token, derived at launch>"},
    }
    if kind == "JobSet":
        return [secret, render_jobset(w)]
    return [secret, render_indexed_job(w), render_headless_service(w)]


class KubernetesExecutor:
    """Runs attempts as JobSets or Indexed Jobs in one namespace (see the module docstring).

    Args:
        kube: a connected client (`client.connect`), which also carries the config.
        kind: "JobSet" or "Job"; None: from `config.workload` ("auto": JobSet when its CRD
            is installed).
        grace_s: terminationGracePeriodSeconds of the pods (the server's cancel grace).
    """

    name = "kubernetes"

    def __init__(self, kube: Kube, *, kind: str | None = None, grace_s: float = 30.0) -> None:
        self.kube = kube
        self.config = kube.config
        self.grace_s = grace_s
        self.kind = kind or _choose_kind(kube)
        self._pod_cache: WatchCache | None = None
        self._changed: JobChanged | None = None  # see report_changes
        self._owner_cache: WatchCache | None = None
        self._node_cache: WatchCache | None = None  # Node objects: a lost node is seen at once
        # namespace -> (when its FailedCreate events were listed, the newest of each object:
        # name -> (time, kind, message)); attempt key -> (that listing's time, what it said)
        self._failed_creates: dict[str, tuple[float, dict[str, tuple[str, str, str]]]] = {}
        self._create_checked: dict[str, tuple[float, str | None]] = {}
        # Ending an attempt off the control loop (with the watches): attempt key -> the status
        # its last poll answered (what a poll answers while its ending runs) and the ending
        self._last_status: dict[str, AttemptStatus] = {}
        self._ending: dict[str, Future[None]] = {}
        self._ending_lock = threading.Lock()
        self._enders: ThreadPoolExecutor | None = None
        self.kueue: KueueAdmission | None = None
        if self.config.admission == "kueue":
            self.kueue = KueueAdmission(kube, self.config.namespace)
            self.kueue.check_installed()

    @property
    def external_admission(self) -> bool:
        """Kueue, not tensoryard's scheduler, admits this executor's attempts."""
        return self.kueue is not None

    def start_watches(self) -> None:
        """Keep this namespace's tensoryard pods and JobSets/Jobs in list-then-watch caches,
        so polls cost no API call (without them each poll makes a GET and a LIST)."""
        k, ns = self.kube, self.config.namespace
        self._pod_cache = WatchCache(
            k,
            f"pods in {ns}",
            k.core.list_namespaced_pod,
            ns,
            label_selector=LABEL_ATTEMPT_KEY,
            index=_attempt_key_of,
        ).start()
        if self.kind == "JobSet":
            owners = WatchCache(
                k,
                f"jobsets in {ns}",
                k.custom.list_namespaced_custom_object,
                *_jobset(ns),
                label_selector=LABEL_ATTEMPT_KEY,
            )
        else:
            owners = WatchCache(
                k,
                f"jobs in {ns}",
                k.batch.list_namespaced_job,
                ns,
                label_selector=LABEL_ATTEMPT_KEY,
            )
        self._owner_cache = owners.start()
        self._listen(self._pod_cache, self._owner_cache)
        self._node_cache = WatchCache(k, "nodes", k.core.list_node).start()
        if self.kueue is not None:
            self.kueue.start_watch()

    @property
    def reports_starts(self) -> bool:
        """Pod events tell a start as well as an end (with the watches on)."""
        return self._pod_cache is not None

    def report_changes(self, changed: JobChanged) -> bool:
        """Tell `changed(job_id)` when one of a job's pods or its JobSet/Job changes, from
        the watches (False without them: `start_watches` was not called)."""
        self._changed = changed
        self._listen(self._pod_cache, self._owner_cache)
        return self._pod_cache is not None and self._owner_cache is not None

    def _listen(self, *caches: WatchCache | None) -> None:
        """Have each cache tell `_tell_job` about its changes (once per cache)."""
        if self._changed is None:
            return
        for cache in caches:
            if cache is not None and self._tell_job not in cache.listeners:
                cache.listeners.append(self._tell_job)

    def _tell_job(self, kind: str, obj: Obj) -> None:
        """A watched object changed: name its job (None after a relist, or without a label)."""
        if self._changed is not None:
            job = str((get(obj, "metadata", "labels") or {}).get(LABEL_JOB_ID, ""))
            self._changed(int(job) if job.isdigit() else None)

    def close(self) -> None:
        for cache in (self._pod_cache, self._owner_cache, self._node_cache):
            if cache is not None:
                cache.stop()
        if self.kueue is not None:
            self.kueue.stop()
        if self._enders is not None:
            self._enders.shutdown(wait=True, cancel_futures=False)

    # -- launch -------------------------------------------------------------------------------

    def prepare(self, request: LaunchRequest) -> dict[str, Any]:
        """The handle, computed without side effects (recorded before anything is created)."""
        w = workload_for(request, self.config, grace_s=self.grace_s)
        return self._handle(request, w).to_dict()

    def _handle(self, request: LaunchRequest, w: AttemptWorkload) -> KubernetesHandle:
        attempt_dir = Path(request.run_dir).resolve() / f"attempt-{request.attempt}"
        return KubernetesHandle(
            job_id=w.job_id,
            attempt=w.attempt,
            attempt_key=w.attempt_key,
            namespace=w.namespace,
            name=w.name,
            kind=self.kind,
            nodes=w.nodes,
            attempt_dir=str(attempt_dir),
        )

    def render(self, request: LaunchRequest) -> list[dict[str, Any]]:
        """What `launch` would create for `request` (for `tyard k8s render`)."""
        return render_attempt(self._workload(request), self.kind)

    def _workload(self, request: LaunchRequest) -> AttemptWorkload:
        """workload_for, with the Kueue priority class of the job's priority (Kueue mode)."""
        wpc = None
        if self.kueue is not None:
            wpc = self.kueue.priority_class_for(request.spec.priority)
        return workload_for(request, self.config, grace_s=self.grace_s, kueue_priority_class=wpc)

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        """Create Secret, JobSet (or Job + Service), then make the Secret owned by it.

        Idempotent by attempt key: an object that already exists with this key is taken as
        created by an earlier call; one with another key is an error (nothing is touched)."""
        if not request.attempt_key:
            raise ExecutorError("the Kubernetes executor needs the request's attempt_key")
        w = self._workload(request)
        h = self._handle(request, w)
        # A claim deleted since the submission: its pods would wait for it forever.
        for i, problem, fix in check_volumes(self.kube, [claim for claim, _, _ in w.volumes]):
            raise ExecutorError(f"volumes.{i}.claim: {problem} (fix: {fix})")
        Path(h.attempt_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.config.runs_claim:
            _hand_over(Path(request.run_dir), Path(h.attempt_dir), self.config.run_as_user)
        token = request.env.get(envvars.JOB_TOKEN.name, "")
        objects = render_attempt(w, self.kind)
        secret = {**objects[0], "stringData": {TOKEN_KEY: token}}
        self._create(h, "secrets", secret)
        try:
            owner = self._create(h, self._resource, objects[1])
        except ExecutorError:
            # Refused (a webhook, a quota, RBAC): leave nothing half-created behind.
            self._ignore_404(
                f"delete secrets in namespace {h.namespace}",
                self.kube.core.delete_namespaced_secret,
                w.token_secret,
                h.namespace,
            )
            raise
        owner_ref = owner_reference(
            objects[1]["apiVersion"], self.kind, w.name, str(get(owner, "metadata", "uid"))
        )
        if self.kind == "Job":
            service = objects[2]
            service["metadata"]["ownerReferences"] = [owner_ref]
            self._create(h, "services", service)
        self.kube.call(
            f"patch secrets in namespace {h.namespace}",
            self.kube.core.patch_namespaced_secret,
            w.token_secret,
            h.namespace,
            {"metadata": {"ownerReferences": [owner_ref]}},
        )
        return h.to_dict()

    @property
    def _resource(self) -> str:
        return "jobsets.jobset.x-k8s.io" if self.kind == "JobSet" else "jobs.batch"

    def _create(self, h: KubernetesHandle, resource: str, body: dict[str, Any]) -> Obj:
        """Create `body`; AlreadyExists with this attempt's key returns the existing object."""
        name = body["metadata"]["name"]
        what = f"create {resource} in namespace {h.namespace}"
        try:
            return self._call_create(resource, h.namespace, body, what)
        except KubeApiError as exc:
            if exc.status != 409:
                raise
        existing = self._read(resource, h.namespace, name)
        key = (get(existing, "metadata", "labels") or {}).get(LABEL_ATTEMPT_KEY)
        if existing is None or key != h.attempt_key:
            raise ExecutorError(
                f"{resource} {h.namespace}/{name} already exists for attempt key {key!r}, not "
                f"{h.attempt_key!r} (fix: delete it, `kubectl delete {resource} -n "
                f"{h.namespace} {name}`, if no tensoryard job owns it)"
            )
        return existing

    def _call_create(self, resource: str, ns: str, body: dict[str, Any], what: str) -> Obj:
        k = self.kube
        if resource == "secrets":
            return _obj(k.plain(k.call(what, k.core.create_namespaced_secret, ns, body)))
        if resource == "services":
            return _obj(k.plain(k.call(what, k.core.create_namespaced_service, ns, body)))
        if resource == "jobs.batch":
            return _obj(k.plain(k.call(what, k.batch.create_namespaced_job, ns, body)))
        return _obj(k.call(what, k.custom.create_namespaced_custom_object, *_jobset(ns), body))

    def _read(self, resource: str, ns: str, name: str) -> Obj | None:
        """The object, or None when it does not exist."""
        k = self.kube
        what = f"get {resource} in namespace {ns}"
        try:
            if resource == "secrets":
                return _obj(k.plain(k.call(what, k.core.read_namespaced_secret, name, ns)))
            if resource == "services":
                return _obj(k.plain(k.call(what, k.core.read_namespaced_service, name, ns)))
            if resource == "jobs.batch":
                return _obj(k.plain(k.call(what, k.batch.read_namespaced_job, name, ns)))
            return dict(k.call(what, k.custom.get_namespaced_custom_object, *_jobset(ns), name))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    # -- watch --------------------------------------------------------------------------------

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        """The attempt's phase from its JobSet/Job and pods (found by the attempt-key label).

        Once it has ended the outcome is written to the attempt dir (with the pods' last log
        lines), so later polls answer from there even when the objects are gone. With the
        watches (`report_changes`) that ending runs on a thread of its own: polls answer what
        they answered before until the outcome is on record, then the job is named to the loop."""
        h = KubernetesHandle.from_dict(handle)
        final = self._recorded(h)
        if final is not None:
            self._last_status.pop(h.attempt_key, None)
            return final
        if self.kueue is not None:
            evicted = self._recorded(h, self._evicted_file(h))
            if evicted is not None:  # an eviction interrupted between its steps: finish it
                return self._end_evicted(h, handle, evicted, [])
        owner, pods = self._observe(h)
        if self.kueue is not None and owner is not None:
            held = self.kueue.held(h.attempt_key, owner)
            if held is not None and held.finished:
                self._record(h, held, self._evicted_file(h))  # the intent, first
                return self._end_evicted(h, handle, held, pods)
            if held is not None:
                return held
        status = attempt_status(
            h.kind,
            owner,
            pods,
            nodes=h.nodes,
            cancelled=self._cancel_file(h).exists(),
            lost_nodes=self._lost_nodes(pods),
        )
        if status.phase is AttemptPhase.STARTING and not status.reason and owner is not None:
            refused = self._failed_create(h, pods)
            if refused:
                status = AttemptStatus(AttemptPhase.STARTING, None, refused)
        if status.phase is not AttemptPhase.STARTING:
            self._create_checked.pop(h.attempt_key, None)
        if status.finished:
            held = self._last_status.get(h.attempt_key)
            if self._changed is not None and held is not None:
                return self._end_in_background(h, status, pods, held)
            self._end(h, status, pods)
            return status
        if self.kueue is not None and owner is not None and status.phase is AttemptPhase.RUNNING:
            how = self.kueue.admitted(h.attempt_key, owner)
            status = AttemptStatus(
                AttemptPhase.RUNNING,
                reason=f"admitted by Kueue: {how}",
                admitted_at=self.kueue.admitted_at(h.attempt_key),
            )
        self._last_status[h.attempt_key] = status
        return status

    def _end(self, h: KubernetesHandle, status: AttemptStatus, pods: list[Obj]) -> None:
        """An ended attempt: its pods' logs kept, a failed gang's other pods stopped, the
        outcome recorded (each step idempotent: a crash in between is finished by the next
        poll)."""
        self._keep_logs(h, pods)
        if status.phase is AttemptPhase.FAILED:
            self._stop_rest_of_gang(h)
        self._record(h, status)
        self._last_status.pop(h.attempt_key, None)
        if self.kueue is not None:
            self.kueue.forget(h.attempt_key)

    def _end_in_background(
        self, h: KubernetesHandle, status: AttemptStatus, pods: list[Obj], held: AttemptStatus
    ) -> AttemptStatus:
        """`_end` on a thread of its own, the poll answering what it answered before until it
        is done (then the job is named to the loop, whose next poll reads the outcome). Each
        ending reads a gang's logs through the API: on the loop's thread, a busy cluster's
        endings took most of the cycle (0.7-1.4 s at 1,700 unfinished jobs)."""
        key = h.attempt_key
        with self._ending_lock:
            running = self._ending.get(key)
            if running is None:
                if self._enders is None:
                    self._enders = ThreadPoolExecutor(_ENDERS, thread_name_prefix="tyard-k8s-end")
                self._ending[key] = self._enders.submit(self._end_and_tell, h, status, pods)
                return held
            if not running.done():
                return held
            del self._ending[key]
        running.result()  # it failed: raised here as a poll on the loop would have raised
        return self._recorded(h) or held  # (a successful ending removes itself first)

    def _end_and_tell(self, h: KubernetesHandle, status: AttemptStatus, pods: list[Obj]) -> None:
        self._end(h, status, pods)  # an exception stays with the future for the next poll
        with self._ending_lock:
            self._ending.pop(h.attempt_key, None)
        if self._changed is not None and h.job_id.isdigit():
            self._changed(int(h.job_id))

    def _end_evicted(
        self, h: KubernetesHandle, handle: dict[str, Any], status: AttemptStatus, pods: list[Obj]
    ) -> AttemptStatus:
        """Kueue evicted the attempt: delete its JobSet/Job before saying so, or Kueue would
        admit and run it again under an attempt the control plane believes ended. Pods still
        stopping keep their grace period (they are writing a checkpoint). Each step is
        idempotent; the intent was recorded first, so a crash in between finishes here."""
        self._keep_logs(h, pods)
        self.cancel(handle, grace_s=self.grace_s)
        self._record(h, status)
        if self.kueue is not None:
            self.kueue.forget(h.attempt_key)
        return status

    def _stop_rest_of_gang(self, h: KubernetesHandle) -> None:
        """A failed attempt's other pods are of no use and hold GPUs the next attempt needs:
        delete them (with the grace period), keeping the failed pods for `kubectl describe`."""
        self.kube.call(
            f"deletecollection pods in namespace {h.namespace}",
            self.kube.core.delete_collection_namespaced_pod,
            h.namespace,
            label_selector=h.selector,
            field_selector="status.phase!=Failed,status.phase!=Succeeded",
            grace_period_seconds=max(int(self.grace_s), 0),
        )

    def reattach(self, handle: dict[str, Any]) -> AttemptStatus:
        """After a control-plane restart: the objects are found again by name and label."""
        return self.poll(handle)

    def log_paths(self, handle: dict[str, Any]) -> dict[int, Path]:
        """Node rank -> the kept log of its pod (written when the attempt ends)."""
        h = KubernetesHandle.from_dict(handle)
        return {rank: Path(h.attempt_dir) / f"rank-{rank}.log" for rank in range(h.nodes)}

    def live_log(self, handle: dict[str, Any], rank: int) -> bytes | None:
        """A running rank's log, read from its pod through the API (None when the attempt has
        ended, its log is kept in the attempt directory then, or the pod has no log yet)."""
        h = KubernetesHandle.from_dict(handle)
        if self._recorded(h) is not None:
            return None
        pods = [p for p in self._observe(h)[1] if pod_rank(p) == rank and alive(p)]
        if not pods:
            return None
        try:
            return self._pod_log(h, str(get(pods[-1], "metadata", "name"))).encode("utf-8")
        except ExecutorError:  # not started yet, or a node without a kubelet (kwok)
            return None

    def _pod_log(self, h: KubernetesHandle, name: str, tail_lines: int | None = None) -> str:
        extra = {"tail_lines": tail_lines} if tail_lines is not None else {}
        text = self.kube.call(
            f"get pods/log in namespace {h.namespace}",
            self.kube.core.read_namespaced_pod_log,
            name,
            h.namespace,
            **extra,
        )
        return str(text)

    def observed_pods(self) -> list[Obj]:
        """Every pod of a platform job in the namespace (for metrics): from the watch cache
        while it is healthy, else one LIST."""
        cache = self._pod_cache
        if cache is not None and cache.ready():
            return cache.items()
        ns = self.config.namespace
        result = self.kube.call(
            f"list pods in namespace {ns}",
            self.kube.core.list_namespaced_pod,
            ns,
            label_selector=LABEL_ATTEMPT_KEY,
        )
        return [self.kube.plain(p) for p in result.items]

    def _observe(self, h: KubernetesHandle) -> tuple[Obj | None, list[Obj]]:
        """The owner and pods of the attempt: from the watch caches when they are healthy and
        hold the owner; else (just created, gone, or no watch) straight from the API."""
        pods_cache, owners = self._pod_cache, self._owner_cache
        if pods_cache is not None and owners is not None and pods_cache.ready() and owners.ready():
            owner = owners.get(h.name)
            key = (get(owner, "metadata", "labels") or {}).get(LABEL_ATTEMPT_KEY)
            if owner is not None and key == h.attempt_key:
                return owner, pods_cache.indexed(h.attempt_key)
        return self._read(self._resource_of(h), h.namespace, h.name), self._pods(h)

    def _failed_create(self, h: KubernetesHandle, pods: list[Obj]) -> str | None:
        """Why the attempt's Job (or the JobSet's Jobs) cannot create its pods: the newest
        `FailedCreate` event of one of them ("exceeded quota", a pod security or admission
        webhook refusal), from the namespace's listing (`_failed_create_events`)."""
        if len(pods) >= h.nodes:
            return None
        listed, events = self._failed_create_events(h.namespace)
        checked, said = self._create_checked.get(h.attempt_key, (float("nan"), None))
        if checked == listed:
            return said
        newest: tuple[str, str] | None = None
        for job, (at, kind, message) in events.items():
            if job != h.name and not job.startswith(f"{h.name}-"):
                continue
            if newest is None or at >= newest[0]:
                newest = (at, f"{kind} {job} cannot create its pods (FailedCreate: {message})")
        said = newest[1] if newest else None
        self._create_checked[h.attempt_key] = (listed, said)
        return said

    def _failed_create_events(
        self, namespace: str
    ) -> tuple[float, dict[str, tuple[str, str, str]]]:
        """When the namespace's `FailedCreate` events were listed, and the newest of each Job
        and JobSet then: one LIST for every attempt that lacks pods, at most every
        FAILED_CREATE_EVERY_S. (A LIST per such attempt held a control cycle for seconds on
        a busy API server: with hundreds of attempts waiting for pods, two thirds of the
        loop's time at 128 nodes x 2,000 jobs.)"""
        now = time.monotonic()
        listed = self._failed_creates.get(namespace)
        if listed is not None and now - listed[0] < FAILED_CREATE_EVERY_S:
            return listed
        result = self.kube.call(
            f"list events in namespace {namespace}",
            self.kube.core.list_namespaced_event,
            namespace,
            field_selector="reason=FailedCreate",
        )
        newest: dict[str, tuple[str, str, str]] = {}
        for event in result.items:
            e = self.kube.plain(event)
            kind = str(get(e, "involvedObject", "kind") or "")
            job = str(get(e, "involvedObject", "name") or "")
            if kind not in ("Job", "JobSet") or not job:
                continue
            at = str(e.get("lastTimestamp") or get(e, "metadata", "creationTimestamp") or "")
            if job not in newest or at >= newest[job][0]:
                message = " ".join(str(e.get("message") or "no message").split())
                newest[job] = (at, kind, message)
        self._failed_creates[namespace] = (now, newest)
        return now, newest

    def _resource_of(self, h: KubernetesHandle) -> str:
        return "jobsets.jobset.x-k8s.io" if h.kind == "JobSet" else "jobs.batch"

    def _pods(self, h: KubernetesHandle) -> list[Obj]:
        result = self.kube.call(
            f"list pods in namespace {h.namespace}",
            self.kube.core.list_namespaced_pod,
            h.namespace,
            label_selector=h.selector,
        )
        return [self.kube.plain(p) for p in result.items]

    def _lost_nodes(self, pods: list[Obj]) -> dict[str, str]:
        """node -> what happened to it, for the nodes the attempt's pods are on or pinned to
        that are lost (deleted, NotReady/Unknown, tainted unreachable): from the node watch
        when it is healthy, else one GET per node."""
        out: dict[str, str] = {}
        for name in sorted(placement_nodes(pods)):
            lost = node_loss(name, self._node(name))
            if lost is not None:
                out[name] = lost
        return out

    def _node(self, name: str) -> Obj | None:
        cache = self._node_cache
        if cache is not None and cache.ready():
            return cache.get(name)
        try:
            node: Obj = self.kube.plain(self.kube.call("get nodes", self.kube.core.read_node, name))
            return node
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _keep_logs(self, h: KubernetesHandle, pods: list[Obj]) -> None:
        """The last lines of each pod's log into attempt-N/rank-K.log (never overwritten).

        A gang's pods are read concurrently (up to _LOG_READERS at once): one API round trip
        each, on the control loop's thread, made a busy API server's latency times the gang's
        size per ended attempt."""
        todo = []
        for pod in pods:
            rank = pod_rank(pod)
            path = Path(h.attempt_dir) / f"rank-{rank}.log"
            if rank >= 0 and not path.exists():
                todo.append((str(get(pod, "metadata", "name")), path))
        if len(todo) <= 1:
            for name, path in todo:
                self._keep_log(h, name, path)
            return
        with ThreadPoolExecutor(max_workers=min(_LOG_READERS, len(todo))) as pool:
            for done in [pool.submit(self._keep_log, h, name, path) for name, path in todo]:
                done.result()

    def _keep_log(self, h: KubernetesHandle, name: str, path: Path) -> None:
        try:
            text = self._pod_log(h, name, self.config.log_tail_lines)
        except ExecutorError as exc:
            text = f"[tensoryard] the log of pod {name} could not be read: {exc}\n"
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(str(text), encoding="utf-8")

    # -- the outcome record (attempt-N/exit.json) ---------------------------------------------

    def _exit_file(self, h: KubernetesHandle) -> Path:
        return Path(h.attempt_dir) / "exit.json"

    def _cancel_file(self, h: KubernetesHandle) -> Path:
        return Path(h.attempt_dir) / "cancel.json"

    def _evicted_file(self, h: KubernetesHandle) -> Path:
        return Path(h.attempt_dir) / "evicted.json"

    def _record(self, h: KubernetesHandle, status: AttemptStatus, path: Path | None = None) -> None:
        path = path or self._exit_file(h)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {
            "phase": status.phase.value,
            "exit_code": status.exit_code,
            "reason": status.reason,
            "failed_ranks": list(status.failed_ranks),
            "lost_nodes": list(status.lost_nodes),
            "at": time.time(),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        tmp.replace(path)

    def _recorded(self, h: KubernetesHandle, path: Path | None = None) -> AttemptStatus | None:
        try:
            data = json.loads((path or self._exit_file(h)).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return AttemptStatus(
            AttemptPhase(data["phase"]),
            data.get("exit_code"),
            str(data.get("reason", "")),
            tuple(data.get("failed_ranks", ())),
            lost_nodes=tuple(data.get("lost_nodes", ())),
        )

    # -- stop ---------------------------------------------------------------------------------

    def cancel(self, handle: dict[str, Any], *, grace_s: float) -> None:
        """Delete the pods with `grace_s` (SIGTERM now, SIGKILL by the kubelet after it), then
        the JobSet/Job in the foreground. Idempotent; later polls say CANCELLED once every
        object is gone."""
        h = KubernetesHandle.from_dict(handle)
        if self._exit_file(h).exists():
            return
        marker = self._cancel_file(h)
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            marker.write_text(json.dumps({"grace_s": grace_s, "at": time.time()}) + "\n")
        grace = max(int(grace_s), 0)
        self._delete_pods(h, grace)
        self._delete_owner(h, grace, "Foreground")

    def terminate(self, handle: dict[str, Any]) -> int:
        """Delete every object of the attempt now (found by its key); how many pods ran."""
        h = KubernetesHandle.from_dict(handle)
        pods = [p for p in self._pods(h) if get(p, "status", "phase") in ("Pending", "Running")]
        self._delete_owner(h, 0, "Background")
        self._delete_pods(h, 0)
        k, ns, sel = self.kube, h.namespace, h.selector
        for name in self._names(
            f"list services in namespace {ns}", k.core.list_namespaced_service, ns, sel
        ):
            self._ignore_404(
                f"delete services in namespace {ns}", k.core.delete_namespaced_service, name, ns
            )
        for name in self._names(
            f"list secrets in namespace {ns}", k.core.list_namespaced_secret, ns, sel
        ):
            self._ignore_404(
                f"delete secrets in namespace {ns}", k.core.delete_namespaced_secret, name, ns
            )
        return len(pods)

    def _names(self, what: str, fn: Any, ns: str, selector: str) -> list[str]:
        return [
            o.metadata.name for o in self.kube.call(what, fn, ns, label_selector=selector).items
        ]

    def _delete_pods(self, h: KubernetesHandle, grace: int) -> None:
        self.kube.call(
            f"deletecollection pods in namespace {h.namespace}",
            self.kube.core.delete_collection_namespaced_pod,
            h.namespace,
            label_selector=h.selector,
            grace_period_seconds=grace,
        )

    def _delete_owner(self, h: KubernetesHandle, grace: int, propagation: str) -> None:
        k, ns = self.kube, h.namespace
        body = {"gracePeriodSeconds": grace, "propagationPolicy": propagation}
        if h.kind == "JobSet":
            self._ignore_404(
                f"delete jobsets.jobset.x-k8s.io in namespace {ns}",
                k.custom.delete_namespaced_custom_object,
                *_jobset(ns),
                h.name,
                body=body,
            )
        else:
            self._ignore_404(
                f"delete jobs.batch in namespace {ns}",
                k.batch.delete_namespaced_job,
                h.name,
                ns,
                body=body,
            )

    def _ignore_404(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            self.kube.call(what, fn, *args, **kwargs)
        except KubeApiError as exc:
            if exc.status != 404:
                raise


def _obj(value: Any) -> Obj:
    if not isinstance(value, Mapping):
        raise ExecutorError(f"the API server answered {type(value).__name__}, not an object")
    return value


def _jobset(namespace: str) -> tuple[str, str, str, str]:
    group, version, plural = JOBSET
    return group, version, namespace, plural


def _choose_kind(kube: Kube) -> str:
    """JobSet or Job from the config; "auto" asks the API server whether JobSet is served."""
    if kube.config.workload == "jobset":
        return "JobSet"
    if kube.config.workload == "job":
        return "Job"
    from kubernetes import client

    try:
        kube.call(
            "get the JobSet API group",
            client.CustomObjectsApi(kube.api).get_api_resources,
            JOBSET[0],
            JOBSET[1],
        )
    except KubeApiError as exc:
        if exc.status == 404:
            return "Job"
        raise
    return "JobSet"
