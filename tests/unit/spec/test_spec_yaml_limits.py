"""The spec reader refuses YAML that would eat memory or CPU, with a SpecError, quickly."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from tensoryard.errors import SpecError
from tensoryard.spec._common import MAX_SPEC_BYTES, load_yaml_text
from tensoryard.spec.job import load_job_spec


def _billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for prev, name in itertools.pairwise(names[: levels + 1]):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_billion_laughs(), "expands to more than"),
        ("a: &a [*a]\n", "recursive alias"),
        ("[" * 50_000 + "]" * 50_000, "levels deep"),
        ("- " * 50_000 + "x", "nested too deeply"),
        ("x: " + "y" * (MAX_SPEC_BYTES + 1), "at most"),
        ("a: !!python/object/apply:os.system ['true']\n", "malformed YAML"),
        ("name: a\x1f\n", "control character U\\+001F at character 8"),
    ],
    ids=[
        "a billion laughs",
        "a recursive alias",
        "50k levels of flow nesting",
        "50k levels of block nesting",
        "a document over the size limit",
        "a python object tag",
        "a control character (the API's spec_yaml, found by the fuzzer)",
    ],
)
def test_hostile_yaml_is_a_spec_error_within_a_second(text: str, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(SpecError, match=message):
        load_yaml_text(text, source="bomb.yaml")
    assert time.monotonic() - start < 1.0


def test_ordinary_anchors_still_work() -> None:
    data = load_yaml_text("base: &env {A: '1'}\nenv: *env\n")
    assert data == {"base": {"A": "1"}, "env": {"A": "1"}}


def test_a_huge_spec_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    with path.open("wb") as fh:
        fh.truncate(MAX_SPEC_BYTES * 50)
    with pytest.raises(SpecError, match="a spec may be at most"):
        load_job_spec(path)


def test_a_binary_spec_file_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_job_spec(path)
