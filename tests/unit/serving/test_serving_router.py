"""The replica router: prefix-aware with a burst guard, and the round-robin baseline."""

from __future__ import annotations

import pytest

from tensoryard.serving.router import (
    PrefixAwareRouter,
    ReplicaLoad,
    RoundRobinRouter,
    prefix_blocks,
)

SYSTEM_A = "You are a support agent for ACME. " * 20
SYSTEM_B = "You translate legal contracts into plain English. " * 20


def idle(*names: str) -> list[ReplicaLoad]:
    return [ReplicaLoad(n, 0) for n in names]


def test_a_prompt_goes_back_to_the_replica_that_saw_its_prefix() -> None:
    router = PrefixAwareRouter(block_chars=32)
    first = router.pick(SYSTEM_A + "question 1", idle("r0", "r1"))
    other = router.pick(SYSTEM_B + "question 1", idle("r0", "r1"))
    assert other.replica != first.replica  # nothing cached: spread to the other idle replica
    again = router.pick(SYSTEM_A + "question 2", idle("r0", "r1"))
    assert again.replica == first.replica
    assert again.matched_chars >= len(SYSTEM_A) - 32


def test_the_key_is_the_whole_prompt_not_only_the_system_prompt() -> None:
    router = PrefixAwareRouter(block_chars=32, max_imbalance=0)  # loads place the first two
    chat_x = SYSTEM_A + "user: first conversation about invoices and refunds " * 5
    chat_y = SYSTEM_A + "user: second conversation about shipping and returns " * 5
    assert router.pick(chat_x, [ReplicaLoad("r0", 0), ReplicaLoad("r1", 1)]).replica == "r0"
    assert router.pick(chat_y, [ReplicaLoad("r0", 1), ReplicaLoad("r1", 0)]).replica == "r1"
    # both replicas hold the system prompt; the follow-up goes where its history is
    route = router.pick(chat_y + "assistant: ok. user: next turn", idle("r0", "r1"))
    assert route.replica == "r1"
    assert route.matched_chars > len(SYSTEM_A)


def test_a_burst_of_one_prefix_spreads_once_a_replica_is_ahead_by_more_than_the_guard() -> None:
    router = PrefixAwareRouter(block_chars=32, max_imbalance=2)
    router.pick(SYSTEM_A, idle("r0", "r1"))
    loads = {"r0": 0, "r1": 0}
    for _ in range(10):
        route = router.pick(SYSTEM_A + "q", [ReplicaLoad(k, v) for k, v in loads.items()])
        loads[route.replica] += 1  # every request stays in flight: a burst
    assert abs(loads["r0"] - loads["r1"]) <= 3
    assert min(loads.values()) >= 3


def test_without_a_cached_prefix_the_replica_with_less_queued_prefill_wins() -> None:
    router = PrefixAwareRouter(block_chars=32)
    loads = [ReplicaLoad("r0", 1, pending_chars=5000), ReplicaLoad("r1", 1, pending_chars=40)]
    route = router.pick("a prompt nobody has seen " * 4, loads)
    assert route.replica == "r1"
    assert route.matched_chars == 0 and route.uncached_chars == route.prompt_chars


def test_a_cached_replica_busy_with_cheap_work_keeps_its_prefix() -> None:
    router = PrefixAwareRouter(block_chars=32)
    first = router.pick(SYSTEM_A, idle("r0", "r1")).replica
    other = "r1" if first == "r0" else "r0"
    cheap = [ReplicaLoad(first, 1, pending_chars=40), ReplicaLoad(other, 0)]
    route = router.pick(SYSTEM_A + "question 2", cheap)
    assert route.replica == first
    assert route.uncached_chars < 64


def test_with_nothing_cached_requests_go_to_the_least_loaded_replica() -> None:
    router = PrefixAwareRouter()
    route = router.pick("short unique prompt", [ReplicaLoad("r0", 3), ReplicaLoad("r1", 0)])
    assert route.replica == "r1"
    assert route.matched_chars == 0


def test_a_forgotten_replica_has_no_cache() -> None:
    router = PrefixAwareRouter(block_chars=32)
    first = router.pick(SYSTEM_A, idle("r0", "r1"))
    router.forget(first.replica)
    assert router.pick(SYSTEM_A, [ReplicaLoad(first.replica, 0)]).matched_chars == 0


def test_the_memory_per_replica_is_bounded() -> None:
    router = PrefixAwareRouter(block_chars=8, max_blocks_per_replica=10)
    for i in range(50):
        router.pick(f"prompt number {i:04d} " * 4, idle("r0"))
    assert len(router._seen["r0"]) == 10


def test_round_robin_takes_replicas_in_turn() -> None:
    router = RoundRobinRouter()
    picks = [router.pick("x", idle("r1", "r0")).replica for _ in range(4)]
    assert picks == ["r0", "r1", "r0", "r1"]


@pytest.mark.parametrize("router", [PrefixAwareRouter(), RoundRobinRouter()])
def test_no_replica_is_an_error(router: PrefixAwareRouter | RoundRobinRouter) -> None:
    with pytest.raises(ValueError, match="no ready replica"):
        router.pick("x", [])


def test_block_hashes_are_chained_so_equal_blocks_at_different_places_differ() -> None:
    blocks = prefix_blocks("abcd" * 4, 4)
    assert len(blocks) == 4
    assert len(set(blocks)) == 4
    assert prefix_blocks("abcdabcdX", 4) == blocks[:2]  # the partial block is not part of the key
