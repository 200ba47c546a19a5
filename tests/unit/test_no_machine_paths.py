"""The project speaks of itself only: no absolute path of the machine it was built on, and no
shared /tmp name in code (per-user private directories instead)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# This file names the patterns it looks for; it is the one exception.
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

MACHINE = re.compile(r"/wor[k]/(main|shared|wt|\.library|\.mirror)\b|/roo[t]/|/home/[a-z][\w-]*/")
SHARED_TMP = re.compile(r"""["'=]/tmp/[A-Za-z]""")  # a fixed name under /tmp, in code


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / name for name in out.decode().split("\0") if name]


def _text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:4096]:
        return None
    return data.decode("utf-8", "replace")


def test_no_file_names_a_path_of_the_build_machine() -> None:
    found = []
    for path in _tracked():
        rel = path.relative_to(ROOT).as_posix()
        text = _text(path) if rel != SELF else None
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if MACHINE.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, "absolute paths of a build machine:\n" + "\n".join(found[:30])


def test_code_uses_no_shared_tmp_names() -> None:
    found = []
    for path in _tracked():
        rel = path.relative_to(ROOT).as_posix()
        if not (rel.startswith(("src/", "scripts/")) and path.suffix in ("", ".py", ".sh")):
            continue
        text = _text(path)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if SHARED_TMP.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, "fixed /tmp names (use a per-user private directory):\n" + "\n".join(found)
