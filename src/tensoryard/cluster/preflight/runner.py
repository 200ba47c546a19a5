"""How preflight checks run commands: one small protocol, a real runner, a recorded one.

Checks take a `CommandRunner` argument (production default: `SubprocessRunner`), so tests pass
a `RecordedRunner` holding command outputs captured on real machines (see
tests/unit/cluster/recorded/README.md for where each came from).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "CommandResult",
    "CommandRunner",
    "RecordedRunner",
    "RecordingRunner",
    "SubprocessRunner",
]


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

    @classmethod
    def from_record(cls, folder: str | Path) -> RecordedRunner:
        """Replay what a `RecordingRunner` wrote into `folder` (exit codes and stderr too)."""
        root = Path(folder)
        index = json.loads((root / INDEX).read_text(encoding="utf-8"))
        return cls(
            {
                cmd: CommandResult(
                    int(entry["returncode"]),
                    (root / entry["stdout"]).read_text(encoding="utf-8"),
                    str(entry.get("stderr", "")),
                )
                for cmd, entry in index["commands"].items()
            }
        )

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        line = " ".join(argv)
        self.calls.append(line)
        return self.outputs.get(line, CommandResult(127, "", f"{argv[0]}: command not found"))


INDEX = "commands.json"


class RecordingRunner:
    """Runs commands with another runner and keeps what they printed in `folder`: one file
    per command plus commands.json (command line -> exit code, stderr, stdout file), which
    `RecordedRunner.from_record` replays. `tyard cluster preflight --record DIR` uses it, so
    a failing node's outputs can be attached to a report or turned into a test."""

    def __init__(self, folder: str | Path, inner: CommandRunner | None = None) -> None:
        self.folder = Path(folder)
        self.inner: CommandRunner = inner or SubprocessRunner()
        self.index: dict[str, dict[str, object]] = {}
        self.folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        line = " ".join(argv)
        result = self.inner(argv)
        if line not in self.index:
            name = f"{len(self.index):02d}-{_slug(argv)}.txt"
            (self.folder / name).write_text(result.stdout, encoding="utf-8")
            self.index[line] = {
                "returncode": result.returncode,
                "stderr": result.stderr,
                "stdout": name,
            }
            (self.folder / INDEX).write_text(
                json.dumps({"commands": self.index}, indent=1) + "\n", encoding="utf-8"
            )
        return result


def _slug(argv: Sequence[str]) -> str:
    words = [a.lstrip("-").split("=")[0] for a in argv[:3]]
    return "-".join(w for w in ("".join(c if c.isalnum() else "_" for c in w) for w in words) if w)
