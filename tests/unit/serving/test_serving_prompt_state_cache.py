"""The llama.cpp replica's prompt cache: one state per branch of the prompt tree, within its
byte budget, a poor match not counted as a use."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp engine is missing: `make serve-engine`")

from tensoryard.serving.llama_replica import PrefixStateCache

MB = 1_000_000


@dataclass
class State:  # what the cache reads of llama_cpp's LlamaState
    name: str
    llama_state_size: int = 24 * MB


def _prefix(group: int, n: int = 1000) -> list[int]:
    return [7, 8, 9] + [group * 100_000 + i for i in range(n)]


def test_a_sibling_state_replaces_the_one_it_covers_and_other_prefixes_stay() -> None:
    cache = PrefixStateCache(capacity_bytes=60 * MB)  # two states
    a, c = _prefix(1), _prefix(3)
    cache[[*a, 1, 2, 3, 4]] = State("a1")
    cache[[*c, 5, 6]] = State("c1")
    assert cache[[*a, 9]].name == "a1"  # a's prefix matched
    cache[[*a, 11, 12, 13]] = State("a2")  # a sibling of a1: a1 is redundant now
    assert [s.name for s in cache.cache_state.values()] == ["c1", "a2"]
    assert cache[[*c, 42]].name == "c1"  # the stock cache had evicted c1 for a1's sibling
    assert cache[[*a, 42]].name == "a2"


def test_a_conversations_next_turn_supersedes_its_last_and_a_short_match_is_no_use() -> None:
    cache = PrefixStateCache(capacity_bytes=60 * MB)
    turn1 = _prefix(1, 300)
    cache[turn1] = State("turn1")
    other = [7, 8, 9, *range(5_000, 5_800)]  # shares 3 tokens with everything
    cache[other] = State("other")
    turn2 = turn1 + list(range(900, 1_300))  # the whole first turn, then more
    cache[turn2] = State("turn2")
    assert [s.name for s in cache.cache_state.values()] == ["other", "turn2"]
    # a lookup sharing only the 3 common tokens returns the best entry but does not refresh it
    assert cache[[7, 8, 9, 1, 2]].name in {"other", "turn2"}
    assert list(cache.cache_state.values())[-1].name == "turn2"
    cache[_prefix(4)] = State("new")  # over budget: the least recently *used* goes
    assert [s.name for s in cache.cache_state.values()] == ["turn2", "new"]


def test_a_prompt_sharing_nothing_is_a_miss() -> None:
    cache = PrefixStateCache(capacity_bytes=60 * MB)
    cache[_prefix(1)] = State("a")
    with pytest.raises(KeyError):
        cache[[1, 2, 3]]
    assert [1, 2, 3] not in cache
    assert _prefix(1)[:10] in cache
