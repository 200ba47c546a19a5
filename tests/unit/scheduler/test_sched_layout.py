"""The scheduler's modules stay small and their imports run downward: each imports only the
modules listed before it in LAYERS (and, outside the package, only ``spec`` and ``errors``),
and the concern modules change a cycle's state only through its parts' methods."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tensoryard

PACKAGE = Path(tensoryard.__file__).parent / "scheduler"
PREFIX = "tensoryard.scheduler"
MAX_LINES = 450

# lowest first: a module may import only modules before it
LAYERS = [
    "model",
    "config",
    "capacity",
    "quota",
    "estimates",
    "accounting",
    "convert",
    "state",
    "pending",
    "entry",
    "views",
    "ledger",
    "cycle_state",
    "admission",
    "placement",
    "victims",
    "ordering",
    "preemption",
    "reservation",
    "defrag",
    "core",
    "__init__",
]
ALLOWED_OUTSIDE = ("tensoryard.spec", "tensoryard.errors")


def _modules() -> list[Path]:
    return sorted(PACKAGE.glob("*.py"))


def _imports(path: Path) -> set[str]:
    """Modules `path` imports (``from pkg import mod`` counts as ``pkg.mod`` too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_every_module_has_a_layer() -> None:
    assert sorted(p.stem for p in _modules()) == sorted(LAYERS)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: f"{p.name} is at most {MAX_LINES} lines")
def test_each_module_is_small(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("path", _modules(), ids=lambda p: f"{p.name} imports downward")
def test_imports_run_downward(path: Path) -> None:
    below = set(LAYERS[: LAYERS.index(path.stem)])
    for module in _imports(path):
        if module.startswith(f"{PREFIX}."):
            name = module.removeprefix(f"{PREFIX}.").split(".")[0]
            if (PACKAGE / f"{name}.py").exists():
                assert name in below, f"{path.name} imports {name}, which is not below it"
        elif module.startswith("tensoryard") and module != PREFIX:
            assert module.startswith(ALLOWED_OUTSIDE), f"{path.name} imports {module}"


# A write to a field of the cycle state (`st.part.field = ...`, `st.part.field[k] = ...`,
# `st.part.field.append(...)`), of a queue line or of an entry, outside the module that
# defines it.
_WRITE = re.compile(
    r"\b(st|line|entry)\.[a-z_]+(\.[a-z_]+)*(\[[^]]*\])*\s*[-+|]?=(?!=)"
    r"|\b(st|line|entry)(\.[a-z_]+)+\.(append|add|setdefault|update|pop|extend|clear)\("
)
_OWNERS = {"cycle_state", "views", "ledger", "entry"}


@pytest.mark.parametrize(
    "path",
    [p for p in _modules() if p.stem not in _OWNERS],
    ids=lambda p: f"{p.name} changes the cycle state only through methods",
)
def test_concern_modules_do_not_assign_cycle_state_fields(path: Path) -> None:
    writes = [line.strip() for line in path.read_text().splitlines() if _WRITE.search(line)]
    assert not writes, f"{path.name}: {writes}"
