"""Job traces for the simulator: one generic CSV format and loaders for the public traces.

Every loader returns jobs sorted by submit time, with times in seconds from the first submit.
Malformed input raises :class:`TraceError` naming the file, line and column.

Formats:

- generic: ``submit_time_s,duration_s,num_gpus,team`` plus optional ``job_id,priority,gpu_model``.
- philly: ``timestamp,duration,num_gpus,gpu_time,cluster`` (Microsoft Philly; the virtual
  cluster becomes the team; datetimes become seconds from the first submit).
- tiresias: ``job_id,num_gpu,submit_time,iterations,model_name,duration,interval`` (one team).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from tensoryard.errors import ConfigError

__all__ = [
    "GENERIC_COLUMNS",
    "TraceError",
    "TraceJob",
    "load_trace",
    "parse_window",
    "select_window",
]

GENERIC_COLUMNS = ("submit_time_s", "duration_s", "num_gpus", "team")
_PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
_TIRESIAS_COLUMNS = ("job_id", "num_gpu", "submit_time", "duration")
_TEAM_RE = re.compile(r"[^a-z0-9-]+")
MAX_GPUS_PER_JOB = 65_536


class TraceError(ConfigError):
    """A trace file is missing or malformed; the message names the line, column and fix."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace, as the simulator replays it."""

    job_id: str
    submit_time_s: float
    duration_s: float
    num_gpus: int
    team: str
    priority: int = 0
    gpu_model: str | None = None


_Row = dict[str, str]
_RowParser = Callable[[_Row, "_Cell"], TraceJob]


@dataclass(frozen=True)
class _Cell:
    """Reads typed cells from one CSV row, raising TraceError that points at the cell."""

    source: str
    line: int

    def fail(self, column: str, message: str, fix: str) -> TraceError:
        return TraceError(f"{self.source}, line {self.line}, column {column!r}: {message} ({fix})")

    def text(self, row: _Row, column: str) -> str:
        value = (row.get(column) or "").strip()
        if not value:
            raise self.fail(column, "is empty", "give a value in every row")
        return value

    def number(self, row: _Row, column: str, *, minimum: float = 0.0) -> float:
        raw = self.text(row, column)
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(
                column, f"{raw!r} is not a number", "write seconds as a number"
            ) from None
        if not value >= minimum or value == float("inf"):
            raise self.fail(column, f"{raw} is out of range", f"use a finite value >= {minimum:g}")
        return value

    def integer(self, row: _Row, column: str, *, minimum: int, maximum: int) -> int:
        raw = self.text(row, column)
        try:
            value = int(float(raw))
        except ValueError:
            raise self.fail(column, f"{raw!r} is not a whole number", "write an integer") from None
        if float(raw) != value or not minimum <= value <= maximum:
            raise self.fail(
                column, f"{raw} is out of range", f"use a whole number in {minimum}..{maximum}"
            )
        return value


