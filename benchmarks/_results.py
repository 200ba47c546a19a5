"""The one writer of benchmarks/RESULTS.md rows: each benchmark owns the row named after it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_results_line(
    name: str, command: str, result: str, goal: str, met: str, *, path: Path = RESULTS
) -> None:
    """Replace (or append) the table row of benchmark `name` in RESULTS.md."""
    line = f"| {name} | {dt.date.today().isoformat()} | `{command}` | {result} | {goal} | {met} |"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for i, existing in enumerate(lines):
        if existing.startswith(f"| {name} |"):
            lines[i] = line
            break
    else:  # append to the first table (the summary), not to a later section's table
        start = next((i for i, x in enumerate(lines) if x.startswith("| benchmark |")), None)
        if start is None:
            lines.append(line)
        else:
            end = start
            while end + 1 < len(lines) and lines[end + 1].startswith("|"):
                end += 1
            lines.insert(end + 1, line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
