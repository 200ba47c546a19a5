"""The trust boundary for paths that come from a job: they stay inside that job's own files.

A job's runtime reports checkpoint paths with its job token, and a member may later promote one
into the artifact store, where every viewer of the team can read it. A path is therefore taken
only when it lies inside the job's own roots (its run directory and its checkpoint root), both
by name (no ``..`` escapes) and, where the control plane can see the file, after symlinks are
resolved. The control plane's own state directory (tokens, keys, secrets, the database) is never
a job root, whatever a spec says, except for the job's own run directory inside it.

See docs/access.md, "Trust model".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tensoryard.errors import Forbidden

__all__ = ["JobPaths", "PathOutsideJob", "protected_overlap"]


class PathOutsideJob(Forbidden):
    """A path from a job (or a spec) that leaves the job's own files; refused and audited."""


def _norm(path: str | Path) -> Path:
    return Path(os.path.normpath(os.fspath(path)))


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def protected_overlap(
    path: str | Path, protected: Sequence[Path], allowed: Path | None = None
) -> Path | None:
    """The protected directory that `path` lies in (by name or after symlinks), unless it also
    lies in `allowed` (the job's run directory); None when it lies in none."""
    for name in (_norm(path), _resolved(path)):
        for guarded in protected:
            for g in {_norm(guarded), _resolved(guarded)}:
                if _under(name, g) and not (allowed is not None and _under(name, _norm(allowed))):
                    return g
    return None


def _resolved(path: str | Path) -> Path:
    try:
        return Path(os.path.realpath(os.fspath(path)))
    except (OSError, ValueError):
        return _norm(path)


@dataclass(frozen=True)
class JobPaths:
    """Where one job's files may be: `roots` (run directory, checkpoint root); never inside
    `protected` (the control plane's state directory) unless inside `run_dir`."""

    job_id: int
    run_dir: Path
    roots: tuple[Path, ...]
    protected: tuple[Path, ...] = ()

    def check(self, path: str, *, what: str = "checkpoint path") -> Path:
        """`path` as a Path when it lies inside the job's roots; PathOutsideJob otherwise.

        Relative paths are taken from the run directory. The name is checked as written (after
        ``..`` is folded) and, when the file exists here, after symlinks are resolved."""
        given = Path(path)
        if "\x00" in path:
            raise self._refuse(path, what, "it contains a NUL byte")
        full = given if given.is_absolute() else self.run_dir / given
        lexical = _norm(full)
        if not any(_under(lexical, _norm(r)) for r in self.roots):
            raise self._refuse(path, what, "it is outside the job's run and checkpoint directories")
        if os.path.lexists(lexical):
            real = _resolved(lexical)
            if not any(_under(real, _resolved(r)) for r in self.roots):
                raise self._refuse(
                    path, what, f"it resolves through a symlink to {real}, outside the job's files"
                )
            lexical = real
        guarded = protected_overlap(lexical, self.protected, self.run_dir)
        if guarded is not None:
            raise self._refuse(path, what, "it lies in the control plane's own state directory")
        return lexical

    def _refuse(self, path: str, what: str, why: str) -> PathOutsideJob:
        roots = ", ".join(str(r) for r in self.roots)
        return PathOutsideJob(
            f"job {self.job_id}: {what} {path!r} refused: {why} (fix: write it under the job's "
            f"own directories: {roots}; docs/access.md, 'Trust model')"
        )
