"""Stateless permutations: sample order as a pure function of (seed, epoch, position).

A Feistel network over the smallest even-bit domain that covers ``n`` is a bijection; walking
the cycle (re-encrypting values that land outside ``[0, n)``) restricts it to a bijection of
``[0, n)``. Nothing proportional to ``n`` is ever built, so an epoch over a billion samples
costs the same to start and to resume as one over ten.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from tensoryard.data._util import distinct

__all__ = ["FeistelPermutation", "ShuffleOrder", "derive_key"]

_MUL = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(32)


def derive_key(*parts: int | str) -> int:
    """A 64-bit key from any tuple of ints and strings (stable across runs and platforms)."""
    text = "|".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class FeistelPermutation:
    """A keyed bijection of ``[0, n)``; ``perm(idx)`` maps an index array, vectorised.

    An unbalanced Feistel network over ``bits = bit_length(n - 1)`` bits (so the domain is
    under ``2n`` and cycle walks are short) that alternately updates the high and low part with
    a multiply-xorshift round function.
    """

    ROUNDS = 6

    def __init__(self, n: int, key: int) -> None:
        if n < 1:
            raise ValueError("a permutation needs n >= 1")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._lo_bits = np.uint64(bits - bits // 2)
        self._lo_mask = np.uint64((1 << (bits - bits // 2)) - 1)
        self._hi_mask = np.uint64((1 << (bits // 2)) - 1)
        self._keys = [np.uint64(derive_key(key, r)) for r in range(self.ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        hi, lo = x >> self._lo_bits, x & self._lo_mask
        for r, k in enumerate(self._keys):
            if r % 2 == 0:
                z = (lo ^ k) * _MUL
                hi ^= (z >> _SHIFT) & self._hi_mask
            else:
                z = (hi ^ k) * _MUL
                lo ^= (z >> _SHIFT) & self._lo_mask
        return (hi << self._lo_bits) | lo

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        x = np.asarray(idx, dtype=np.uint64)
        if self.n == 1:
            return np.zeros(x.shape, dtype=np.int64)
        y = self._encrypt(x)
        limit = np.uint64(self.n)
        out = np.flatnonzero(y >= limit)
        # The domain is under 2n, so fewer than half the values walk again at each step;
        # the last few stragglers are cheaper in plain Python than in many tiny numpy calls.
        while len(out) > 8:
            y[out] = self._encrypt(y[out])
            out = out[y[out] >= limit]
        for i in out.tolist():
            v = int(y[i])
            while v >= self.n:
                v = self._encrypt_one(v)
            y[i] = v
        return y.astype(np.int64)

    def _encrypt_one(self, v: int) -> int:
        lo_bits, lo_mask, hi_mask = int(self._lo_bits), int(self._lo_mask), int(self._hi_mask)
        hi, lo = v >> lo_bits, v & lo_mask
        mul, full = int(_MUL), (1 << 64) - 1
        for r, k in enumerate(self._keys):
            if r % 2 == 0:
                hi ^= ((((lo ^ int(k)) * mul) & full) >> 32) & hi_mask
            else:
                lo ^= ((((hi ^ int(k)) * mul) & full) >> 32) & lo_mask
        return (hi << lo_bits) | lo


@dataclass(frozen=True)
class ShuffleOrder:
    """Order of one epoch of ``n`` samples: position -> sample index, stateless.

    ``block`` consecutive samples move together and ``window`` blocks are mixed at a time:
    ``block=1, window=None`` is a full random permutation; larger blocks and a window keep the
    reads of any stretch of the epoch inside ``block * window`` samples (cache-friendly for
    remote shards). ``shuffle=False`` is the identity.
    """

    n: int
    key: int
    block: int = 1
    window: int | None = None
    shuffle: bool = True
    _perms: dict[tuple[str, int], FeistelPermutation] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def _perm(self, kind: str, w: int, size: int) -> FeistelPermutation:
        """The permutation of window w (or of the blocks), built once: keys cost 7 hashes."""
        got = self._perms.get((kind, w))
        if got is None:
            if len(self._perms) > 64:  # bounded: a block of batches spans few windows
                self._perms.clear()
            key = derive_key(self.key, "w", w) if kind == "w" else derive_key(self.key, "b")
            got = self._perms[(kind, w)] = FeistelPermutation(size, key)
        return got

    def __call__(self, pos: np.ndarray) -> np.ndarray:
        p = np.asarray(pos, dtype=np.int64)
        if not self.shuffle or self.n <= 1:
            return p.copy()
        q = self._within_windows(p)
        return self._move_blocks(q) if self.block > 1 else q

    def _within_windows(self, p: np.ndarray) -> np.ndarray:
        span = self.n if self.window is None else max(1, self.window) * self.block
        if span >= self.n:
            return self._perm("w", 0, self.n)(p)
        out = np.empty_like(p)
        win = p // span
        for w in distinct(win):
            sel = win == w
            base = w * span
            size = min(span, self.n - base)
            perm = self._perm("w", w, size)
            out[sel] = base + perm(p[sel] - base)
        return out

    def _move_blocks(self, q: np.ndarray) -> np.ndarray:
        full = self.n // self.block
        if full <= 1:
            return q
        # The short tail block (if any) stays last so every block has the same size.
        in_full = q < full * self.block
        out = q.copy()
        blocks = self._perm("b", 0, full)(q[in_full] // self.block)
        out[in_full] = blocks * self.block + q[in_full] % self.block
        return out
