"""How preflight checks run commands: one small protocol, a real runner, a recorded one.

Checks take a `CommandRunner` argument (production default: `SubprocessRunner`), so tests pass
a `RecordedRunner` holding command outputs captured on real machines (see
tests/unit/cluster/recorded/README.md for where each came from).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["CommandResult", "CommandRunner", "RecordedRunner", "SubprocessRunner"]


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command printed and how it exited (127: not installed)."""

    returncode: int
    stdout: str
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class CommandRunner(Protocol):
    """Runs one command (argv, no shell) and returns its result; never raises for a failure."""

    def __call__(self, argv: Sequence[str]) -> CommandResult: ...


class SubprocessRunner:
    """The real runner: `subprocess.run` with a timeout."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except FileNotFoundError:
            return CommandResult(127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", f"{argv[0]}: timed out after {self.timeout_s:.0f}s")
        return CommandResult(done.returncode, done.stdout, done.stderr)


class RecordedRunner:
    """Answers commands from recorded outputs; a command it does not know is 'not installed'.

    `outputs` maps the command line (argv joined by spaces) to a CommandResult.
    """

    def __init__(self, outputs: Mapping[str, CommandResult]) -> None:
        self.outputs = dict(outputs)
        self.calls: list[str] = []

    @classmethod
    def from_files(cls, folder: str | Path, files: Mapping[str, str]) -> RecordedRunner:
        """Build from `{command line: file name}`; each file holds the command's stdout."""
        root = Path(folder)
        return cls(
            {cmd: CommandResult(0, (root / name).read_text()) for cmd, name in files.items()}
        )

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        line = " ".join(argv)
        self.calls.append(line)
        return self.outputs.get(line, CommandResult(127, "", f"{argv[0]}: command not found"))
