"""Registry references resolve to a GGUF file pulled once from the artifact store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoryard.errors import SpecError
from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.serving.source import parse_model_source
from tensoryard.serving.weights import RegistryWeights
from tensoryard.store import Store


def _register(store: Store, artifacts: ArtifactStore, src: Path, model: str, **kw: object) -> int:
    pushed = artifacts.push(src)
    v = store.register_version(
        "default",
        model,
        artifact=pushed.manifest.digest,
        size_bytes=pushed.manifest.total_bytes,
        created_by="admin",
        **kw,  # type: ignore[arg-type]
    )
    return v.version


def test_an_alias_resolves_to_the_pulled_gguf_and_the_cache_is_reused(
    sqlite_store: Store, tmp_path: Path
) -> None:
    sqlite_store.ensure_team("default")
    artifacts = ArtifactStore(open_blobs(str(tmp_path / "artifacts")))
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    _register(sqlite_store, artifacts, model, "tiny", aliases=["prod"])
    weights = RegistryWeights(sqlite_store, artifacts, tmp_path / "cache")
    first = weights.resolve("default", parse_model_source("tiny@prod"))
    assert first.path.read_bytes() == model.read_bytes()
    assert first.ref == "tiny@prod (version 1)"
    again = weights.resolve("default", parse_model_source("tiny:1"))
    assert again.path == first.path and again.pull_s == 0.0
    latest = weights.resolve("default", parse_model_source("tiny"))
    assert latest.path == first.path


def test_unknown_models_aliases_and_non_gguf_versions_name_the_field(
    sqlite_store: Store, tmp_path: Path
) -> None:
    sqlite_store.ensure_team("default")
    artifacts = ArtifactStore(open_blobs(str(tmp_path / "artifacts")))
    weights = RegistryWeights(sqlite_store, artifacts, tmp_path / "cache")
    with pytest.raises(SpecError) as info:
        weights.resolve("default", parse_model_source("nope@prod"))
    assert info.value.issues[0].path == "model"
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "a.gguf").write_bytes(b"GGUF1")
    (folder / "b.gguf").write_bytes(b"GGUF2")
    _register(sqlite_store, artifacts, folder, "two")
    with pytest.raises(SpecError, match=r"2 \.gguf files"):
        weights.resolve("default", parse_model_source("two:1"))
    with pytest.raises(SpecError, match="model"):
        weights.resolve("default", parse_model_source("two@missing"))
