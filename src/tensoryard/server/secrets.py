"""Team secrets, referenced by name from job specs and injected into a job at launch.

A spec never holds a secret's value: `secrets: {HF_TOKEN: hf-token}` names the secret
`hf-token` of the job's team, and the control plane puts its value into the job's environment
when it launches an attempt. The API lists names only and redacts every environment value.

The embedded store keeps each value in a file of its own under `$TYARD_HOME/secrets/TEAM/`
(directories 0700, files 0600, written atomically); replicas of the control plane share it
through `--home`. Cluster executors map the same references to their own secret objects.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tensoryard.errors import FieldIssue, NotFound, SpecError
from tensoryard.spec.job import NAME_PATTERN

__all__ = ["MAX_SECRET_BYTES", "SecretStore"]

MAX_SECRET_BYTES = 64 * 1024


class SecretStore:
    """Secret values on disk, one file per (team, name)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, team: str, name: str) -> Path:
        for field, value in (("team", team), ("name", name)):
            if not re.match(NAME_PATTERN, value):  # also keeps every path inside the root
                raise SpecError(
                    [
                        FieldIssue(
                            field,
                            f"{value!r} is not a valid secret {field}",
                            "use lowercase letters, digits and '-' (start with a letter)",
                        )
                    ]
                )
        return self.root / team / name

    def put(self, team: str, name: str, value: str) -> None:
        """Create or replace a secret."""
        if len(value.encode()) > MAX_SECRET_BYTES:
            raise SpecError(
                [FieldIssue("value", "is larger than 64 KiB", "store a smaller secret")]
            )
        path = self._path(team, name)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(value)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def get(self, team: str, name: str) -> str:
        """A secret's value; NotFound names the fix."""
        try:
            return self._path(team, name).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise NotFound(
                f"team {team!r} has no secret {name!r} (fix: tyard secrets set {team} {name})"
            ) from None

    def names(self, team: str) -> list[str]:
        """The names of a team's secrets, sorted."""
        folder = self._path(team, "x").parent
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))

    def delete(self, team: str, name: str) -> None:
        """Remove a secret; NotFound when it does not exist."""
        try:
            self._path(team, name).unlink()
        except FileNotFoundError:
            raise NotFound(f"team {team!r} has no secret {name!r}") from None

    def resolve(self, team: str, refs: dict[str, str]) -> dict[str, str]:
        """Environment variable -> value for a job's `secrets` references."""
        return {env: self.get(team, name) for env, name in refs.items()}
