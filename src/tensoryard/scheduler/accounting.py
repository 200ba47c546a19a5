"""What a workload is charged, and the decayed usage history (one definition each).

Every module of the cycle charges quota through :func:`resource_of` and :func:`charge_of`;
the usage history is decayed by :func:`decay_usage` only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from tensoryard.scheduler.model import DecayedUsage, Workload
from tensoryard.spec.queue import CPU_RESOURCE

__all__ = ["charge_of", "decay_usage", "resource_of"]


def resource_of(w: Workload, model: str | None) -> str:
    """The quota resource a workload is charged in: its GPU model, or "cpu"."""
    return model if (w.gpus_per_node > 0 and model) else CPU_RESOURCE


def charge_of(w: Workload) -> float:
    """How much of that resource it is charged: its GPUs, or its CPU cores when CPU-only."""
    return float(w.total_gpus) if w.gpus_per_node > 0 else w.total_cpu


def decay_usage(
    history: Mapping[str, DecayedUsage],
    running: Iterable[Workload],
    now: float,
    half_life_s: float,
) -> dict[str, DecayedUsage]:
    """Decay every queue's GPU-seconds to `now` and add what running workloads used since.

    A workload that ran at rate u since t0 adds ``u * h/ln2 * (1 - 2**(-(now - t0)/h))``,
    the exact integral of its exponentially decayed usage.
    """
    if half_life_s <= 0:
        return {}
    out: dict[str, dict[str, float]] = {}
    for queue, record in history.items():
        factor = 0.5 ** (max(0.0, now - record.as_of) / half_life_s)
        out[queue] = {r: v * factor for r, v in record.gpu_seconds.items()}
    # Sum rates per (queue, resource, since) first: most running work shares one `since`
    # (the previous cycle), so the exponential is computed once per queue, not per workload.
    rates: dict[tuple[str, str, float], float] = {}
    for w in running:
        placement = w.placement
        if placement is None or w.start_time is None:
            continue
        since = w.start_time
        prev = history.get(w.queue)
        if prev is not None and prev.as_of > since:
            since = prev.as_of
        if since >= now:
            continue
        key = (w.queue, resource_of(w, placement.gpu_model), since)
        rates[key] = rates.get(key, 0.0) + charge_of(w)
    scale = half_life_s / math.log(2)
    for (queue, resource, since), rate in rates.items():
        amount = rate * scale * (1.0 - 0.5 ** ((now - since) / half_life_s))
        bucket = out.setdefault(queue, {})
        bucket[resource] = bucket.get(resource, 0.0) + amount
    return {q: DecayedUsage(gpu_seconds=v, as_of=now) for q, v in out.items()}
