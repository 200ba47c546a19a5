"""Pure translations of Kubernetes objects (as the API's JSON dicts) into tensoryard's terms.

- `attempt_status`: the JobSet (or Job) and pods of one attempt -> an AttemptStatus whose
  reason a user can act on (an image that cannot be pulled, OOMKilled with the memory limit,
  the scheduler's FailedScheduling message, an eviction, a node that went NotReady).

The cluster view (Node objects -> the scheduler's nodes) is in `cluster`. No client, no
clock, no I/O: the executor calls these with what it listed, and the unit tests call them with
objects shaped like the API server's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from tensoryard.executors.base import CONFIG_EXIT_CODE, AttemptPhase, AttemptStatus
from tensoryard.executors.kubernetes.manifests import COMPLETION_INDEX_ANNOTATION

__all__ = [
    "alive",
    "attempt_status",
    "get",
    "node_loss",
    "node_ready",
    "parse_quantity",
    "placement_nodes",
    "pod_rank",
]

Obj = Mapping[str, Any]
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
# Waiting reasons that never clear up by themselves: the attempt fails at once with them (a
# missing Secret or ConfigMap may still appear: CreateContainerConfigError only says why).
FATAL_WAITING = frozenset({"InvalidImageName"})
LOST_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})
_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes resource quantity ("8", "500m", "2000Gi") as a number; 0 when malformed."""
    text = str(value or "0").strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            number, factor = text[: -len(suffix)], Decimal(str(_SUFFIX[suffix]))
            break
    else:
        number, factor = text, Decimal(1)
    try:
        return Decimal(number) * factor
    except InvalidOperation:
        return Decimal(0)


