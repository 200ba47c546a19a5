"""The tiny_gpt example's pieces that need no processes: data, model, job spec."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from tensoryard.spec.job import load_job_spec

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_gpt"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"tiny_gpt_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data() -> ModuleType:
    return load("data")


def test_a_batch_is_a_pure_function_of_seed_step_and_rank(data: ModuleType) -> None:
    corpus = data.ByteCorpus.stdlib(max_bytes=200_000)
    args = {"seed": 1, "step": 7, "batch_size": 4, "seq_len": 16}
    x1, y1 = corpus.batch(rank=0, **args)
    x2, y2 = corpus.batch(rank=0, **args)
    x3, _ = corpus.batch(rank=1, **args)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the inputs shifted by one
    assert x1.shape == (4, 16) and x1.dtype == torch.int64 and int(x1.max()) <= 256


def test_the_corpus_is_the_sorted_standard_library_source(data: ModuleType) -> None:
    files = data.stdlib_sources()
    assert files == sorted(files) and all(f.suffix == ".py" for f in files)
    corpus = data.ByteCorpus.stdlib(max_bytes=50_000)
    assert corpus.tokens.size == 50_000
    assert bytes(corpus.tokens[:200].astype("uint8")) == files[0].read_bytes()[:200]


def test_held_out_batches_come_from_the_tail_only(data: ModuleType) -> None:
    corpus = data.ByteCorpus(tokens=np.arange(10_000, dtype=np.uint16))  # token = its position
    held, _ = corpus.batch(seed=0, step=1, rank=0, batch_size=64, seq_len=8, heldout=True)
    train, _ = corpus.batch(seed=0, step=1, rank=0, batch_size=64, seq_len=8)
    assert int(held.min()) >= corpus.split > int(train.max())


def test_the_model_maps_bytes_to_next_byte_logits_and_a_loss() -> None:
    model = load("model")
    torch.manual_seed(0)
    gpt = model.TinyGPT(model.GPTConfig(seq_len=16, d_model=32, n_layers=1, n_heads=2))
    idx = torch.randint(0, 257, (2, 16))
    assert gpt(idx).shape == (2, 16, 257)
    loss = gpt(idx, idx)
    assert abs(float(loss.detach()) - torch.log(torch.tensor(257.0)).item()) < 0.5  # near uniform


def test_the_example_job_spec_runs_two_torchrun_processes_with_checkpoints() -> None:
    spec = load_job_spec(EXAMPLE / "job.yaml")
    assert spec.launcher == "torchrun" and spec.command[0] == "train.py"
    assert (spec.resources.nodes, spec.resources.procs, spec.resources.gpus_per_node) == (1, 2, 0)
    assert spec.checkpoint.interval == 25 and spec.restart.max_restarts == 3
    assert spec.workdir == str(EXAMPLE)
