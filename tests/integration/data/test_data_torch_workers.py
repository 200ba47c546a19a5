"""The torch adapter inside real DataLoader worker processes."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from tensoryard.data import TorchTokenLoader, build_loader, build_torch_loader, write_token_dataset

SEQ = 100
CFG = {"seq_len": SEQ, "global_batch": 8, "seed": 4}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torchdata")
    tokens = (np.arange(40_001) % 50_000).astype(np.uint16)
    write_token_dataset(out, [tokens], vocab_size=50_000, eos_id=None, shard_tokens=3_000)
    return out


def numpy_stream(dataset: Path, n: int, rank: int = 0, world: int = 1) -> list[np.ndarray]:
    ld = build_loader(dataset, rank=rank, world_size=world, **CFG)  # type: ignore[arg-type]
    return [b.copy() for b in itertools.islice(ld, n)]


def test_two_dataloader_workers_hand_out_the_numpy_stream_as_int64_tensors(dataset: Path) -> None:
    loader = build_torch_loader(dataset, num_workers=2, rank=1, world_size=2, **CFG)  # type: ignore[arg-type]
    got = list(itertools.islice(loader, 12))
    want = numpy_stream(dataset, 12, rank=1, world=2)
    assert all(t.dtype == torch.int64 and t.shape == (4, SEQ + 1) for t in got)
    assert all(np.array_equal(t.numpy(), w) for t, w in zip(got, want, strict=True))


def test_resume_with_another_worker_count_continues_the_same_stream(dataset: Path) -> None:
    want = numpy_stream(dataset, 14)
    first = build_torch_loader(dataset, num_workers=2, **CFG)  # type: ignore[arg-type]
    before = list(itertools.islice(first, 5))  # the workers prefetched more than 5
    state = first.state_dict()
    assert state["consumed_samples"] == 5 * CFG["global_batch"]
    second = build_torch_loader(dataset, num_workers=0, **CFG)  # type: ignore[arg-type]
    second.load_state_dict(state)
    after = list(itertools.islice(second, 9))
    got = [t.numpy() for t in before + after]
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_a_bounded_torch_loader_stops_after_its_batches(dataset: Path) -> None:
    inner = build_loader(dataset, **CFG)  # type: ignore[arg-type]
    loader = TorchTokenLoader(inner, num_workers=2, num_batches=7, dtype=None)
    got = list(loader)
    assert len(got) == 7
    assert got[0].dtype == torch.uint16  # dtype=None keeps the stored width
    want = numpy_stream(dataset, 7)
    assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, want, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for pinned memory")
def test_batches_arrive_in_pinned_memory_on_a_gpu_machine(dataset: Path) -> None:
    loader = build_torch_loader(dataset, num_workers=2, **CFG)  # type: ignore[arg-type]
    batch = next(iter(loader))
    assert batch.is_pinned()
    on_gpu = batch.cuda(non_blocking=True)
    assert torch.equal(on_gpu.cpu(), batch)
