"""Fixtures of the data tests: small prepared datasets whose token t is known (t % MOD)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tensoryard.data import TokenDataset, open_dataset, write_token_dataset
from tensoryard.data.fetchd import SERVICE_DIR, stop_services

MOD = 60_000  # token t of a counting dataset is t % MOD (so every window is checkable)


def counting_tokens(start: int, length: int, offset: int = 0) -> np.ndarray:
    """Tokens [start, start + length) of a counting dataset made with `offset`."""
    return (np.arange(start, start + length, dtype=np.int64) + offset) % MOD


def write_counting(out: Path, n_tokens: int, shard_tokens: int, offset: int = 0) -> Path:
    """A prepared dataset holding one raw stream: token t = (t + offset) % MOD."""
    write_token_dataset(
        out,
        [counting_tokens(0, n_tokens, offset).astype(np.uint16)],
        vocab_size=MOD,
        eos_id=None,
        shard_tokens=shard_tokens,
    )
    return out


@pytest.fixture(scope="session")
def counting_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """50,001 tokens in 13 shards of 4,000 (samples cross shard ends often)."""
    return write_counting(tmp_path_factory.mktemp("counting"), 50_001, 4_000)


@pytest.fixture(scope="session")
def other_counting_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second dataset, same size and tokenizer, different content."""
    return write_counting(tmp_path_factory.mktemp("counting2"), 30_001, 7_000, offset=17)


@pytest.fixture
def open_counting(counting_dir: Path) -> Callable[..., TokenDataset]:
    """Open the counting dataset (a fresh reader each call)."""

    def make(**kwargs: object) -> TokenDataset:
        return open_dataset(counting_dir, **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture
def window_of() -> Callable[[int, int], np.ndarray]:
    """Expected tokens of sample i of the counting dataset at a given seq_len."""

    def expected(i: int, seq_len: int) -> np.ndarray:
        return counting_tokens(i * seq_len, seq_len + 1)

    return expected


@pytest.fixture
def write_counting_dataset() -> Callable[..., Path]:
    """The `write_counting` helper, for tests that need a dataset of their own."""
    return write_counting


@pytest.fixture(scope="session", autouse=True)
def _fetch_services_end_with_the_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """A node fetch service outlives its last reader by its idle period (60 s by default):
    the ones the tests started end with the session."""
    yield
    for folder in tmp_path_factory.getbasetemp().rglob(SERVICE_DIR):
        stop_services(folder.parent)
