"""Pure translations of Kubernetes objects (as the API's JSON dicts) into tensoryard's terms.

- `attempt_status`: the JobSet (or Job) and pods of one attempt -> an AttemptStatus whose
  reason a user can act on (an image that cannot be pulled, OOMKilled with the memory limit,
  the scheduler's FailedScheduling message, an eviction, a node that went NotReady).

The cluster view (Node objects -> the scheduler's nodes) is in `cluster`. No client, no
clock, no I/O: the executor calls these with what it listed, and the unit tests call them with
objects shaped like the API server's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from tensoryard.executors.base import AttemptPhase, AttemptStatus
from tensoryard.executors.kubernetes.manifests import COMPLETION_INDEX_ANNOTATION

__all__ = ["alive", "attempt_status", "get", "node_ready", "parse_quantity", "pod_rank"]

Obj = Mapping[str, Any]
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
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
        if code not in (None, 0):
            why = f" ({term['reason']})" if term.get("reason") else ""
            return f"{where} exited with code {code}{why}", code
    message = get(pod, "status", "message") or get(pod, "status", "reason") or "no reason given"
    return f"{where} failed: {message}", None


def _pending_reason(pod: Obj) -> str:
    """Why a pod is not running yet ("" when nothing stands in its way)."""
    for status in get(pod, "status", "containerStatuses") or []:
        waiting = get(status, "state", "waiting") or {}
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
    not_ready_nodes: Iterable[str] = (),
) -> AttemptStatus:
    """The phase of an attempt from its `owner` (JobSet or Job; None when it is gone) and pods.

    A pod that failed fails the attempt at once (restarts are the platform's, never the
    JobSet's); a pod on a node that went NotReady does too. Otherwise the owner's conditions
    decide, and while none is final the attempt is RUNNING once all `nodes` pods run."""
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
    down = set(not_ready_nodes)
    lost = [p for p in ordered if get(p, "spec", "nodeName") in down and alive(p)]
    if lost and not cancelled:
        node = get(lost[0], "spec", "nodeName")
        ranks = tuple(pod_rank(p) for p in lost)
        return AttemptStatus(
            AttemptPhase.FAILED, None, f"node {node} went NotReady under {_where(lost[0])}", ranks
        )
    outcome = _owner_outcome(kind, owner) if owner is not None else None
    if outcome is not None and not cancelled:
        phase, reason = outcome
        return AttemptStatus(phase, 0 if phase is AttemptPhase.SUCCEEDED else None, reason)
    running = [p for p in ordered if get(p, "status", "phase") == "Running"]
    if len(running) >= nodes and not cancelled:
        return AttemptStatus(AttemptPhase.RUNNING)
    reasons = [r for r in (_pending_reason(p) for p in ordered) if r]
    if reasons:
        return AttemptStatus(AttemptPhase.STARTING, None, reasons[0])
    return AttemptStatus(AttemptPhase.STARTING)


def alive(pod: Obj) -> bool:
    return get(pod, "status", "phase") in ("Pending", "Running")
