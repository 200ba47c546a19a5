"""A built wheel carries the Alembic migrations, and an installed copy can migrate from them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_a_non_editable_install_ships_and_runs_the_migrations(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="building a wheel offline needs setuptools")
    # Build from a copy so the build leaves nothing behind in the working tree.
    src = tmp_path / "src-copy"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(wheels), str(src)], check=True, capture_output=True)
    [wheel] = wheels.glob("tensoryard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    migrations = "tensoryard/store/migrations/"
    assert f"{migrations}env.py" in names
    assert f"{migrations}script.py.mako" in names
    assert any(n.startswith(f"{migrations}versions/0001_") for n in names)

    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    probe = (
        "import tensoryard.store as s, pathlib, sys;"
        f"assert pathlib.Path(s.__file__).is_relative_to({str(target)!r}), s.__file__;"
        f"st = s.Store.open('sqlite:///{tmp_path}/w.db'); st.ensure_team('t'); print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
