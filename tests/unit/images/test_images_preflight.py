"""The pod's image preflight: the versions a container has against the matrix entry's pins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tensoryard import __version__
from tensoryard.images.preflight import CONFIG_EXIT_CODE, EXPECT_ENV, mismatches, observe

PINS = {"name": "cpu", "ref": "r/cpu:1", "torch": "2.13.0", "python": "3.11", "tensoryard": "0.1.0"}
SEEN: dict[str, str | None] = {"python": "3.11.2", "torch": "2.13.0", "tensoryard": "0.1.0"}


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        ({}, []),
        ({"torch": "2.13.0+cu130"}, []),  # the wheel's local label is not another release
        ({"torch": "2.10.0"}, ["torch is 2.10.0, the matrix pins 2.13.0"]),
        ({"torch": None}, ["torch is not installed (the matrix pins 2.13.0)"]),
        ({"python": "3.12.1"}, ["Python is 3.12.1, the matrix pins 3.11"]),
        ({"tensoryard": "0.0.9"}, ["tensoryard is 0.0.9, the control plane is 0.1.0"]),
    ],
)
def test_each_difference_from_the_pins_is_named(
    seen: dict[str, str | None], expected: list[str]
) -> None:
    found = mismatches(PINS, {**SEEN, **seen})
    assert len(found) == len(expected)
    for got, want in zip(found, expected, strict=True):
        assert got.startswith(want)


def test_no_pins_no_check() -> None:
    assert mismatches({}, {"python": "3.9.0", "torch": None, "tensoryard": None}) == []


def run(pins: dict[str, Any] | str, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, EXPECT_ENV: pins if isinstance(pins, str) else json.dumps(pins)}
    return subprocess.run(
        [sys.executable, "-m", "tensoryard.images.preflight", "--", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def here() -> dict[str, Any]:
    seen = observe()
    py = ".".join((seen["python"] or "").split(".")[:2])
    return {"name": "cpu", "ref": "r/cpu:1", "torch": seen["torch"], "python": py}


def test_a_matching_container_runs_the_command_in_its_place() -> None:
    done = run({**here(), "tensoryard": __version__}, sys.executable, "-c", "print('trained')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "trained"


def test_a_mismatch_exits_78_naming_the_difference_and_the_fix_and_runs_nothing() -> None:
    done = run({**here(), "torch": "1.0.0"}, sys.executable, "-c", "print('trained')")
    assert done.returncode == CONFIG_EXIT_CODE
    assert "trained" not in done.stdout
    assert "does not match the matrix entry 'cpu'" in done.stderr
    assert "the matrix pins 1.0.0" in done.stderr and "tyard images build cpu" in done.stderr


def test_malformed_pins_are_a_configuration_error_not_a_traceback() -> None:
    done = run("{not json", "true")
    assert done.returncode == CONFIG_EXIT_CODE
    assert EXPECT_ENV in done.stderr and "Traceback" not in done.stderr
