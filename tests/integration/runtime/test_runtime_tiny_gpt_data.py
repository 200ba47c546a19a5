"""The tiny_gpt example's data preparation on real files: the standard library's source
snapshotted and prepared with `tensoryard.data.prepare`, once, atomically, one preparer at a
time."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

import tensoryard.data.preparation as preparation
from tensoryard.data import open_dataset
from tensoryard.errors import DataError
from tensoryard.runtime.dist import DistContext

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_gpt"
SMALL = 60_000  # bytes of text: a few standard-library files, prepared in milliseconds


@pytest.fixture(scope="module")
def data() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_gpt_example_data", EXAMPLE / "data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def expected_tokens(files: list[Path], max_bytes: int) -> np.ndarray:
    """The files' bytes in order, cut at max_bytes, each document followed by EOS (256)."""
    parts, left = [], max_bytes
    for path in files:
        chunk = path.read_bytes()[:left]
        left -= len(chunk)
        if chunk:
            parts += [np.frombuffer(chunk, dtype=np.uint8).astype(np.uint16), np.array([256])]
        if left == 0:
            break
    return np.concatenate(parts).astype(np.uint16)


def read_all(path: Path) -> np.ndarray:
    ds = open_dataset(path)
    try:
        return np.array(ds.read(0, ds.num_tokens))
    finally:
        ds.close()


def test_the_dataset_holds_the_sorted_standard_library_bytes(
    data: ModuleType, tmp_path: Path
) -> None:
    corpus = data.Corpus.stdlib(max_bytes=SMALL)
    result = data.prepare_corpus(corpus, tmp_path)
    assert not result.up_to_date
    assert result.manifest.tokenizer["name"] == "byte"
    files = data.stdlib_sources()
    assert files == sorted(files) and all(f.suffix == ".py" for f in files)
    assert np.array_equal(read_all(result.out_dir), expected_tokens(files, SMALL))


def test_preparing_again_finds_the_dataset_up_to_date_and_unchanged(
    data: ModuleType, tmp_path: Path
) -> None:
    corpus = data.Corpus.stdlib(max_bytes=SMALL)
    first = data.prepare_corpus(corpus, tmp_path)
    manifest = (first.out_dir / "manifest.json").read_bytes()
    again = data.prepare_corpus(corpus, tmp_path)
    assert again.up_to_date and again.out_dir == first.out_dir
    assert (again.out_dir / "manifest.json").read_bytes() == manifest


def test_another_max_bytes_gets_its_own_dataset_beside_the_first(
    data: ModuleType, tmp_path: Path
) -> None:
    small = data.prepare_corpus(data.Corpus.stdlib(max_bytes=SMALL), tmp_path)
    smaller = data.prepare_corpus(data.Corpus.stdlib(max_bytes=SMALL // 2), tmp_path)
    assert small.out_dir != smaller.out_dir
    assert (small.manifest.num_tokens, smaller.manifest.num_tokens) != (0, 0)
    assert small.manifest.dataset_id != smaller.manifest.dataset_id
    assert (small.out_dir / "manifest.json").is_file()  # the first one is left alone


def test_a_preparation_killed_before_its_manifest_never_looks_complete_and_resumes(
    data: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = data.Corpus.stdlib(max_bytes=SMALL)

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # the worst moment: every shard written, no manifest yet

    monkeypatch.setattr(preparation, "write_dataset_metadata", killed)
    with pytest.raises(KeyboardInterrupt):
        data.prepare_corpus(corpus, tmp_path)
    out_dir = tmp_path / f"stdlib-{corpus.key}"
    assert any(out_dir.glob("shard-*.tok"))
    with pytest.raises(DataError):
        open_dataset(out_dir)  # shards without a manifest are not a dataset
    monkeypatch.undo()
    result = data.prepare_corpus(corpus, tmp_path)
    assert not result.up_to_date and result.resumed_shards == 1  # kept, verified by hash
    assert np.array_equal(read_all(out_dir), expected_tokens(data.stdlib_sources(), SMALL))


def test_concurrent_preparers_take_turns_and_exactly_one_prepares(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from data import Corpus, prepare_corpus;"
        "r = prepare_corpus(Corpus.stdlib(), Path(sys.argv[2]));"
        "print('up-to-date' if r.up_to_date else 'prepared', r.out_dir)"
    )
    command = [sys.executable, "-c", script, str(EXAMPLE), str(tmp_path)]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    words = sorted(out.split()[0] for out, _ in outputs)
    assert words == ["prepared", "up-to-date"]
    assert len({out.split()[1] for out, _ in outputs}) == 1


def test_ensure_dataset_names_the_prepared_directory_on_a_single_process(
    data: ModuleType, tmp_path: Path
) -> None:
    single = DistContext(0, 1, 0, 1, torch.device("cpu"), None)
    corpus = data.Corpus.stdlib(max_bytes=SMALL)
    path = data.ensure_dataset(corpus, tmp_path / "data", single)
    assert path == tmp_path / "data" / f"stdlib-{corpus.key}"
    assert (path / "manifest.json").is_file()


def test_a_data_dir_that_cannot_be_created_is_a_clear_error(
    data: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(DataError, match=r"cannot prepare the training data in .*--data-dir"):
        data.prepare_corpus(data.Corpus.stdlib(max_bytes=SMALL), tmp_path / "file" / "data")


def test_the_default_data_dir_sits_beside_the_job_run_dir(data: ModuleType, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "job-7"
    found = data.default_data_dir({"TYARD_RUN_DIR": str(run_dir)})
    assert found == tmp_path / "runs" / "data" / "tiny-gpt-stdlib"
