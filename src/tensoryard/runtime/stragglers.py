"""Straggler detection: a rank whose compute time stays above `factor` x the others' median.

Under data parallelism every rank's *step* time is the same (each waits for the slowest in the
gradient all-reduce), so the runtime compares the time each rank spends in its model's
**forward pass**, which contains no collective under DDP: `ForwardTimer` measures it with
module hooks (wall time on the CPU; CUDA events on a GPU). Every few steps the ranks exchange
their mean forward time (`Session.loop` does this at its stop check), and `StragglerDetector`
(pure, no torch) names a rank that stayed above the threshold for `windows` checks in a row,
and again when it recovers. Rank 0 posts those changes as the job's events;
`flagged_ranks` reads them back (the console marks stragglers from them).
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ForwardTimer", "StragglerDetector", "StragglerEvent", "flagged_ranks"]

_MESSAGE = re.compile(r"^straggler( recovered)?: rank (\d+) ")


@dataclass(frozen=True)
class StragglerEvent:
    rank: int
    ratio: float  # its time / the median of the other ranks
    seconds: float
    median_s: float
    started: bool  # True: became a straggler; False: recovered

    @property
    def message(self) -> str:
        if self.started:
            return (
                f"straggler: rank {self.rank} forward time {self.seconds * 1000:.1f}ms is "
                f"{self.ratio:.2f}x the other ranks' median {self.median_s * 1000:.1f}ms"
            )
        return (
            f"straggler recovered: rank {self.rank} forward time {self.seconds * 1000:.1f}ms "
            f"is {self.ratio:.2f}x the other ranks' median"
        )


def flagged_ranks(messages: Iterable[str]) -> dict[int, str]:
    """Rank -> the message that named it, for the ranks still flagged after these event
    messages (oldest first; the ones `StragglerEvent.message` wrote, others are ignored)."""
    flagged: dict[int, str] = {}
    for message in messages:
        found = _MESSAGE.match(message)
        if found is None:
            continue
        rank = int(found.group(2))
        if found.group(1):
            flagged.pop(rank, None)
        else:
            flagged[rank] = message
    return flagged


@dataclass
class StragglerDetector:
    """Feed it every rank's mean compute time per check; it returns the changes to report."""

    factor: float = 1.3
    windows: int = 3  # consecutive checks above the factor before a rank is named
    _above: dict[int, int] = field(default_factory=dict)
    _flagged: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.factor <= 1.0 or self.windows < 1:
            raise ValueError(f"factor={self.factor} must be > 1 and windows={self.windows} >= 1")

    @property
    def stragglers(self) -> frozenset[int]:
        return frozenset(self._flagged)

    def observe(self, per_rank_s: Sequence[float]) -> list[StragglerEvent]:
        events: list[StragglerEvent] = []
        if len(per_rank_s) < 2:
            return events
        for rank, seconds in enumerate(per_rank_s):
            others = [s for r, s in enumerate(per_rank_s) if r != rank]
            median = statistics.median(others)
            ratio = seconds / median if median > 0 else 1.0
            if ratio > self.factor:
                self._above[rank] = self._above.get(rank, 0) + 1
                if self._above[rank] == self.windows and rank not in self._flagged:
                    self._flagged.add(rank)
                    events.append(StragglerEvent(rank, ratio, seconds, median, True))
            else:
                self._above[rank] = 0
                if rank in self._flagged:
                    self._flagged.discard(rank)
                    events.append(StragglerEvent(rank, ratio, seconds, median, False))
        return events


class ForwardTimer:
    """Times the forward passes of a module with hooks; `take()` returns the mean since the
    last call (seconds) and resets. Remove the hooks with `close()`."""

    def __init__(self, module: Any) -> None:
        import torch

        self._torch = torch
        self._cuda = any(p.is_cuda for p in module.parameters())
        self._total = 0.0
        self._count = 0
        self._started: float | None = None
        self._events: list[tuple[Any, Any]] = []
        self._handles = [
            module.register_forward_pre_hook(self._before),
            module.register_forward_hook(self._after),
        ]

    def _before(self, module: Any, args: Any) -> None:
        if self._cuda:
            start = self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            self._events.append((start, None))
        else:
            self._started = time.perf_counter()

    def _after(self, module: Any, args: Any, output: Any) -> None:
        if self._cuda:
            if self._events and self._events[-1][1] is None:
                end = self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end.record()
                self._events[-1] = (self._events[-1][0], end)
        elif self._started is not None:
            self._total += time.perf_counter() - self._started
            self._count += 1
            self._started = None

    def take(self) -> float | None:
        """Mean forward time since the last take (None when no forward ran)."""
        if self._cuda:
            done = [(a, b) for a, b in self._events if b is not None]
            if done:
                done[-1][1].synchronize()
            self._events = []
            self._total += sum(a.elapsed_time(b) for a, b in done) / 1000.0
            self._count += len(done)
        if self._count == 0:
            return None
        mean = self._total / self._count
        self._total, self._count = 0.0, 0
        return mean

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
