"""Every import in the package runs downward: a table says which top-level packages each
package may import, and every module's imports are checked against it, deferred imports inside
functions, ``TYPE_CHECKING`` blocks and ``importlib.import_module("tensoryard....")`` included."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensoryard

SRC = Path(tensoryard.__file__).parent

_BASE = frozenset({"errors", "envvars"})

# package -> the packages it may import (besides itself). Read bottom-up: nothing imports a
# package listed after it. docs/architecture.md explains each line.
ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "envvars": frozenset({"errors"}),
    "faults": _BASE,
    "spec": _BASE,
    "runtime": _BASE | {"spec"},
    "data": _BASE,
    "images": _BASE,
    "pipelines": _BASE,
    "scheduler": _BASE | {"spec"},
    "sim": _BASE | {"spec", "scheduler"},
    "store": _BASE | {"spec", "faults"},
    "observability": _BASE | {"runtime"},
    "registry": _BASE | {"spec", "runtime", "store"},
    "api": _BASE | {"store"},
    "agent": _BASE | {"observability"},
    "executors": _BASE | {"spec", "runtime", "images", "faults"},
    "cluster": _BASE | {"spec", "scheduler", "agent", "observability"},
    "client": _BASE,
    "serving": _BASE | {"spec", "api", "executors", "observability", "registry", "store"},
    "console": _BASE | {"spec", "api", "registry", "runtime", "serving", "store"},
    "server": _BASE
    | {
        "spec",
        "faults",
        "runtime",
        "images",
        "pipelines",
        "scheduler",
        "store",
        "observability",
        "registry",
        "api",
        "agent",
        "executors",
        "cluster",
        "serving",
        "console",
    },
    "cli": frozenset(),  # the top: may import anything (filled in below)
}
ALLOWED["cli"] = frozenset(ALLOWED) - {"cli"}

# Imports that break the table, each with its reason (none today; the list only shrinks).
KNOWN_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


def _package(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _module_parts(path: Path) -> list[str]:
    parts = ["tensoryard", *path.relative_to(SRC).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports_of(path: Path, parts: list[str] | None = None) -> Iterator[str]:
    """Every tensoryard module ``path`` imports, wherever in the file the import is."""
    here = parts or _module_parts(path)
    is_init = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + (1 if is_init else 0)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module
            if module == "tensoryard":  # from tensoryard import envvars
                yield from (f"tensoryard.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
        ):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value
            elif isinstance(arg, ast.JoinedStr) and arg.values:
                head = arg.values[0]
                if isinstance(head, ast.Constant) and isinstance(head.value, str):
                    yield head.value.rstrip(".")


def _target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "tensoryard" or len(parts) < 2:
        return None
    name = parts[1]
    exists = (SRC / name).is_dir() or (SRC / f"{name}.py").is_file()
    return name if exists else None  # e.g. tensoryard.__version__


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_every_package_is_in_the_table() -> None:
    packages = {_package(p) for p in _modules()} - {"__init__"}
    assert packages <= set(ALLOWED), f"add {sorted(packages - set(ALLOWED))} to ALLOWED"


def test_the_table_has_no_cycle() -> None:
    done: set[str] = set()

    def visit(pkg: str, path: tuple[str, ...]) -> None:
        assert pkg not in path, f"cycle in ALLOWED: {' -> '.join((*path, pkg))}"
        if pkg in done:
            return
        for dep in ALLOWED[pkg]:
            visit(dep, (*path, pkg))
        done.add(pkg)

    for pkg in ALLOWED:
        visit(pkg, ())


@pytest.mark.parametrize(
    "path", _modules(), ids=lambda p: str(p.relative_to(SRC)).replace("/", ".")
)
def test_imports_run_downward(path: Path) -> None:
    pkg = _package(path)
    if pkg == "__init__":
        return
    rel = str(path.relative_to(SRC))
    bad = sorted(
        module
        for module in set(imports_of(path))
        if (target := _target(module)) is not None
        and target != pkg
        and target not in ALLOWED[pkg]
        and (rel, module) not in KNOWN_EXCEPTIONS
    )
    assert not bad, (
        f"{rel} ({pkg}) imports {bad}; {pkg} may import only {sorted(ALLOWED[pkg])} "
        "(fix: move the shared piece down to a package both may import)"
    )


def test_the_known_exceptions_are_still_needed() -> None:
    for rel, module in KNOWN_EXCEPTIONS:
        assert module in set(imports_of(SRC / rel)), f"drop ({rel}, {module}): it is gone"


def test_a_deferred_upward_import_is_caught(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib\n"
        "def f():\n"
        "    from tensoryard.runtime.megatron import recognise\n"
        "    return importlib.import_module(f'tensoryard.server.{f}')\n"
    )
    found = set(imports_of(probe, parts=["tensoryard", "spec", "probe"]))
    assert {"tensoryard.runtime.megatron", "tensoryard.server"} <= found
