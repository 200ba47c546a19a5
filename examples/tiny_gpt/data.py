"""Byte-level text that every machine has offline: the Python standard library's own source.

All data access goes through `ByteCorpus.batch(seed=, step=, rank=, ...)`: the windows of a
batch are a pure function of (seed, step, rank), so a resumed run sees exactly the data an
uninterrupted run would have seen, with no loader state to checkpoint.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["SEPARATOR", "ByteCorpus", "stdlib_sources"]

SEPARATOR = 256  # token between files; bytes are 0..255


def stdlib_sources() -> list[Path]:
    """The top-level *.py files of the standard library, sorted (about 4-5 MB)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"no *.py files under {root} (the standard library's source)")
    return files


@dataclass(frozen=True)
class ByteCorpus:
    """A token stream (uint16) split into a training part and a held-out tail."""

    tokens: np.ndarray
    holdout: float = 0.05

    @classmethod
    def from_files(cls, files: list[Path], *, max_bytes: int | None = None) -> ByteCorpus:
        parts: list[np.ndarray] = []
        total = 0
        for path in files:
            data = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.uint16)
            parts += [data, np.array([SEPARATOR], dtype=np.uint16)]
            total += data.size + 1
            if max_bytes is not None and total >= max_bytes:
                break
        return cls(np.concatenate(parts)[:max_bytes])

    @classmethod
    def stdlib(cls, *, max_bytes: int | None = None) -> ByteCorpus:
        return cls.from_files(stdlib_sources(), max_bytes=max_bytes)

    @property
    def split(self) -> int:
        return int(self.tokens.size * (1.0 - self.holdout))

    def batch(
        self,
        *,
        seed: int,
        step: int,
        rank: int,
        batch_size: int,
        seq_len: int,
        heldout: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (batch_size, seq_len), as int64."""
        lo, hi = (self.split, self.tokens.size) if heldout else (0, self.split)
        rng = np.random.default_rng([seed, step, rank, int(heldout)])
        starts = rng.integers(lo, hi - seq_len - 1, size=batch_size)
        windows = np.stack([self.tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64)
        chunk = torch.from_numpy(windows)
        return chunk[:, :-1], chunk[:, 1:]
