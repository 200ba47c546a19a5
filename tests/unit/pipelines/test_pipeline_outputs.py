"""A step job's outputs file: an object of names to scalars, or an error saying what is
wrong with it and how to write it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoryard.errors import SpecError
from tensoryard.pipelines.outputs import MAX_OUTPUTS_BYTES, read_outputs_file


def test_a_job_that_wrote_no_file_has_no_file_outputs(tmp_path: Path) -> None:
    assert read_outputs_file(tmp_path) == {}


def test_scalars_are_read_back(tmp_path: Path) -> None:
    (tmp_path / "outputs.json").write_text('{"ppl": 12.5, "path": "/m", "ok": true, "n": null}')
    assert read_outputs_file(tmp_path) == {"ppl": 12.5, "path": "/m", "ok": True, "n": None}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "it is not JSON"),
        ("[1, 2]", "it is not a JSON object"),
        ('{"nested": {"a": 1}}', "nested: is a dict"),
        ('{"bad key": 1}', "bad key: is not an output name"),
        ('{"x": NaN}', "x: is nan"),
        ('{"x": "' + "a" * MAX_OUTPUTS_BYTES + '"}', "at most 65536"),
    ],
    ids=["not JSON", "a list", "a nested value", "a bad name", "not a number", "too large"],
)
def test_a_bad_outputs_file_is_named_with_the_fix(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "outputs.json").write_text(text)
    with pytest.raises(SpecError, match=message) as info:
        read_outputs_file(tmp_path)
    assert "outputs.json" in str(info.value)
