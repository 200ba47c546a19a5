"""Pick a replica for a request: prefix-cache-aware, or round-robin. Pure: no I/O, no clock.

The prefix-aware key is the *whole* prompt, cut into fixed-size character blocks whose hashes
are chained (block i's hash covers blocks 0..i), so two prompts share a key prefix exactly as
far as their texts agree, system prompt, few-shot examples and conversation history alike. Each
replica remembers the chains it was sent (bounded, least recently used out first).

A request goes to the replica holding the longest cached prefix; among equal matches (none
at all included), to the one with the least queued work: the uncached prompt characters of the
requests in flight there (prefill ahead of it) plus ``request_cost_chars`` per request in
flight (their decoding), ties in turn. Replicas more than ``max_imbalance`` requests above the
least loaded one are not considered at all (the guard against piling a burst of one prefix onto
one replica). A cost model that also sent a request away from its cached prefix to an idle
replica (served soonest, but prefilled again) was tried: its hit ratio fell from 0.65 to 0.42
and the shared-prefix TTFT did not improve (benchmarks/serving.py, 2026-12-03).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "ROUTERS",
    "PrefixAwareRouter",
    "ReplicaLoad",
    "RoundRobinRouter",
    "Route",
    "Router",
    "prefix_blocks",
]


@dataclass(frozen=True)
class ReplicaLoad:
    """A ready replica as the router sees it: its id, requests in flight, and the uncached
    prompt characters of those requests (prefill work queued on it)."""

    replica: str
    in_flight: int
    pending_chars: int = 0


@dataclass(frozen=True)
class Route:
    """The router's decision: the replica, and how many prompt characters it likely caches."""

    replica: str
    matched_chars: int
    prompt_chars: int
    queued_s: float = 0.0  # waited for a ready replica before this (0: one was ready at once)

    @property
    def uncached_chars(self) -> int:
        """Prompt characters the replica has to prefill (past its cached prefix)."""
        return max(0, self.prompt_chars - self.matched_chars)


class Router(Protocol):
    def pick(self, prompt: str, replicas: Sequence[ReplicaLoad]) -> Route: ...

    def forget(self, replica: str) -> None: ...


def prefix_blocks(prompt: str, block_chars: int) -> list[bytes]:
    """Chained hashes of the prompt's complete blocks (a partial last block is not cached
    reliably by engines, so it is not part of the key)."""
    out: list[bytes] = []
    prev = b""
    data = prompt.encode("utf-8", "surrogatepass")
    for start in range(0, len(data) - block_chars + 1, block_chars):
        prev = hashlib.blake2b(prev + data[start : start + block_chars], digest_size=8).digest()
        out.append(prev)
    return out


@dataclass
class RoundRobinRouter:
    """The baseline: each request to the next replica in turn."""

    _next: int = 0

    def pick(self, prompt: str, replicas: Sequence[ReplicaLoad]) -> Route:
        if not replicas:
            raise ValueError("no ready replica")
        ordered = sorted(replicas, key=lambda r: r.replica)
        choice = ordered[self._next % len(ordered)]
        self._next += 1
        return Route(choice.replica, 0, len(prompt))

    def forget(self, replica: str) -> None:
        return None


@dataclass
class PrefixAwareRouter:
    """Longest cached prefix, then least queued work, within ``max_imbalance`` of the least
    loaded replica (the module docstring has the details).

    ``block_chars``: size of a key block (about 16-32 tokens of English text at 64 chars).
    ``max_blocks_per_replica``: how many block hashes each replica's memory holds (LRU).
    ``max_imbalance``: in-flight requests a replica may have above the least loaded one and
    still be considered.
    ``request_cost_chars``: the work of a request in flight beyond its prefill (decoding), in
    prompt characters, when comparing replicas' queues."""

    block_chars: int = 64
    max_blocks_per_replica: int = 200_000
    max_imbalance: int = 2
    request_cost_chars: int = 256
    _seen: dict[str, OrderedDict[bytes, None]] = field(default_factory=dict)
    _rr: int = 0

    def pick(self, prompt: str, replicas: Sequence[ReplicaLoad]) -> Route:
        if not replicas:
            raise ValueError("no ready replica")
        blocks = prefix_blocks(prompt, self.block_chars)
        size = len(prompt.encode("utf-8", "surrogatepass"))
        least = min(r.in_flight for r in replicas)
        allowed = [r for r in replicas if r.in_flight <= least + self.max_imbalance]
        # longest cached prefix first; then the least queued prefill, the fewest in flight
        best = min(
            allowed,
            key=lambda r: (
                -self._match(r.replica, blocks),
                r.pending_chars + self.request_cost_chars * r.in_flight,
                r.replica,
            ),
        )
        matched = min(size, self._match(best.replica, blocks) * self.block_chars)
        if matched == 0:  # nothing cached anywhere allowed: least loaded, ties in turn
            cost = best.pending_chars + self.request_cost_chars * best.in_flight
            idle = sorted(
                (
                    r
                    for r in allowed
                    if r.pending_chars + self.request_cost_chars * r.in_flight == cost
                ),
                key=lambda r: r.replica,
            )
            best = idle[self._rr % len(idle)]
            self._rr += 1
        self._remember(best.replica, blocks)
        return Route(best.replica, matched, size)

    def forget(self, replica: str) -> None:
        """A replica restarted or went away: its cache is gone."""
        self._seen.pop(replica, None)

    def _match(self, replica: str, blocks: list[bytes]) -> int:
        seen = self._seen.get(replica)
        if not seen:
            return 0
        n = 0
        for b in blocks:
            if b not in seen:
                break
            n += 1
        return n

    def _remember(self, replica: str, blocks: list[bytes]) -> None:
        seen = self._seen.setdefault(replica, OrderedDict())
        for b in blocks:
            seen[b] = None
            seen.move_to_end(b)
        while len(seen) > self.max_blocks_per_replica:
            seen.popitem(last=False)


ROUTERS: dict[str, type[PrefixAwareRouter] | type[RoundRobinRouter]] = {
    "prefix": PrefixAwareRouter,
    "round-robin": RoundRobinRouter,
}
"""Routing policies a deployment may choose (``router`` field; default ``prefix``)."""
