"""Which queue head goes next: priority, reclaiming first, nominal before borrowing, service
level, fair share.

Each queue's own order (priority, service level, submit time) is fixed once in phase 3
(``cycle_state``); this module ranks the queue heads against each other.
"""

from __future__ import annotations

import math

from tensoryard.scheduler.admission import within_nominal_after
from tensoryard.scheduler.cycle_state import CycleState, QueueLine
from tensoryard.scheduler.model import Workload

__all__ = ["HeapKey", "fits_nominal", "heap_key", "share"]

HeapKey = tuple[int, bool, bool, int, float, float, str, str]


def heap_key(st: CycleState, line: QueueLine) -> HeapKey:
    """Rank of a queue's head: smaller goes first."""
    w = line.items[line.cursor]
    level = st.queues.levels.get(w.id, 0) if st.cfg.service_level_across_queues else 0
    borrows = st.cfg.nominal_first and not fits_nominal(st, w)
    return (
        -w.priority,
        not w.reclaiming,  # the room made for it by preemption is its own
        borrows,
        level,
        share(st, line.name),
        w.submit_time,
        w.id,
        line.name,
    )


def fits_nominal(st: CycleState, w: Workload) -> bool:
    """True when `w` fits in its queue's own nominal quota (no borrowing needed)."""
    if w.gpus_per_node == 0:
        return within_nominal_after(st, w, None) or w.queue not in st.quota.tree.cpu_limited
    models = [w.gpu_model] if w.gpu_model else st.cap.gpu_models
    return any(within_nominal_after(st, w, m) for m in models)


def share(st: CycleState, queue: str) -> float:
    """Weighted dominant share: max over resources of effective usage / capacity."""
    usage = st.quota.usage_of(queue)
    past = st.quota.history.get(queue)
    alpha = st.cfg.history_weight if past is not None else 0.0
    half_life = st.cfg.fair_share_half_life_s
    dominant = 0.0
    for resource in set(usage) | (set(past.gpu_seconds) if past else set()):
        cap = st.cap.capacity.get(resource, 0.0)
        if cap <= 0:
            continue
        now_part = usage.get(resource, 0.0)
        hist_part = now_part
        if past is not None and half_life > 0:
            hist_part = past.gpu_seconds.get(resource, 0.0) * math.log(2) / half_life
        dominant = max(dominant, ((1 - alpha) * now_part + alpha * hist_part) / cap)
    return dominant / st.quota.tree.weights.get(queue, 1.0)
