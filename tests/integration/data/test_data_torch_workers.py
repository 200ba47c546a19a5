"""The torch adapter inside real DataLoader worker processes, and the shared-memory ring that
brings their batches to the trainer (tensoryard.data.torch_workers)."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import signal
from collections.abc import Iterator
from multiprocessing import resource_tracker
from pathlib import Path

import numpy as np
import pytest
import torch

from tensoryard.data import (
    TorchTokenLoader,
    build_loader,
    build_torch_loader,
    torch_workers,
    write_token_dataset,
)

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


# ---------------------------------------------------------------------------------------------
# the shared-memory ring


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three batches per slot, so that a few batches already span both workers' groups."""
    monkeypatch.setattr(torch_workers, "MAX_GROUP", 3)


def ring_loader(dataset: Path, workers: int, **kw: object) -> TorchTokenLoader:
    return TorchTokenLoader(build_loader(dataset, **CFG), num_workers=workers, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("workers", "context"),
    [
        pytest.param(0, None, id="in one process"),
        pytest.param(2, "fork", id="two forked workers"),
        pytest.param(3, "fork", id="three forked workers"),
        pytest.param(2, "spawn", id="two spawned workers"),
    ],
)
def test_the_ring_hands_out_the_same_batches_as_one_process(
    dataset: Path, small_groups: None, workers: int, context: str | None
) -> None:
    loader = ring_loader(dataset, workers, multiprocessing_context=context, dtype=None)
    got = list(itertools.islice(loader, 20))
    loader.close()
    want = numpy_stream(dataset, 20)
    assert all(t.dtype == torch.uint16 for t in got)
    assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, want, strict=True))
    assert loader.state_dict()["consumed_samples"] == 20 * CFG["global_batch"]


def test_batches_from_the_ring_own_their_memory(dataset: Path, small_groups: None) -> None:
    """A batch kept while the workers go on filling (and reusing) their slots does not change."""
    loader = ring_loader(dataset, 2)
    it = iter(loader)
    first = next(it)
    kept = first.clone()
    rest = list(itertools.islice(it, 60))  # every slot of both workers refilled several times
    loader.close()
    assert torch.equal(first, kept)
    assert first.dtype == torch.int64 and len(rest) == 60


def test_a_bounded_loader_stops_inside_a_group(dataset: Path, small_groups: None) -> None:
    loader = ring_loader(dataset, 2, num_batches=7, dtype=None)  # groups of 3, 3 and 1
    got = list(loader)
    assert [g.numpy().tolist() for g in got] == [w.tolist() for w in numpy_stream(dataset, 7)]


def test_resume_mid_epoch_with_workers_continues_across_the_epoch_boundary(
    dataset: Path, small_groups: None
) -> None:
    per_epoch = 40_000 // SEQ // CFG["global_batch"]  # 50 batches
    want = numpy_stream(dataset, per_epoch + 20)
    first = ring_loader(dataset, 2)
    before = list(itertools.islice(first, 31))  # the workers have prefetched past 31
    state = first.state_dict()
    first.close()
    second = ring_loader(dataset, 3)
    second.load_state_dict(state)
    after = list(itertools.islice(second, per_epoch + 20 - 31))
    second.close()
    got = [t.numpy() for t in before + after]
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_wide_tokens_arrive_as_int64_through_the_ring(tmp_path: Path) -> None:
    tokens = (np.arange(20_001) * 7 % 100_000).astype(np.uint32)
    write_token_dataset(tmp_path, [tokens], vocab_size=100_000, eos_id=None, shard_tokens=5_000)
    inner = build_loader(tmp_path, **CFG)  # type: ignore[arg-type]
    assert inner.dtype == np.uint32
    got = list(itertools.islice(TorchTokenLoader(inner, num_workers=2, dtype=None), 6))
    want = numpy_stream(tmp_path, 6)
    assert all(g.dtype == torch.int64 for g in got)
    assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(torch.int32, id="int32 (numpy converts)"),
        pytest.param(torch.bfloat16, id="bfloat16 (numpy has none: torch converts)"),
    ],
)
def test_the_ring_converts_to_the_dtype_asked_like_one_process(
    dataset: Path, dtype: torch.dtype
) -> None:
    got = list(itertools.islice(ring_loader(dataset, 2, dtype=dtype), 5))
    want = list(itertools.islice(ring_loader(dataset, 0, dtype=dtype), 5))
    assert all(g.dtype == dtype and torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_the_queue_path_without_shared_memory_gives_the_same_batches(dataset: Path) -> None:
    loader = ring_loader(dataset, 2, shared_memory=False, dtype=None)
    got = list(itertools.islice(loader, 9))
    loader.close()
    want = numpy_stream(dataset, 9)
    assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, want, strict=True))


# ---------------------------------------------------------------------------------------------
# nothing is left behind


def ring_maps() -> list[str]:
    """torch's shared-memory segments mapped in this process, even once unlinked (the
    ``sem.`` mappings of DataLoader's queues are multiprocessing's, freed with its threads)."""
    with open("/proc/self/maps") as maps:
        lines = [line.split(maxsplit=5)[-1] for line in maps]
    return sorted(m for m in lines if m.startswith("/dev/shm/torch_"))


def shm_files(pids: list[int]) -> list[str]:
    """Named segments under /dev/shm made by these processes (torch names them by pid)."""
    mine = tuple(f"torch_{pid}_" for pid in pids)
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(mine))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def no_leak() -> Iterator[list[int]]:
    """Checks after the test: no worker alive, no shared-memory mapping or named segment left,
    no file descriptor more. Yields a list the test adds its worker pids to."""
    resource_tracker.ensure_running()  # the spawn method's one pipe per process, kept for good
    gc.collect()
    maps, fds = ring_maps(), open_fds()
    pids: list[int] = [os.getpid()]
    yield pids
    gc.collect()
    assert multiprocessing.active_children() == []
    assert ring_maps() == maps
    assert shm_files(pids) == []
    assert open_fds() <= fds


def workers_of(loader: TorchTokenLoader) -> list[int]:
    del loader  # the loader's workers are this process's only children in these tests
    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_closing_the_loader_mid_epoch_frees_the_ring_and_stops_the_workers(
    dataset: Path, no_leak: list[int], context: str
) -> None:
    before = ring_maps()
    loader = ring_loader(dataset, 2, multiprocessing_context=context)
    it = iter(loader)
    next(it)
    no_leak += workers_of(loader)
    assert len(no_leak) == 3
    assert ring_maps() != before, "the ring is mapped while the loader runs"
    loader.close()
    # At once, while the caller still holds the iterator (not when it is garbage collected).
    assert multiprocessing.active_children() == []
    assert ring_maps() == before
    with pytest.raises(StopIteration):
        next(it)


def test_no_file_descriptor_or_segment_is_made_per_batch(dataset: Path, no_leak: list[int]) -> None:
    loader = ring_loader(dataset, 2)
    it = iter(loader)
    list(itertools.islice(it, 10))
    fds, maps = open_fds(), ring_maps()
    list(itertools.islice(it, 300))
    assert open_fds() == fds
    assert ring_maps() == maps
    loader.close()


def test_a_worker_killed_mid_epoch_fails_the_loop_and_leaves_nothing_behind(
    dataset: Path, small_groups: None, no_leak: list[int]
) -> None:
    loader = ring_loader(dataset, 2)
    it = iter(loader)
    next(it)
    pids = workers_of(loader)
    no_leak += pids
    os.kill(pids[-1], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        for _ in range(100_000):
            next(it)
    loader.close()
