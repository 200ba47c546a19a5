"""Checkpoint format detection and the Hugging Face layout check (real files, no torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoryard.errors import DataError, SpecError
from tensoryard.registry.hf import check_hf_layout
from tensoryard.registry.service import data_manifest_hash, detect_format, lineage_from_spec


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["step-1/state.pt", "step-1/rng.pt"], "state-dict"),
        (["dcp/.metadata", "dcp/__0_0.distcp"], "dcp"),
        (["iter/metadata.json", "iter/common.pt", "iter/0.distcp.bin"], "megatron-dist"),
        (["hf/config.json", "hf/model.safetensors", "hf/tokenizer.json"], "hf"),
        (["shards/model-00001.safetensors"], "safetensors"),
        (["misc/notes.txt"], "files"),
    ],
    ids=["a tensoryard checkpoint", "a DCP directory", "a Megatron dist checkpoint",
         "a Hugging Face directory", "safetensors shards", "anything else"],
)  # fmt: skip
def test_the_format_of_a_checkpoint_directory_is_detected(
    tmp_path: Path, files: list[str], expected: str
) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert detect_format(tmp_path / files[0].split("/")[0]) == expected


def test_a_single_file_is_detected_by_its_suffix(tmp_path: Path) -> None:
    for name, expected in (("m.safetensors", "safetensors"), ("m.pt", "state-dict")):
        (tmp_path / name).write_bytes(b"x")
        assert detect_format(tmp_path / name) == expected


def test_an_incomplete_hugging_face_directory_names_every_missing_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SpecError) as err:
        check_hf_layout(tmp_path)
    assert [i.path for i in err.value.issues] == ["model.safetensors", "tokenizer.json"]


def test_lineage_comes_from_the_job_env() -> None:
    spec = {"env": {"TYARD_CODE_REVISION": "abc", "TYARD_DATA_MANIFEST": "b3:ff"}}
    assert lineage_from_spec(spec) == {"code_revision": "abc", "data_manifest": "b3:ff"}
    assert lineage_from_spec({}) == {"code_revision": "", "data_manifest": ""}


def test_a_dataset_directory_is_recorded_by_the_hash_of_its_manifest(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text('{"format": "tensoryard-tokens"}')
    first = data_manifest_hash(tmp_path / "data")
    (tmp_path / "data" / "manifest.json").write_text('{"format": "tensoryard-tokens", "x": 1}')

    assert first.startswith("blake3:") and len(first) == len("blake3:") + 64
    assert data_manifest_hash(tmp_path / "data") != first
    with pytest.raises(DataError, match="cannot read the dataset manifest"):
        data_manifest_hash(tmp_path / "nowhere")
