"""Mirror tensoryard's cordon state onto the Kubernetes Node objects.

The nodes table is the intent (written first, in one transaction with its history line); this
module makes each Node agree with it, so kube-scheduler places nothing new on a node tensoryard
cordoned or drains, and gives the node back on an explicit uncordon:

    cordoned | draining  ->  spec.unschedulable: true
                             taint  tensoryard.io/unhealthy=<reason slug>:NoSchedule
                             annotation tensoryard.io/cordon-reason: <the full reason>
                             annotation tensoryard.io/unschedulable-set-by: tensoryard | other
    ready                ->  exactly those removed; spec.unschedulable back to false only when
                             tensoryard set it (a Node an admin cordoned by hand stays cordoned)

`node_patch` is pure: a Node (the API's JSON) and the wanted state in, a JSON patch out (None
when the Node already agrees). Every patch starts with a `test` of the Node's resourceVersion,
so a change made meanwhile by someone else is never overwritten: the patch fails and the next
pass computes a new one from the fresh object. `NodeCordoner.sync` runs every pass of the
control loop; with the node watch cache it costs no API call unless a Node must change, so a
patch lost to a crash or an API error is repaired by the next pass.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensoryard.errors import ExecutorError
from tensoryard.executors.kubernetes.client import Kube
from tensoryard.executors.kubernetes.status import Obj, get

__all__ = [
    "ANNOTATION_OWNER",
    "ANNOTATION_REASON",
    "TAINT_KEY",
    "NodeCordoner",
    "NodeIntent",
    "node_patch",
    "taint_value",
]

log = logging.getLogger("tensoryard.executors.kubernetes.nodes")

TAINT_KEY = "tensoryard.io/unhealthy"
ANNOTATION_REASON = "tensoryard.io/cordon-reason"
ANNOTATION_OWNER = "tensoryard.io/unschedulable-set-by"
OWNER_US = "tensoryard"
OWNER_OTHER = "other"  # the Node was already unschedulable: uncordon leaves it so
CLOSED_STATES = ("cordoned", "draining")
_MAX_REASON = 1000
_TAINT_VALUE_LEN = 63  # a taint value follows the label-value rules


@dataclass(frozen=True)
class NodeIntent:
    """What the nodes table says of one node."""

    name: str
    state: str  # ready | cordoned | draining
    reason: str = ""


def taint_value(reason: str) -> str:
    """`reason` as a taint value: letters, digits, `-`, `_`, `.`, at most 63, alphanumeric at
    both ends ("XID 79 on GPU 2" -> "XID-79-on-GPU-2"); "cordoned" when nothing is left."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason)[:_TAINT_VALUE_LEN]
    slug = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", slug)
    return slug or "cordoned"


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def node_patch(node: Obj, intent: NodeIntent) -> list[dict[str, Any]] | None:
    """The JSON patch (RFC 6902) that makes `node` agree with `intent`; None when it does."""
    annotations: dict[str, str] = dict(get(node, "metadata", "annotations") or {})
    taints: list[Obj] = list(get(node, "spec", "taints") or [])
    unschedulable = bool(get(node, "spec", "unschedulable"))
    ours = [t for t in taints if t.get("key") == TAINT_KEY]
    others = [t for t in taints if t.get("key") != TAINT_KEY]
    owner = annotations.get(ANNOTATION_OWNER)

    if intent.state in CLOSED_STATES:
        reason = intent.reason[:_MAX_REASON]
        taint = {"key": TAINT_KEY, "value": taint_value(reason), "effect": "NoSchedule"}
        if owner is None or not unschedulable:
            # First cordon, or someone uncordoned the Node by hand while tensoryard still
            # holds it: from here on tensoryard owns spec.unschedulable.
            owner = OWNER_US if not unschedulable or owner == OWNER_US else OWNER_OTHER
        want_annotations = {**annotations, ANNOTATION_REASON: reason, ANNOTATION_OWNER: owner}
        want_taints = [*others, taint]
        want_unschedulable = True
    else:
        if owner is None and not ours and ANNOTATION_REASON not in annotations:
            return None  # tensoryard never touched it (or already gave it back)
        want_annotations = {
            k: v for k, v in annotations.items() if k not in (ANNOTATION_REASON, ANNOTATION_OWNER)
        }
        want_taints = others
        want_unschedulable = unschedulable and owner != OWNER_US

    ops: list[dict[str, Any]] = []
    if want_taints != taints:
        ops.append({"op": "add", "path": "/spec/taints", "value": want_taints})
    if want_unschedulable != unschedulable:
        ops.append({"op": "add", "path": "/spec/unschedulable", "value": want_unschedulable})
    if want_annotations != annotations:
        if not annotations:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": want_annotations})
        else:
            ops.extend(_annotation_ops(annotations, want_annotations))
    if not ops:
        return None
    version = str(get(node, "metadata", "resourceVersion") or "")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]


