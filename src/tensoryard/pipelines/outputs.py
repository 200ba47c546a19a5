"""What a finished step job leaves for later steps: its outputs.

A step's outputs are, merged in this order (later wins):

1. ``job_id``, ``run_dir`` and ``checkpoint`` (the path of the job's newest checkpoint, when it
   reported one);
2. its final metrics: the last reported value of every metric key of its last attempt, and
   ``step`` (the last step);
3. ``$TYARD_RUN_DIR/outputs.json``, a JSON object of names to strings, numbers, booleans or null
   that the job may write (docs/contracts.md section 1).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tensoryard.errors import FieldIssue, SpecError

__all__ = ["MAX_OUTPUTS_BYTES", "OUTPUTS_FILE", "check_outputs", "read_outputs_file"]

OUTPUTS_FILE = "outputs.json"
MAX_OUTPUTS_BYTES = 64 * 1024
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")


def read_outputs_file(run_dir: Path) -> dict[str, Any]:
    """The job's outputs file ({} when it wrote none); SpecError naming what is wrong."""
    path = run_dir / OUTPUTS_FILE
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise _bad(path, f"cannot read it: {exc.strerror}", "check its permissions") from exc
    if size > MAX_OUTPUTS_BYTES:
        raise _bad(
            path,
            f"it is {size} bytes; at most {MAX_OUTPUTS_BYTES}",
            "write values (paths, numbers), not data; put large results in files",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _bad(path, f"it is not JSON: {exc}", 'write an object like {"ppl": 12.5}') from exc
    return check_outputs(data, str(path))


def check_outputs(data: Any, source: str) -> dict[str, Any]:
    """A mapping of names to scalars, or SpecError."""
    if not isinstance(data, Mapping):
        raise _bad(source, "it is not a JSON object", 'write an object like {"ppl": 12.5}')
    issues = []
    for key, value in data.items():
        if not isinstance(key, str) or not _KEY_RE.match(key):
            issues.append(
                FieldIssue(str(key), "is not an output name", "use letters, digits, '_' and '-'")
            )
        elif not (value is None or isinstance(value, str | int | float | bool)):
            issues.append(
                FieldIssue(key, f"is a {type(value).__name__}", "give a string, number or bool")
            )
        elif isinstance(value, float) and not math.isfinite(value):
            issues.append(FieldIssue(key, f"is {value}", "give a finite number"))
    if issues:
        raise SpecError(issues, source=source)
    return dict(data)


def _bad(source: str | Path, message: str, fix: str) -> SpecError:
    return SpecError([FieldIssue("", message, fix)], source=str(source))