def get(obj: Obj | None, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _condition(obj: Obj | None, kind: str) -> Obj | None:
    for cond in get(obj, "status", "conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def pod_rank(pod: Obj) -> int:
    """The pod's node rank: its completion index (-1 when not yet known)."""
    annotations = get(pod, "metadata", "annotations") or {}
    try:
        return int(annotations.get(COMPLETION_INDEX_ANNOTATION, -1))
    except (TypeError, ValueError):
        return -1


def node_ready(node: Obj) -> bool:
    ready = [c for c in get(node, "status", "conditions") or [] if c.get("type") == "Ready"]
    return bool(ready) and ready[0].get("status") == "True"


def node_loss(name: str, node: Obj | None) -> str | None:
    """What happened to a node that an attempt's pods are on or pinned to, in words ("node n2
    deleted", "node n2 NotReady since 12:01:03Z (NodeStatusUnknown: Kubelet stopped posting
    node status.)"); None while it is fine. A cordon is no loss: running pods stay (drains are
    the control plane's)."""
    if node is None:
        return f"node {name} deleted"
    for cond in get(node, "status", "conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            since = cond.get("lastTransitionTime") or "?"
            why = ": ".join(str(x) for x in (cond.get("reason"), cond.get("message")) if x)
            state = "NotReady" if cond.get("status") == "False" else "Unknown"
            return f"node {name} {state} since {since}" + (f" ({why})" if why else "")
    for taint in get(node, "spec", "taints") or []:
        if taint.get("effect") == "NoExecute" and taint.get("key") in LOST_TAINTS:
            since = taint.get("timeAdded") or "?"
            return f"node {name} tainted {taint['key']}:NoExecute since {since}"
    return None


def placement_nodes(pods: Sequence[Obj]) -> set[str]:
    """The nodes the attempt's pods run on or are pinned to (tensoryard's nodeAffinity on
    kubernetes.io/hostname), pending pods included."""
    out: set[str] = set()
    for pod in pods:
        if get(pod, "spec", "nodeName"):
            out.add(str(get(pod, "spec", "nodeName")))
        required = get(pod, "spec", "affinity", "nodeAffinity") or {}
        terms = get(required, "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
        for term in terms or []:
            for expr in term.get("matchExpressions") or []:
                if expr.get("key") == "kubernetes.io/hostname" and expr.get("operator") == "In":
                    out.update(str(v) for v in expr.get("values") or [])
    return out


def _disruption(pod: Obj) -> str | None:
    """The pod's DisruptionTarget condition (taint manager, preemption, eviction), in words."""
    for cond in get(pod, "status", "conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            why = ": ".join(str(x) for x in (cond.get("reason"), cond.get("message")) if x)
            return f"{_where(pod)} is being disrupted ({why or 'no reason given'})"
    return None


def _where(pod: Obj) -> str:
    name = get(pod, "metadata", "name")
    node = get(pod, "spec", "nodeName")
    return f"rank {pod_rank(pod)} (pod {name}" + (f" on node {node})" if node else ")")


def _memory_limit(pod: Obj, container: str) -> str:
    for c in get(pod, "spec", "containers") or []:
        if c.get("name") == container:
            limit = get(c, "resources", "limits", "memory")
            return f"memory limit {limit}" if limit else "no memory limit set: the node ran out"
    return "memory limit unknown"


def _pod_failure(pod: Obj) -> tuple[str, int | None] | None:
    """Why a failed pod failed, and its exit code; None when it did not fail."""
    if get(pod, "status", "phase") != "Failed":
        return None
    where = _where(pod)
    if get(pod, "status", "reason") == "Evicted":
        return f"{where} was evicted: {get(pod, 'status', 'message') or 'no message'}", None
    for status in get(pod, "status", "containerStatuses") or []:
        term = get(status, "state", "terminated")
        if not term:
            continue
        code = term.get("exitCode")
        if term.get("reason") == "OOMKilled":
            limit = _memory_limit(pod, str(status.get("name")))
            return f"{where} was OOMKilled ({limit}; exit code {code})", code
        if code == CONFIG_EXIT_CODE and term.get("message"):
            # the image preflight's verdict (tensoryard.images.preflight), or the log's end
            said = " ".join(str(term["message"]).split())[-1000:]
            return f"{where} exited with code {code} (configuration error): {said}", code
        if code not in (None, 0):
            why = f" ({term['reason']})" if term.get("reason") else ""
            return f"{where} exited with code {code}{why}", code
    disrupted = _disruption(pod)
    if disrupted is not None:
        return disrupted, None
    message = get(pod, "status", "message") or get(pod, "status", "reason") or "no reason given"
    return f"{where} failed: {message}", None


def _fatal_waiting(pod: Obj) -> str | None:
    """A container waiting for something that never comes by itself (a malformed image name, a
    container config the kubelet cannot build), in words; None otherwise."""
    for status in get(pod, "status", "containerStatuses") or []:
        waiting = get(status, "state", "waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            message = waiting.get("message") or "no message"
            return f"{_where(pod)} cannot start ({waiting['reason']}: {message})"
    return None


def _pending_reason(pod: Obj) -> str:
    """Why a pod is not running yet ("" when nothing stands in its way)."""
    for status in get(pod, "status", "containerStatuses") or []:
        waiting = get(status, "state", "waiting") or {}
        if waiting.get("reason") == "CreateContainerConfigError":
            return f"CreateContainerConfigError: {waiting.get('message') or 'no message'}"
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            image = status.get("image") or "?"
            message = waiting.get("message") or "no message"
            return f"image {image} cannot be pulled ({waiting['reason']}: {message})"
    for cond in get(pod, "status", "conditions") or []:
        scheduled = cond.get("type") == "PodScheduled" and cond.get("status") == "False"
        if scheduled and cond.get("reason") == "Unschedulable":
            return f"FailedScheduling: {cond.get('message') or 'no message'}"
    return ""


def _owner_outcome(kind: str, owner: Obj) -> tuple[AttemptPhase, str] | None:
    if kind == "JobSet":
        done, failed = _condition(owner, "Completed"), _condition(owner, "Failed")
    else:
        done = _condition(owner, "Complete") or _condition(owner, "SuccessCriteriaMet")
        failed = _condition(owner, "Failed") or _condition(owner, "FailureTarget")
    if done is not None:
        return (
            AttemptPhase.SUCCEEDED,
            f"every pod of {kind} {get(owner, 'metadata', 'name')} succeeded",
        )
    if failed is not None:
        return AttemptPhase.FAILED, str(failed.get("message") or failed.get("reason") or "failed")
    return None


def attempt_status(
    kind: str,
    owner: Obj | None,
    pods: Sequence[Obj],
    *,
    nodes: int,
    cancelled: bool = False,
    lost_nodes: Mapping[str, str] | None = None,
) -> AttemptStatus:
    """The phase of an attempt from its `owner` (JobSet or Job; None when it is gone) and pods.

    A pod that failed fails the attempt at once (restarts are the platform's, never the
    JobSet's); so does a node of the attempt that is lost (`lost_nodes`: node -> what
    happened, from `node_loss`; the pods on it or pinned to it can never run again) and a
    container that can never start (FATAL_WAITING). Otherwise the owner's conditions decide,
    and while none is final the attempt is RUNNING once all `nodes` pods run."""
    ordered = sorted(pods, key=pod_rank)
    if owner is None or get(owner, "metadata", "deletionTimestamp"):
        if cancelled:
            if owner is None:
                return AttemptStatus(
                    AttemptPhase.CANCELLED, None, "cancelled: every object deleted"
                )
            return AttemptStatus(AttemptPhase.STARTING)  # its pods are still stopping
        if owner is None:
            return AttemptStatus(
                AttemptPhase.LOST,
                None,
                f"the {kind} of this attempt was deleted outside tensoryard (or it ended and "
                "its ttlSecondsAfterFinished ran out while the control plane was down: "
                "raise `tyard server --keep-finished`)",
            )
    failures = [f for f in (_pod_failure(p) for p in ordered) if f is not None]
    if failures and not cancelled:
        reason, code = failures[0]
        ranks = tuple(pod_rank(p) for p in ordered if _pod_failure(p) is not None)
        return AttemptStatus(AttemptPhase.FAILED, code, reason, ranks)
    down = dict(lost_nodes or {})
    if down and not cancelled:
        mine = sorted(set(down) & placement_nodes(ordered))
        if mine:
            on_lost = [p for p in ordered if get(p, "spec", "nodeName") in mine and alive(p)]
            on_lost = on_lost or [p for p in ordered if not get(p, "spec", "nodeName")]
            ranks = tuple(pod_rank(p) for p in on_lost)
            where = f" under {_where(on_lost[0])}" if on_lost else ""
            return AttemptStatus(
                AttemptPhase.FAILED,
                None,
                "; ".join(down[n] for n in mine) + where,
                ranks,
                lost_nodes=tuple(mine),
            )
    fatal = [r for r in (_fatal_waiting(p) for p in ordered) if r]
    if fatal and not cancelled:
        return AttemptStatus(AttemptPhase.FAILED, None, fatal[0])
    outcome = _owner_outcome(kind, owner) if owner is not None else None
    if outcome is not None and not cancelled:
        phase, reason = outcome
        return AttemptStatus(phase, 0 if phase is AttemptPhase.SUCCEEDED else None, reason)
    if not cancelled and owner is not None and _every_rank_succeeded(ordered, nodes):
        # The Job and JobSet controllers say so too, later: the Job controller batches pod
        # updates (up to a second), then the JobSet controller follows the Jobs. Waiting for
        # them held the attempt's GPUs idle that long after its last pod ended.
        name = get(owner, "metadata", "name")
        return AttemptStatus(AttemptPhase.SUCCEEDED, 0, f"every pod of {kind} {name} succeeded")
    running = [p for p in ordered if get(p, "status", "phase") == "Running"]
    if len(running) >= nodes and not cancelled:
        return AttemptStatus(AttemptPhase.RUNNING)
    reasons = [r for r in (_pending_reason(p) for p in ordered) if r]
    if reasons:
        return AttemptStatus(AttemptPhase.STARTING, None, reasons[0])
    return AttemptStatus(AttemptPhase.STARTING)


def _every_rank_succeeded(pods: Sequence[Obj], nodes: int) -> bool:
    """Each of ranks 0..nodes-1 has a pod that succeeded and no pod of the attempt still
    runs or waits (a pod recreated for a rank would)."""
    if nodes <= 0 or any(alive(p) for p in pods):
        return False
    done = {pod_rank(p) for p in pods if get(p, "status", "phase") == "Succeeded"}
    return done >= set(range(nodes))


def alive(pod: Obj) -> bool:
    return get(pod, "status", "phase") in ("Pending", "Running")
