"""The TYARD_* environment contract is declared once, in tensoryard/envvars.py: no other
module spells a variable's name in a string, every variable has a type, a default, who sets
it, who reads it and a line of doc, and docs/environment.md is generated from the module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tensoryard
from tensoryard import envvars
from tensoryard.errors import ConfigError

SRC = Path(tensoryard.__file__).parent
REPO = SRC.parent.parent
DOC = REPO / "docs" / "environment.md"
NAME = re.compile(r"^TYARD_[A-Z0-9_]*$")

# Files allowed to spell TYARD_ names (none: every module goes through envvars.py).
NOT_YET_CONVERTED: frozenset[str] = frozenset()


def _literals(path: Path) -> list[tuple[int, str]]:
    """String constants that are a TYARD_ name (or its prefix), and f-strings starting with one.
    Prose that mentions a variable (a docstring, an error's fix) is not a use of it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if NAME.match(node.value):
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if (
                isinstance(head, ast.Constant)
                and isinstance(head.value, str)
                and head.value.startswith("TYARD_")
                and NAME.match(head.value)
            ):
                found.append((node.lineno, head.value + "{...}"))
    return found


def _offenders() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if rel == "envvars.py" or rel in NOT_YET_CONVERTED:
            continue
        hits = _literals(path)
        if hits:
            out[rel] = hits
    return out


def test_no_module_spells_a_tyard_variable_outside_envvars() -> None:
    offenders = _offenders()
    assert not offenders, (
        "TYARD_ names spelled as strings (fix: declare the variable in tensoryard/envvars.py "
        f"and use envvars.NAME.get() / envvars.NAME.name): {offenders}"
    )


def test_the_not_yet_converted_files_still_need_their_exception() -> None:
    for rel in NOT_YET_CONVERTED:
        assert _literals(SRC / rel), f"{rel} has no TYARD_ literal left: drop it from the list"


def test_every_variable_is_declared_fully() -> None:
    for name, var in envvars.VARIABLES.items():
        assert name == var.name and NAME.match(name)
        assert var.kind in {"str", "int", "float", "bool", "path"}, name
        assert var.set_by and var.read_by and var.doc, name
        if var.default is not None:
            assert var.get({}) == var.default, name


def test_the_names_used_anywhere_are_declared() -> None:
    """Every TYARD_ name in the package (converted files or not) is in the contract."""
    declared = set(envvars.VARIABLES) | set(envvars.PREFIXES)
    used = {
        value.removesuffix("{...}")
        for path in SRC.rglob("*.py")
        for _, value in _literals(path)
        if value != envvars.PREFIX
    }
    assert used <= declared, f"undeclared: {sorted(used - declared)}"


def test_a_bad_value_names_the_variable_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"TYARD_HEARTBEAT_S='soon' is not a number.*fix"):
        envvars.HEARTBEAT_S.get({"TYARD_HEARTBEAT_S": "soon"})
    with pytest.raises(ConfigError, match=r"TYARD_CHECKPOINT_INTERVAL=0 is below 1"):
        envvars.CHECKPOINT_INTERVAL.get({"TYARD_CHECKPOINT_INTERVAL": "0"})
    assert envvars.CHECKPOINT_INTERVAL.get({"TYARD_CHECKPOINT_INTERVAL": " 7 "}) == 7
    assert envvars.CHECKPOINT_INTERVAL.get({"TYARD_CHECKPOINT_INTERVAL": "  "}) == 50


def test_the_doc_is_generated_from_the_module() -> None:
    assert DOC.read_text() == envvars.markdown(), (
        "docs/environment.md is stale (fix: python -m tensoryard.envvars --write "
        "docs/environment.md)"
    )


def test_the_doc_command_checks_and_refuses_bad_arguments(tmp_path: Path) -> None:
    stale = tmp_path / "environment.md"
    stale.write_text("old\n")
    assert envvars.main(["--check", str(stale)]) == 1
    assert envvars.main(["--write", str(stale)]) == 0
    assert envvars.main(["--check", str(stale)]) == 0
    assert envvars.main(["--frobnicate"]) == 2
