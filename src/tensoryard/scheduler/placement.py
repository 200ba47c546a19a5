"""Placement: which models and nodes a workload can use; topology-aware gangs, best fit.

Single-node workloads go best-fit (the fullest node that still fits, so whole nodes stay free
for gangs); multi-node gangs go on the fewest leaf switches (``required`` or ``preferred``).
A failure cache per capacity index answers at once for requests at least as large as one
that already found no room this cycle (an index only loses capacity within a cycle).
"""

from __future__ import annotations

from tensoryard.scheduler.accounting import charge_of, resource_of
from tensoryard.scheduler.capacity import CapacityIndex, NodeState
from tensoryard.scheduler.cycle_state import CycleState
from tensoryard.scheduler.model import Workload
from tensoryard.scheduler.state import CPU_MODEL
from tensoryard.spec.queue import CPU_RESOURCE

__all__ = ["capacity_details", "claim_gpus", "fits", "models_for", "place", "unfit_details"]


def models_for(st: CycleState, w: Workload) -> tuple[str, ...]:
    """Index keys (GPU models, or CPU_MODEL) the workload could ever be placed on.

    The answer depends only on the workload's queue and shape and on what stays fixed for
    the cycle (inventory, quota limits), so it is computed once per queue and shape."""
    key = (w.queue, w.gpu_model, w.gpus_per_node, w.cpu_per_node, w.mem_per_node, w.nodes)
    found = st.cap.known_models(key)
    if found is None:
        found = tuple(_models_for(st, w))
        st.cap.remember_models(key, found)
    return found


def _models_for(st: CycleState, w: Workload) -> list[str]:
    state = st.cap.state
    if w.gpus_per_node == 0:
        keys = [CPU_MODEL] if CPU_MODEL in state.open else []
        if st.cfg.cpu_on_gpu_nodes:
            keys += st.cap.gpu_models
        return [
            k for k in keys if state.schedulable_nodes.get(k, 0) >= w.nodes and _node_fits(st, w, k)
        ]
    candidates = [w.gpu_model] if w.gpu_model else st.cap.gpu_models
    return [
        m
        for m in candidates
        if m in state.open
        and _node_fits(st, w, m)
        and st.cap.max_gpus_per_node[m] >= w.gpus_per_node
        and state.schedulable_nodes.get(m, 0) >= w.nodes
        and st.quota.tree.max_ever(w.queue, m) >= w.total_gpus
        and (w.nodes == 1 or _schedulable_with(st, m, w.gpus_per_node) >= w.nodes)
    ]


def _schedulable_with(st: CycleState, model: str, gpus: int) -> int:
    """Schedulable nodes of `model` with at least `gpus` GPUs: a gang needs that many, or it
    would hold nodes for a placement that can never exist (memoized for the cycle)."""
    return st.cap.schedulable_with(model, gpus)


def _node_fits(st: CycleState, w: Workload, key: str) -> bool:
    """The largest node under `key` has the CPU and memory one worker of `w` needs."""
    mem = st.cap.max_mem_per_node.get(key, 0)
    return st.cap.max_cpu_per_node.get(key, 0.0) >= w.cpu_per_node - 1e-9 and (
        w.mem_per_node <= 0 or mem <= 0 or mem >= w.mem_per_node
    )


def unfit_details(st: CycleState, w: Workload) -> dict[str, object]:
    """Facts behind an "unschedulable" reason: what the largest node and the quota allow."""
    largest = max((v for k, v in st.cap.max_gpus_per_node.items() if k), default=0)
    model_known = w.gpu_model is None or w.gpu_model in st.cap.state.open
    models = [w.gpu_model] if w.gpu_model else st.cap.gpu_models
    quota_max = (
        max((st.quota.tree.max_ever(w.queue, m) for m in models), default=0.0)
        if w.gpus_per_node > 0 and st.quota.tree.has_queue(w.queue)
        else None
    )
    fitting, fitting_model = _nodes_big_enough(st, w, models)
    return {
        "nodes": w.nodes,
        "gpus_per_node": w.gpus_per_node,
        "gpu_model": w.gpu_model,
        "model_known": model_known,
        "fitting_nodes": fitting,
        "fitting_model": fitting_model,
        "largest_node_gpus": largest,
        "largest_node_cpu": max(st.cap.max_cpu_per_node.values(), default=0.0),
        "largest_node_mem": max(st.cap.max_mem_per_node.values(), default=0),
        "schedulable_nodes": sum(st.cap.state.schedulable_nodes.values()),
        "total_nodes": len(st.cap.state.states),
        "queue": w.queue,
        "quota_max": quota_max,
    }


