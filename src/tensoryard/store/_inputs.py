"""Checking and normalising what callers hand the store (fields, metric rows, cursors)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from tensoryard.errors import FieldIssue, SpecError

__all__ = [
    "JOB_FIELDS",
    "as_utc",
    "clean_job_fields",
    "decode_cursor",
    "encode_cursor",
    "metric_rows",
    "token_hash",
]

# Job fields that transition() and update_job() may set besides the state.
JOB_FIELDS: Final = frozenset({"pending_reason", "pending_eta", "placement", "last_heartbeat"})


def clean_job_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Check settable job fields; datetimes become aware UTC (naive ones are taken as UTC)."""
    unknown = sorted(set(fields) - JOB_FIELDS)
    if unknown:
        settable = ", ".join(sorted(JOB_FIELDS))
        raise TypeError(f"cannot set job field(s) {', '.join(unknown)}; settable: {settable}")
    clean = dict(fields)
    if "placement" in clean:
        if not isinstance(clean["placement"], dict):
            raise TypeError("placement must be a dict of node -> GPU indices")
        clean["placement"] = dict(clean["placement"])
    for key in ("pending_eta", "last_heartbeat"):
        if clean.get(key) is not None:
            if not isinstance(clean[key], datetime):
                raise TypeError(f"{key} must be a datetime or None")
            clean[key] = as_utc(clean[key])
    if "pending_reason" in clean and not isinstance(clean["pending_reason"], str):
        raise TypeError("pending_reason must be a string")
    return clean


def metric_rows(
    job_id: int, attempt: int, rows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Validate and de-duplicate rows (the first row of a step wins, as in the database)."""
    out: dict[int, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        try:
            step = int(row["step"])
            ts = float(row["ts"])
            step_time = row.get("step_time_s")
            values = {str(k): float(v) for k, v in (row.get("values") or {}).items()}
            parsed = {
                "job_id": job_id,
                "attempt": attempt,
                "step": step,
                "ts": ts,
                "step_time_s": None if step_time is None else float(step_time),
                "values": values,
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SpecError(
                [
                    FieldIssue(
                        f"metrics.{i}",
                        f"bad metric row {dict(row)!r}: {exc}",
                        "send {'step': int, 'ts': float, 'step_time_s': float|null, "
                        "'values': {name: number}}",
                    )
                ]
            ) from exc
        out.setdefault(step, parsed)
    # Sorted, so concurrent overlapping inserts take row locks in one order (no deadlock).
    return [out[step] for step in sorted(out)]


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def as_utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def encode_cursor(last_id: int, newest_first: bool) -> str:
    raw = json.dumps({"after": last_id, "desc": newest_first}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, newest_first: bool) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        after, desc = data["after"], data["desc"]
        if not isinstance(after, int) or isinstance(after, bool) or desc is not newest_first:
            raise ValueError("cursor belongs to another listing")
        return after
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise SpecError(
            [
                FieldIssue(
                    "cursor",
                    f"{cursor!r} is not a cursor of this listing",
                    "pass the next_cursor of the previous page with the same ordering, "
                    "or none for the first page",
                )
            ]
        ) from exc
