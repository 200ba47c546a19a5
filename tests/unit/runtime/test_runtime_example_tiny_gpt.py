"""The tiny_gpt example's pieces that need no processes: corpus, model, job spec.

Preparing the data on real files: tests/integration/runtime/test_runtime_tiny_gpt_data.py.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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


def test_the_corpus_is_the_sorted_standard_library_source_cut_at_max_bytes(
    data: ModuleType,
) -> None:
    files = data.stdlib_sources()
    assert files == sorted(files) and all(f.suffix == ".py" for f in files)
    texts = list(data.Corpus.stdlib(max_bytes=50_000).texts())
    assert sum(len(text.encode()) for _, text in texts) == 50_000
    assert texts[0] == (files[0].name, files[0].read_text(encoding="utf-8")[: len(texts[0][1])])


def test_the_corpus_key_names_the_inputs_and_max_bytes(data: ModuleType) -> None:
    key = data.Corpus.stdlib(max_bytes=50_000).key
    assert key == data.Corpus.stdlib(max_bytes=50_000).key  # stable: attempts share a dataset
    assert key != data.Corpus.stdlib(max_bytes=40_000).key
    assert key != data.Corpus.stdlib().key


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