def _annotation_ops(old: Mapping[str, str], new: Mapping[str, str]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for key in old:
        if key not in new:
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_pointer(key)}"})
    for key, value in new.items():
        if old.get(key) != value:
            ops.append(
                {"op": "add", "path": f"/metadata/annotations/{_pointer(key)}", "value": value}
            )
    return ops


class NodeCordoner:
    """Makes the Node objects agree with the nodes table (see the module docstring).

    Args:
        kube: a connected client (needs `patch nodes`, cluster-wide).
        list_nodes: the selected Node objects as the API's JSON (the cluster view's watch
            cache when it is healthy, else a LIST).
        cached: whether `list_nodes` is free (a watch cache); without it a full comparison
            runs only when the intent changed or every `resync_s`.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        kube: Kube,
        list_nodes: Callable[[], Sequence[Obj]],
        *,
        cached: Callable[[], bool] = lambda: False,
        resync_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.list_nodes = list_nodes
        self.cached = cached
        self.resync_s = resync_s
        self.clock = clock
        self._last: dict[str, NodeIntent] | None = None  # intent of the last clean pass
        self._at = float("-inf")
        self._patched_from: dict[str, str] = {}  # node -> resourceVersion a patch started from
        self.patched = 0  # Nodes patched (tests and logs)

    def sync(self, intents: Mapping[str, NodeIntent]) -> list[str]:
        """One pass: patch every selected Node that disagrees with `intents` (nodes missing
        from `intents` are left alone). Returns the names patched. An API error is logged and
        the Node retried next pass; it never raises."""
        wanted = dict(intents)
        now = self.clock()
        if wanted == self._last and not self.cached() and now - self._at < self.resync_s:
            return []
        try:
            nodes = self.list_nodes()
        except ExecutorError as exc:
            log.warning("cannot read the Nodes to mirror cordons onto them (retrying): %s", exc)
            self._last = None
            return []
        patched, clean = [], True
        for node in nodes:
            name = str(get(node, "metadata", "name"))
            intent = wanted.get(name)
            if intent is None:
                continue
            version = str(get(node, "metadata", "resourceVersion") or "")
            if self._patched_from.get(name) == version:
                continue  # patched already; the cache has not seen the new version yet
            ops = node_patch(node, intent)
            if ops is None:
                self._patched_from.pop(name, None)
                continue
            try:
                self._patch(name, ops)
            except ExecutorError as exc:
                clean = False
                log.warning(
                    "node %s: cannot mirror %s onto the Node (retrying): %s",
                    name,
                    intent.state,
                    exc,
                )
                continue
            self._patched_from[name] = version
            patched.append(name)
        self.patched += len(patched)
        self._last = wanted if clean else None
        self._at = now
        if patched:
            log.info("Nodes made to agree with the cordon state: %s", ", ".join(patched))
        return patched

    def _patch(self, name: str, ops: list[dict[str, Any]]) -> None:
        self.kube.call(
            f"patch node {name} (cluster-wide)",
            self.kube.core.patch_node,
            name,
            ops,
            _content_type="application/json-patch+json",
        )
