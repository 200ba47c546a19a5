"""The one writer of benchmarks/RESULTS.md rows: each benchmark owns the row named after it,
and the command line that ends in that row (`benchmark_main`); with the pieces the launch
benchmarks share: what a run records of itself (`provenance`), polling (`wait`) and the ranks'
start markers (`started_at`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def provenance(script: str) -> dict[str, str]:
    """The command, commit, date and machine of this run, and the load average as it ends."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=RESULTS.parent,
        capture_output=True,
        text=True,
    )
    return {
        "command": f"python benchmarks/{script} " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "commit": done.stdout.strip() or "unknown",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "load_average": " / ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def wait(check: Callable[[], Any], timeout: float, what: str, every: float = 0.02) -> Any:
    """Poll `check` until it returns something true; RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


def started_at(out: Path, ranks: int) -> float | None:
    """When the last of `ranks` ranks started: the time each wrote to `out/rank-R` (None: not
    all have)."""
    files = [out / f"rank-{r}" for r in range(ranks)]
    if not all(f.exists() for f in files):
        return None
    return max(float(f.read_text()) for f in files)


def write_results_line(
    name: str,
    command: str,
    result: str,
    goal: str,
    met: str,
    *,
    date: str | None = None,
    path: Path = RESULTS,
) -> None:
    """Replace (or append) the table row of benchmark `name` in RESULTS.md; `date`: the day the
    run was made (default today)."""
    day = date or dt.date.today().isoformat()
    line = f"| {name} | {day} | `{command}` | {result} | {goal} | {met} |"
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


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """One private temporary directory for everything a run makes with `tempfile` (homes,
    manifests, run directories), removed when the run ends, whatever happened."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    before, tempfile.tempdir = tempfile.tempdir, str(root)
    try:
        yield root
    finally:
        tempfile.tempdir = before
        shutil.rmtree(root, ignore_errors=True)


def benchmark_main(
    name: str,
    doc: str | None,
    goal: str,
    measure: Callable[[argparse.Namespace], dict[str, Any]],
    summary: Callable[[dict[str, Any]], tuple[str, str]],
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None,
    *,
    needs_root: str | None = None,
    json_name: Callable[[argparse.Namespace], str] | None = None,
    row_name: Callable[[dict[str, Any]], str] | None = None,
) -> None:
    """The command line of a benchmark: measure and keep the JSON under benchmarks/results/,
    or rebuild the row from that JSON (`--row-from-json`); then write its RESULTS.md row, dated
    the day of the run. `needs_root`: why measuring needs root, refused without it.
    `json_name`: the JSON file's name for these arguments (default `name`), for a benchmark
    with variants that keep their own file; `row_name`: the row's name for a result (default
    `name`), for a variant with its own row."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="the run's JSON (default benchmarks/results/<name>.json, committed)",
    )
    parser.add_argument("--no-results-line", action="store_true", help="leave RESULTS.md alone")
    parser.add_argument(
        "--row-from-json",
        action="store_true",
        help="measure nothing: write the RESULTS.md row from the JSON file of an earlier run",
    )
    args = parser.parse_args()
    if args.json is None:
        stem = json_name(args) if json_name else name
        args.json = Path(__file__).resolve().parent / "results" / f"{stem}.json"
    if args.row_from_json:
        result = json.loads(args.json.read_text())
    else:
        if needs_root and os.geteuid() != 0:
            parser.error(needs_root)
        result = measure(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    text, met = summary(result)
    print(text)
    if not args.no_results_line:
        row = row_name(result) if row_name else name
        day = str(result.get("date", ""))[:10] or None
        write_results_line(row, result["command"], text, goal, met, date=day)