def _team_name(raw: str) -> str:
    """Trace team ids become queue names ('6214e9' -> 'vc-6214e9')."""
    name = _TEAM_RE.sub("-", raw.strip().lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"vc-{name}" if name else "default"
    return name[:63]


def _generic_row(row: _Row, cell: _Cell) -> TraceJob:
    priority = row.get("priority")
    model = (row.get("gpu_model") or "").strip()
    return TraceJob(
        job_id=(row.get("job_id") or "").strip() or f"line-{cell.line}",
        submit_time_s=cell.number(row, "submit_time_s"),
        duration_s=cell.number(row, "duration_s", minimum=1e-9),
        num_gpus=cell.integer(row, "num_gpus", minimum=1, maximum=MAX_GPUS_PER_JOB),
        team=_team_name(cell.text(row, "team")),
        priority=(
            cell.integer(row, "priority", minimum=-1000, maximum=1000)
            if priority and priority.strip()
            else 0
        ),
        gpu_model=model or None,
    )


def _philly_row(row: _Row, cell: _Cell) -> TraceJob:
    raw = cell.text(row, "timestamp")
    try:
        moment = datetime.fromisoformat(raw)
        # Naive times are read as UTC so that no local daylight-saving shift enters the trace.
        submitted = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    except ValueError:
        raise cell.fail(
            "timestamp", f"{raw!r} is not a date-time", "write it like 2017-10-09 07:01:55"
        ) from None
    return TraceJob(
        job_id=f"philly-{cell.line}",
        submit_time_s=submitted,
        duration_s=cell.number(row, "duration", minimum=1e-9),
        num_gpus=cell.integer(row, "num_gpus", minimum=1, maximum=MAX_GPUS_PER_JOB),
        team=_team_name("vc-" + cell.text(row, "cluster")),
    )


def _tiresias_row(row: _Row, cell: _Cell) -> TraceJob:
    return TraceJob(
        job_id=cell.text(row, "job_id"),
        submit_time_s=cell.number(row, "submit_time"),
        duration_s=cell.number(row, "duration", minimum=1e-9),
        num_gpus=cell.integer(row, "num_gpu", minimum=1, maximum=MAX_GPUS_PER_JOB),
        team="default",
    )


_FORMATS: tuple[tuple[str, tuple[str, ...], _RowParser], ...] = (
    ("generic", GENERIC_COLUMNS, _generic_row),
    ("philly", _PHILLY_COLUMNS, _philly_row),
    ("tiresias", _TIRESIAS_COLUMNS, _tiresias_row),
)


def _detect(header: Sequence[str], source: str) -> _RowParser:
    present = {name.strip() for name in header}
    for _name, columns, parser in _FORMATS:
        if set(columns) <= present:
            return parser
    raise TraceError(
        f"{source}, line 1: unknown trace header {','.join(header)!r} (use the generic columns "
        f"{','.join(GENERIC_COLUMNS)} with optional job_id,priority,gpu_model, or a Philly or "
        "Tiresias trace)"
    )


def _rows(path: Path) -> Iterator[tuple[int, list[str], _Row]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror} (check the path)") from exc
    with handle:
        reader = csv.reader(handle)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise TraceError(f"{path}: the trace is empty (write a header line)") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}, line 1: unreadable CSV: {exc}") from exc
        yield 1, header, {}
        try:
            for values in reader:
                line = reader.line_num
                if not values or all(not v.strip() for v in values):
                    continue
                if len(values) != len(header):
                    raise TraceError(
                        f"{path}, line {line}: {len(values)} fields, the header has "
                        f"{len(header)} (fix the row or quote commas)"
                    )
                yield line, header, dict(zip(header, values, strict=True))
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}, line {reader.line_num}: unreadable CSV: {exc}") from exc


def load_trace(path: str | Path) -> list[TraceJob]:
    """Read a trace file of any supported format, sorted by submit time, starting at 0 s."""
    file = Path(path)
    rows = _rows(file)
    _, header, _ = next(rows)
    parser = _detect(header, str(file))
    jobs = [parser(row, _Cell(str(file), line)) for line, _, row in rows]
    if not jobs:
        raise TraceError(f"{file}: the trace has a header but no jobs (add rows)")
    jobs.sort(key=lambda j: j.submit_time_s)  # stable: equal times keep file order
    return _rebase(jobs)


def _rebase(jobs: list[TraceJob]) -> list[TraceJob]:
    origin = jobs[0].submit_time_s
    if origin == 0.0:
        return jobs
    return [replace(j, submit_time_s=j.submit_time_s - origin) for j in jobs]


_WINDOW_RE = re.compile(r"^\s*(\d*)\s*:\s*(\d*)\s*$")


def parse_window(text: str) -> tuple[int, int | None]:
    """'20000:25000' -> (20000, 25000): a contiguous slice of jobs in submit order."""
    match = _WINDOW_RE.match(text)
    if not match:
        raise ConfigError(
            f"window {text!r} is not START:END (fix: give job indices like 20000:25000)"
        )
    start = int(match.group(1) or 0)
    end = int(match.group(2)) if match.group(2) else None
    if end is not None and end <= start:
        raise ConfigError(f"window {text!r} is empty (fix: END must be larger than START)")
    return start, end


def select_window(
    jobs: list[TraceJob], *, start: int = 0, end: int | None = None
) -> list[TraceJob]:
    """Jobs ``start..end`` in submit order, with times rebased to the window's first submit."""
    picked = jobs[start:end]
    if not picked:
        raise ConfigError(
            f"the window {start}:{end if end is not None else ''} selects no jobs; the trace has "
            f"{len(jobs)} (fix: choose a window inside it)"
        )
    return _rebase(picked)
