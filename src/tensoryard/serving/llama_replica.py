"""One llama.cpp replica: llama-cpp-python's OpenAI server, with a prompt cache fit for routing.

    python -m tensoryard.serving.llama_replica --model M.gguf --port P ...   (the server's flags)

llama-cpp-python's server (0.3.x) keeps a RAM cache of KV states, one per finished request,
and a request reuses the state sharing the longest token prefix with its prompt. That is what
prefix-aware routing exploits, but three things in it work against it (measured on SmolLM2 at
n_ctx 2048, ``benchmarks/serving.py``):

- **Every state carries the logits buffer.** A saved state copies the ``scores`` rows of its
  tokens (n_tokens x 49,152 float32 for SmolLM2: about 200 MB for a 1,000-token prompt when
  the server keeps every position's logits, its default) and a cache hit copies them back;
  neither counts against ``--cache_size``, so a 1 GiB cache could hold gigabytes. Those rows
  are only ever read to answer ``logprobs``. A deployment without the ``logprobs`` option runs
  with ``logits_all`` off, and its states leave the rows out (:class:`_Llama`).
- **Siblings crowd the cache.** The state of "prefix + question 2" is stored next to that of
  "prefix + question 1"; the older one is then worth only its few tokens past the common
  prefix. Under a small cache the siblings of one system prompt pushed the other prompts out,
  so a replica holding two prompt groups kept neither. :class:`PrefixStateCache` drops a state
  when a new one covers nearly all of it (an exact prefix of it always: a conversation's next
  turn supersedes the last).
- **A poor match counts as a use.** The stock cache moves the best entry to the recent end on
  every lookup, even when it shares only a few tokens ("System: you are"); here a lookup only
  refreshes an entry that shares at least half of it.

Everything else is the stock server: the same flags, endpoints and behaviour.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import llama_cpp
import llama_cpp.llama_cache

__all__ = ["PrefixStateCache", "main"]

SUPERSEDE_FRACTION = 0.9
"""A stored state is dropped when a new state shares at least this fraction of its tokens."""
REFRESH_FRACTION = 0.5
"""A lookup marks the matched state as recently used only when it shares this much of it."""


_common = llama_cpp.llama.Llama.longest_token_prefix  # tokens two sequences share from the start


class PrefixStateCache(llama_cpp.llama_cache.LlamaRAMCache):
    """llama-cpp-python's RAM cache, one state per branch of the prompt tree (least recently
    used out first, within ``capacity_bytes``)."""

    def __getitem__(self, key: Sequence[int]) -> llama_cpp.llama.LlamaState:
        tokens = tuple(key)
        best, shared = None, 0
        for k in self.cache_state:
            n = _common(k, tokens)
            if n > shared:
                best, shared = k, n
        if best is None:
            raise KeyError("Key not found")
        if shared >= REFRESH_FRACTION * len(best):
            self.cache_state.move_to_end(best)
        return self.cache_state[best]

    def __setitem__(self, key: Sequence[int], value: llama_cpp.llama.LlamaState) -> None:
        tokens = tuple(key)
        covered = [
            k
            for k in self.cache_state
            if k != tokens and _common(k, tokens) >= SUPERSEDE_FRACTION * len(k)
        ]
        for k in covered:
            del self.cache_state[k]
        super().__setitem__(tokens, value)
        _say(
            f"prompt cache: stored a state of {len(tokens)} tokens"
            + (f", superseding {len(covered)}" if covered else "")
            + f"; {len(self.cache_state)} held, {self.cache_size / 1e6:.1f} MB"
        )


class _Llama(llama_cpp.Llama):
    """The stock model; without ``logits_all`` its saved states leave out the logits rows (read
    only for ``logprobs``, which such a model refuses anyway) instead of copying them to and
    from every cache entry. Each prompt's reuse is logged: ``prompt of N tokens, R reused``."""

    def generate(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        prompt = list(tokens)
        reused = 0
        if self.n_tokens > 0 and kwargs.get("reset", True):
            # what the stock generate keeps of the context (a cached state already restored)
            reused = _common(self._input_ids.tolist(), prompt)
            if reused == len(prompt):  # one token is decoded again to refresh the logits
                reused -= 1
        _say(f"prompt of {len(prompt)} tokens, {reused} reused")
        return super().generate(prompt, *args, **kwargs)

    def save_state(self) -> llama_cpp.llama.LlamaState:
        if self._logits_all:
            return super().save_state()
        full = self.scores
        self.scores = full[:0]  # the state copies `scores[:n_tokens]`: nothing
        try:
            return super().save_state()
        finally:
            self.scores = full

    def load_state(self, state: llama_cpp.llama.LlamaState) -> None:
        _say(f"prompt cache: restoring a state of {state.n_tokens} tokens")
        if self._logits_all or len(state.scores):
            super().load_state(state)
            return
        full = self.scores
        self.scores = full[:0]  # nothing to copy back
        try:
            super().load_state(state)
        finally:
            self.scores = full


def _say(line: str) -> None:
    """One line to the replica's log (its stderr, kept by the control plane)."""
    print(f"tyard-replica: {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Run llama-cpp-python's server (its own command line) with the classes above."""
    import llama_cpp.server.__main__ as server

    # The server's model loader looks both up on the `llama_cpp` module when it builds a model.
    llama_cpp.LlamaRAMCache = PrefixStateCache  # type: ignore[attr-defined]
    llama_cpp.Llama = _Llama  # type: ignore[misc]
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    server.main()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
