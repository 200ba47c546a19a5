"""Nodes a job's next placement avoids: where two of its attempts failed because of
something on that node, and the placement of a replacement when a node of a running gang is
lost. Pure functions over the store's attempt records and the nodes' capacity."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tensoryard.executors.capacity import NodeCapacity
from tensoryard.spec.job import JobSpec
from tensoryard.store import AttemptRecord

__all__ = [
    "EXCLUDE_AFTER_FAILURES",
    "failed_on",
    "nodes_to_avoid",
    "replacement_placement",
]

EXCLUDE_AFTER_FAILURES = 2  # a node where this many of a job's attempts failed is avoided


def failed_on(attempts: Sequence[AttemptRecord]) -> dict[str, list[int]]:
    """node -> numbers of the job's attempts that failed because of something on that node.

    A failed or lost single-node attempt counts against its node. A multi-node attempt counts
    only against the node of its root cause ("rank 1 exited ... on node n2": the first failed
    rank listed; its peers fail after it) or, without one, the nodes its reason names (a lost
    node): a bug in the job fails every node of the gang alike and is no reason to avoid any.
    Attempts recorded without their nodes count against none."""
    out: dict[str, list[int]] = {}
    for a in attempts:
        if a.state not in ("failed", "lost") or not a.nodes:
            continue
        root = _ROOT_NODE.search(a.reason)  # "rank 1 exited with code 3 on node n2; ..."
        if len(a.nodes) == 1:
            named = list(a.nodes)
        elif root and root.group(1) in a.nodes:
            named = [root.group(1)]  # the root cause's node (the first failed rank listed)
        else:
            named = [n for n in a.nodes if _names(a.reason, n)]
        for node in named:
            out.setdefault(node, []).append(a.number)
    return out


_ROOT_NODE = re.compile(r"\bon node ([\w.-]+?)(?=[;,)]|\s|$)")


def _names(text: str, node: str) -> bool:
    """``text`` names ``node`` as a whole word (node "a" is not in "not ready")."""
    return re.search(rf"(?<![\w.-]){re.escape(node)}(?![\w.-])", text) is not None


def _usable(node: NodeCapacity, spec: JobSpec) -> bool:
    """Ready, not cordoned, of the job's GPU model, with at least the GPUs of one worker."""
    model = spec.scheduling.gpu_model
    return (
        node.state == "ready"
        and not node.cordoned
        and len(node.gpu_indices) >= spec.resources.gpus_per_node
        and (model is None or node.gpu_model == model)
    )


def nodes_to_avoid(
    attempts: Sequence[AttemptRecord], nodes: Sequence[NodeCapacity], spec: JobSpec
) -> tuple[frozenset[str], str]:
    """The nodes a job's next placement avoids, and why (an event's text; "" when none).

    Nothing is avoided when that would leave fewer usable nodes (ready, of the GPU model it
    asks for, with enough GPUs) than the job needs: it would wait forever instead."""
    failed = {
        n: nums for n, nums in failed_on(attempts).items() if len(nums) >= EXCLUDE_AFTER_FAILURES
    }
    if not failed:
        return frozenset(), ""
    res = spec.resources
    left = [n.name for n in nodes if _usable(n, spec) and n.name not in failed]
    where = "; ".join(
        f"{node}: attempts {', '.join(map(str, nums))} failed there"
        for node, nums in sorted(failed.items())
    )
    if len(left) < res.nodes:
        return frozenset(), (
            f"not avoiding {', '.join(sorted(failed))} ({where}): only {len(left)} other usable "
            f"node(s) for {res.nodes} needed"
        )
    return frozenset(failed), f"next placement avoids {', '.join(sorted(failed))} ({where})"


def replacement_placement(
    placement: Mapping[str, Sequence[int]],
    gone: frozenset[str],
    spec: JobSpec,
    nodes: Sequence[NodeCapacity],
    others: Sequence[tuple[Mapping[str, Sequence[int]], JobSpec]],
    avoid: frozenset[str] = frozenset(),
) -> dict[str, list[int]] | None:
    """Partial gang recovery: ``placement`` with its nodes in ``gone`` swapped for spare nodes
    that are free right now, or None when there are not enough spares (then the job is
    requeued whole).

    A spare is ready, not cordoned, of the job's GPU model, outside the placement, ``gone``
    and ``avoid``, with the GPUs, CPU and memory of one worker free after what ``others``
    (every other job holding capacity: their placements and specs) take. Spares under a leaf
    switch the kept nodes use come first, then the fullest (best fit)."""
    res = spec.resources
    keep = {n: list(g) for n, g in placement.items() if n not in gone}
    need = len(placement) - len(keep)
    if need <= 0 or not keep:
        return None
    used_gpus: dict[str, set[int]] = {}
    used_cpu: dict[str, float] = {}
    used_mem: dict[str, int] = {}
    for held, other in others:
        for node, gpus in held.items():
            used_gpus.setdefault(node, set()).update(gpus)
            used_cpu[node] = used_cpu.get(node, 0.0) + other.resources.cpu
            used_mem[node] = used_mem.get(node, 0) + (other.resources.memory or 0)
    by_name = {n.name: n for n in nodes}
    switches = {by_name[n].switch for n in keep if n in by_name and by_name[n].switch}
    candidates: list[tuple[bool, int, str, list[int]]] = []
    for n in nodes:
        if n.name in placement or n.name in gone or n.name in avoid or not _usable(n, spec):
            continue
        taken = used_gpus.get(n.name, set()) | set(n.unavailable_gpus)
        free = [g for g in n.gpu_indices if g not in taken]
        if len(free) < res.gpus_per_node:
            continue
        if n.cpu_slots - used_cpu.get(n.name, 0.0) + 1e-9 < res.cpu:
            continue
        if res.memory and n.memory_bytes - used_mem.get(n.name, 0) < res.memory:
            continue
        candidates.append((n.switch not in switches, len(free), n.name, free))
    if len(candidates) < need:
        return None
    chosen = sorted(candidates)[:need]
    return {**keep, **{name: free[: res.gpus_per_node] for _, _, name, free in chosen}}