def _nodes_big_enough(st: CycleState, w: Workload, models: list[str]) -> tuple[int, str | None]:
    """How many nodes, in any state (busy, cordoned, NotReady), have the GPUs one worker of
    `w` needs, on the model with the most such nodes: fewer than `w.nodes` means the cluster
    as it is can never hold `w`, only a cluster with more nodes can."""
    if w.gpus_per_node == 0:
        return len(st.cap.state.states), None
    counts = dict.fromkeys(models, 0)
    for node in st.cap.state.states:
        if node.gpu_model in counts and node.gpus_total >= w.gpus_per_node:
            counts[node.gpu_model] += 1
    best = max(counts, key=lambda m: counts[m], default=None)
    return (counts[best], best) if best is not None else (0, None)


def capacity_details(st: CycleState, w: Workload, model: str) -> dict[str, object]:
    """Facts behind a "capacity" reason: what `w` asks and what is free or held."""
    return {
        "nodes": w.nodes,
        "gpus_per_node": w.gpus_per_node,
        "cpu_per_node": w.cpu_per_node,
        "model": model or None,
        "free_gpus": st.cap.state.open[model].total_free,
        "held_gpus": st.cap.state.held[model].total_free,
        "topology": w.topology,
    }


def _max_switches(st: CycleState, w: Workload, model: str) -> int | None:
    if w.topology != "required" or w.nodes <= 1:
        return None
    per_switch = max(1, st.cap.state.max_nodes_per_switch.get(model, 1))
    return -(-w.nodes // per_switch)


def place(
    st: CycleState, index: CapacityIndex, w: Workload, model: str, *, cache: str | None
) -> list[NodeState] | None:
    """Nodes for `w` in `index`, or None. `cache` names a shape-failure cache that stays
    valid while that index only loses capacity (None: what-if checks, no caching)."""
    strict = w.topology == "required" and w.nodes > 1
    shape = (w.nodes, w.gpus_per_node, w.cpu_per_node, w.mem_per_node, strict)
    if w.avoid_nodes:
        cache = None  # a failure without some nodes says nothing about the same shape with them
    if cache is not None and st.cap.known_to_fail(cache, shape):
        return None
    if w.nodes == 1:
        node = index.best_node(w.gpus_per_node, w.cpu_per_node, w.mem_per_node, w.avoid_nodes)
        nodes = [node] if node is not None else None
    else:
        nodes = index.gang(
            w.nodes,
            w.gpus_per_node,
            w.cpu_per_node,
            w.mem_per_node,
            _max_switches(st, w, model),
            w.avoid_nodes,
        )
    if nodes is None and cache is not None:
        st.cap.note_failure(cache, shape, st.cfg.placement_failure_cache)
    return nodes


def fits(st: CycleState, w: Workload, model: str) -> bool:
    """What-if: `w` would be admitted on `model` now (quota and placement, nothing taken)."""
    resource = resource_of(w, model or None)
    if charge_of(w) > st.quota.tree.available(w.queue, resource) + 1e-9:
        return False
    if resource != CPU_RESOURCE and w.total_cpu > st.quota.tree.available(w.queue, CPU_RESOURCE):
        return False
    return place(st, st.cap.state.open[model], w, model, cache=None) is not None


def claim_gpus(st: CycleState, w: Workload, model: str) -> dict[str, tuple[int, ...]]:
    """The GPUs `w` would take on `model` in the world as it is now (take() picks the
    lowest free indices); {} when it does not fit."""
    nodes = place(st, st.cap.state.open[model], w, model, cache=None) or []
    return {n.name: tuple(n.free[: w.gpus_per_node]) for n in nodes}
