"""Replica autoscaling on what callers feel: queue depth and time to first token.

Never on GPU (or CPU) utilisation: an engine can be 100% busy and answering within its target,
or idle-looking while requests queue on a lock. Pure: the supervisor feeds it the load it sees
(requests waiting for a replica plus requests in flight), the TTFTs the gateway measured, and the
clock; it answers how many replicas the deployment should have.

- Up, at once: enough replicas that each has at most ``target_queue`` requests waiting or
  running; and one more than now when the p90 TTFT of the last ``window_s`` is above
  ``target_ttft_s`` (when set), requests are still arriving and no replica is starting. Each
  scale-up forgets the TTFTs seen before it: the next step up needs slow answers from the
  bigger deployment.
- Down, slowly: to the largest count wanted at any time in the last ``scale_down_after_s``
  (the stabilisation window of Kubernetes' HPA), never below ``min_replicas`` nor above
  ``max_replicas``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["AutoscalePolicy", "Autoscaler"]


@dataclass(frozen=True)
class AutoscalePolicy:
    """A deployment's autoscaling settings (``replicas`` is the minimum)."""

    min_replicas: int
    max_replicas: int
    target_queue: float = 2.0
    target_ttft_s: float | None = None
    scale_down_after_s: float = 60.0
    window_s: float = 30.0


@dataclass
class Autoscaler:
    """The desired replica count of one deployment over time."""

    policy: AutoscalePolicy
    _ttfts: deque[tuple[float, float]] = field(default_factory=deque)  # (at, seconds)
    _wanted: deque[tuple[float, int]] = field(default_factory=deque)  # (at, count)
    desired: int = 0
    reason: str = ""

    def __post_init__(self) -> None:
        self.desired = self.policy.min_replicas

    def observe_ttft(self, now: float, seconds: float) -> None:
        self._ttfts.append((now, seconds))

    def ttft_p90(self, now: float) -> float | None:
        """The p90 TTFT of the window, or None without samples."""
        while self._ttfts and self._ttfts[0][0] < now - self.policy.window_s:
            self._ttfts.popleft()
        if not self._ttfts:
            return None
        values = sorted(s for _, s in self._ttfts)
        return values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)]

    def decide(self, now: float, load: int, current: int, starting: int = 0) -> int:
        """The replica count wanted now, given ``load`` (waiting + in flight), the ``current``
        count of replicas (ready or starting) and how many of them are ``starting``."""
        p = self.policy
        by_queue = math.ceil(load / p.target_queue) if load > 0 else 0
        wanted, why = by_queue, f"{load} requests queued or running, target {p.target_queue:g}"
        p90 = self.ttft_p90(now)
        slow = p.target_ttft_s is not None and p90 is not None and p90 > p.target_ttft_s
        if slow and load and not starting and current + 1 > wanted:
            wanted = current + 1
            why = f"p90 TTFT {p90:.2f} s above the target {p.target_ttft_s:g} s"
        wanted = max(p.min_replicas, min(p.max_replicas, wanted))
        self._wanted.append((now, wanted))
        while self._wanted and self._wanted[0][0] < now - p.scale_down_after_s:
            self._wanted.popleft()
        held = max(n for _, n in self._wanted)  # the largest count wanted in the window
        if wanted > self.desired:
            self.desired, self.reason = wanted, f"up: {why}"
            self._ttfts.clear()
        elif held < self.desired:
            self.desired = held
            self.reason = f"down: at most {held} wanted for {p.scale_down_after_s:g} s"
        return self.desired
