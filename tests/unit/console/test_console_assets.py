"""The console's shipped files are its sources (no build step): every module they import is in
the package, the wheel's package data takes every file, and nothing is fetched from elsewhere."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from tensoryard.console import STATIC, load_assets

REPO = Path(__file__).resolve().parents[3]
IMPORT = re.compile(
    r"""(?:\bimport\s*\(\s*|\bimport\s+|\bfrom\s+)["']([^"']+)["']"""
)  # `import "x"`, `... from "x"`, `import("x")`
URL = re.compile(r"https?://[^\s\"'`)]+")
ALLOWED_URLS = {"http://www.w3.org/2000/svg"}  # the SVG namespace name, never fetched


def _files() -> list[Path]:
    return sorted(p for p in STATIC.rglob("*") if p.is_file())


def _imports(path: Path) -> set[Path]:
    out = set()
    for target in IMPORT.findall(path.read_text()):
        assert target.startswith("."), f"{path.name} imports {target!r} from outside the package"
        found = (path.parent / target).resolve()
        assert found.is_file(), f"{path.name}: {target} is missing"
        out.add(found)
    return out


def test_every_module_resolves_inside_the_package_and_is_reachable_from_the_page() -> None:
    index = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="/ui/([^"]+)"', index)
    for ref in refs:
        assert (STATIC / ref).is_file(), f"index.html references missing /ui/{ref}"
    reached: set[Path] = set()
    todo = [(STATIC / "app.js").resolve()]
    while todo:
        path = todo.pop()
        if path not in reached:
            reached.add(path)
            todo += _imports(path)
    modules = {p.resolve() for p in _files() if p.suffix == ".js"}
    assert reached == modules, f"not used by the page: {sorted(p.name for p in modules - reached)}"
    preloaded = re.findall(r'rel="modulepreload" href="/ui/([^"]+)"', index)
    assert "pages/queue.js" in preloaded  # the landing page draws without an import waterfall


def test_nothing_is_fetched_from_another_origin_and_nothing_runs_inline() -> None:
    for path in _files():
        urls = set(URL.findall(path.read_text())) - ALLOWED_URLS
        assert not urls, f"{path.name} refers to {urls}"
    index = (STATIC / "index.html").read_text()
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", index) is None  # CSP: script-src 'self'
    assert "<style" not in index and "style=" not in index


def test_the_wheel_takes_every_console_file() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["tensoryard"]
    package = STATIC.parents[1]
    for path in _files():
        rel = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not package data"


def test_every_file_is_served_with_a_gzip_copy_and_a_content_type() -> None:
    assets = load_assets()
    assert set(assets) == {p.relative_to(STATIC).as_posix() for p in _files()}
    assert assets["app.js"].media_type.startswith("text/javascript")
    assert assets["style.css"].media_type.startswith("text/css")
    assert all(len(a.gzipped) < max(len(a.body), 200) for a in assets.values())
