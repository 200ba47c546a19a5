"""Admission against quota: nominal quota, borrowing within the cohort tree, committing.

A workload is admitted when its queue has the quota (its own nominal quota, or what its
cohort tree may lend within borrowing and lending limits) and a placement was found
(``placement``); :func:`commit` then takes the GPUs and charges the queue.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensoryard.scheduler.accounting import charge_of, resource_of
from tensoryard.scheduler.capacity import NodeState
from tensoryard.scheduler.cycle_state import CycleState
from tensoryard.scheduler.entry import Fail
from tensoryard.scheduler.model import Admission, Placement, Workload
from tensoryard.spec.queue import CPU_RESOURCE

__all__ = [
    "borrows_running",
    "check_quota",
    "commit",
    "most_telling",
    "quota_fail",
    "within_nominal_after",
]


def check_quota(st: CycleState, w: Workload, resource: str) -> Fail | None:
    """None when the queue of `w` may be charged for it (GPUs, and CPU cores); else why not."""
    need = charge_of(w)
    checks = [(resource, need)]
    if resource != CPU_RESOURCE and w.total_cpu > 0:
        checks.append((CPU_RESOURCE, w.total_cpu))
    for res, amount in checks:
        key = (w.queue, res)
        if amount >= st.quota.failed_need(key):
            return quota_fail(st, w, res, amount)
        if amount > st.quota.tree.available(w.queue, res) + 1e-9:
            st.quota.note_failed(key, amount)
            return quota_fail(st, w, res, amount)
    return None


def quota_fail(st: CycleState, w: Workload, resource: str, need: float) -> Fail:
    """The quota facts behind a "quota" pending reason."""
    tree = st.quota.tree
    used = tree.usage(w.queue, resource)
    nominal = tree.nominal(w.queue, resource)
    available = max(0.0, tree.available(w.queue, resource))
    details: dict[str, object] = {
        "queue": w.queue,
        "resource": resource,
        "need": need,
        "used": used,
        "nominal": nominal,
        "cohort": tree.cohort_of(w.queue),
        "cohort_lends": max(0.0, available - max(0.0, nominal - used)),
        "borrowing_limit": tree.borrowing_limit(w.queue, resource),
    }
    return Fail("quota", details, None if resource == CPU_RESOURCE else resource)


def within_nominal_after(st: CycleState, w: Workload, model: str | None) -> bool:
    """True when the queue of `w` stays within its nominal quota with `w` admitted."""
    resource = resource_of(w, model)
    nominal = st.quota.tree.nominal(w.queue, resource)
    return nominal > 0 and st.quota.tree.usage(w.queue, resource) + charge_of(w) <= nominal + 1e-9


def borrows_running(st: CycleState, queue: str, resource: str, keep: float = 0.0) -> bool:
    """True when the queue's running work that stays (not this cycle's admissions, not
    victims chosen this cycle, not terminating work) exceeds its nominal quota: only then may
    reclaim take that work back. With `keep` > 0: True when it still uses at least its
    nominal quota after giving `keep` back."""
    used = st.quota.staying_usage(queue, resource)
    nominal = st.quota.tree.nominal(queue, resource)
    if keep > 0:
        return used - keep >= nominal - 1e-9
    return used > nominal + 1e-9


def commit(
    st: CycleState, w: Workload, model: str, nodes: list[NodeState], *, late: bool = False
) -> None:
    """Admit `w` on `nodes`: take the GPUs, charge its queue, record the admission
    (`late`: by the backfill pass, after the cycle stopped visiting its queue)."""
    gpus: dict[str, tuple[int, ...]] = {}
    end = None if w.runtime_estimate_s is None else st.now + w.runtime_estimate_s
    for node in nodes:
        gpus[node.name] = st.cap.state.take(node, w.gpus_per_node, w.cpu_per_node, w.mem_per_node)
        st.cap.state.record_start(node, end, w.gpus_per_node, w.cpu_per_node)
    gpu_model = model if (model and w.gpus_per_node > 0) else None
    placement = Placement(gpu_model, gpus, w.cpu_per_node, w.mem_per_node)
    resource = resource_of(w, gpu_model)
    st.quota.admit(w, resource)
    borrowing = st.quota.tree.borrowing(w.queue, resource)
    st.decided.admit(Admission(w.id, placement, borrowing), late=late)


def most_telling(fails: Sequence[Fail]) -> Fail:
    """Capacity (quota was fine) says more than quota; the first model breaks ties."""
    for fail in fails:
        if fail.code == "capacity":
            return fail
    return fails[0]
