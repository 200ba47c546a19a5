"""The first thing a training pod of a matrix image runs: does the image hold what the control
plane's matrix promises?

A job names its image by matrix name (``image: cpu``); the control plane resolves it to
REGISTRY/NAME:VERSION and tells the pod what that entry pins (``TYARD_IMAGE_EXPECT``: torch,
Python, tensoryard). The tag may hold something else: an image built from an older matrix and
pushed under the same tag, or one derived from ours with another torch installed over it.
Training would then start and fail later in an obscure way (or, worse, run with other numerics).
This check compares the versions the container really has (package metadata only: torch is
not imported, so it costs a Python start) and, on a mismatch, exits with ``CONFIG_EXIT_CODE``
and a message naming each difference and the fix, written to the pod's termination message
(``tyard describe`` shows it). The control plane does not restart an attempt that exited so:
the next one would find the same image.

Otherwise it replaces itself with the command (``python -m tensoryard.images.preflight --
torchrun ...``). Imports: the standard library and ``tensoryard.envvars`` (itself
standard library only).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from tensoryard import envvars

__all__ = ["CONFIG_EXIT_CODE", "EXPECT_ENV", "main", "mismatches", "observe"]

EXPECT_ENV = envvars.IMAGE_EXPECT.name
# sysexits.h EX_CONFIG: the job's configuration is wrong; running it again cannot help.
CONFIG_EXIT_CODE = 78
TERMINATION_LOG = "/dev/termination-log"


def _version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def observe() -> dict[str, str | None]:
    """The versions this container has."""
    return {
        "python": platform.python_version(),
        "torch": _version_of("torch"),
        "tensoryard": _version_of("tensoryard"),
    }


def _base(version: str) -> str:
    """2.13.0+cu130 -> 2.13.0 (the local label names the wheel's CUDA build, not the release)."""
    return version.split("+", 1)[0]


def mismatches(expect: Mapping[str, Any], seen: Mapping[str, str | None]) -> list[str]:
    """Each way `seen` differs from what the matrix entry `expect` pins."""
    out = []
    torch = expect.get("torch")
    if torch:
        got = seen.get("torch")
        if got is None:
            out.append(f"torch is not installed (the matrix pins {torch})")
        elif _base(got) != _base(str(torch)):
            out.append(f"torch is {got}, the matrix pins {torch}")
    python = expect.get("python")
    got_python = seen.get("python") or ""
    if python and got_python.split(".")[:2] != str(python).split(".")[:2]:
        out.append(f"Python is {got_python}, the matrix pins {python}")
    ours = expect.get("tensoryard")
    got_ours = seen.get("tensoryard")
    if ours and got_ours != ours:
        out.append(
            f"tensoryard is {got_ours or 'not installed'}, the control plane is {ours} (its "
            "reports and checkpoints must match)"
        )
    return out


def message(expect: Mapping[str, Any], problems: Sequence[str]) -> str:
    name = expect.get("name", "?")
    ref = expect.get("ref", name)
    return (
        f"image {ref} does not match the matrix entry {name!r}: {'; '.join(problems)} (fix: "
        f"build and push the image from this matrix, `tyard images build {name}` then `tyard "
        f"images push {name} REGISTRY`, or name another image by its full reference)"
    )


def _tell(text: str) -> None:
    print(f"tensoryard: {text}", file=sys.stderr, flush=True)
    if not os.path.exists(TERMINATION_LOG):
        return  # not in a pod: stderr carries it (never create the file elsewhere)
    try:  # the pod's termination message: what the kubelet reports when the container ends
        with open(TERMINATION_LOG, "w") as f:
            f.write(text[:4000])
    except OSError:
        pass  # not writable: the kubelet falls back to the log's end (FallbackToLogsOnError)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: python -m tensoryard.images.preflight -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    raw = os.environ.get(EXPECT_ENV, "")
    try:
        expect = json.loads(raw) if raw else {}
    except ValueError:
        expect = None
    if not isinstance(expect, dict):
        _tell(f"{EXPECT_ENV} is not a JSON object: {raw[:200]!r} (set by the control plane)")
        return CONFIG_EXIT_CODE
    problems = mismatches(expect, observe())
    if problems:
        _tell(message(expect, problems))
        return CONFIG_EXIT_CODE
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        print(f"tensoryard: cannot run {args[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover (execvp does not return)


if __name__ == "__main__":
    sys.exit(main())
