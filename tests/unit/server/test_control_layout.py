"""The control loop's parts stay small and their imports run downward: no part imports the
controller facade or a part that imports it back, and neither the scheduler nor the
executors import the control loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tensoryard

SRC = Path(tensoryard.__file__).parent
CONTROL = SRC / "server" / "control"
MAX_LINES = 450


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _parts() -> dict[str, set[str]]:
    """part -> the other parts it imports."""
    prefix = "tensoryard.server.control."
    return {
        path.stem: {m.removeprefix(prefix) for m in _imports(path) if m.startswith(prefix)}
        for path in sorted(CONTROL.glob("*.py"))
    }


@pytest.mark.parametrize(
    "path",
    [SRC / "server" / "controller.py", *sorted(CONTROL.glob("*.py"))],
    ids=lambda p: f"{p.name} is at most {MAX_LINES} lines",
)
def test_each_module_of_the_control_loop_is_small(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_the_parts_import_each_other_without_a_cycle_and_never_the_facade() -> None:
    parts = _parts()
    for path in CONTROL.glob("*.py"):
        assert "tensoryard.server.controller" not in _imports(path), path.name
    done: set[str] = set()

    def visit(part: str, path: tuple[str, ...]) -> None:
        assert part not in path, f"import cycle: {' -> '.join((*path, part))}"
        if part in done:
            return
        for dep in parts.get(part, set()):
            visit(dep, (*path, part))
        done.add(part)

    for part in parts:
        visit(part, ())


def test_neither_the_scheduler_nor_the_executors_import_the_control_loop() -> None:
    for package in ("scheduler", "executors"):
        for path in (SRC / package).rglob("*.py"):
            bad = {
                m
                for m in _imports(path)
                if m.startswith(("tensoryard.server.control", "tensoryard.server.controller"))
            }
            assert not bad, f"{path.relative_to(SRC)} imports {bad}"
