"""Turning ORM rows into the frozen records the store hands out.

Each record's fields are declared once, in `records.py`; a `RowReader` reads each field from the
ORM column of the same name (or the one `columns` names) and converts only where the stored type
differs (a JSON list kept as a tuple, a state string as its enum). A record field without a
column fails at import, not at the first read of a row.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from tensoryard.spec.states import JobState
from tensoryard.store.models import (
    ApiToken,
    Attempt,
    AuditEntry,
    Base,
    Checkpoint,
    Event,
    Job,
    Membership,
    Metric,
    Team,
    User,
)
from tensoryard.store.records import (
    AttemptRecord,
    AuditRecord,
    CheckpointRecord,
    EventRecord,
    JobRecord,
    MemberRecord,
    MetricRecord,
    TeamRecord,
    TokenRecord,
    UserRecord,
)

__all__ = [
    "RowReader",
    "attempt_record",
    "audit_record",
    "checkpoint_record",
    "event_record",
    "job_record",
    "member_record",
    "metric_record",
    "team_record",
    "token_record",
    "user_record",
]

R = TypeVar("R")


class RowReader(Generic[R]):
    """Builds one record type from rows of one ORM model.

    ``columns``: record field -> the model's attribute where the names differ. ``convert``:
    record field -> a function applied to the stored value. ``given``: fields that come from
    elsewhere than the row, passed to the call by keyword."""

    def __init__(
        self,
        record: type[R],
        model: type[Base],
        *,
        columns: Mapping[str, str] | None = None,
        convert: Mapping[str, Callable[[Any], Any]] | None = None,
        given: tuple[str, ...] = (),
    ) -> None:
        names = [f.name for f in dataclasses.fields(record)]  # type: ignore[arg-type]
        columns, convert = columns or {}, convert or {}
        unknown = (set(columns) | set(convert) | set(given)) - set(names)
        if unknown:
            raise TypeError(f"{record.__name__} has no fields {sorted(unknown)}")
        read = [n for n in names if n not in given]
        attrs = [columns.get(n, n) for n in read]
        missing = [a for a in attrs if not hasattr(model, a)]
        if missing:
            raise TypeError(
                f"{model.__name__} has no columns {missing} for {record.__name__} "
                "(add the column and a migration, or map the field with columns=)"
            )
        self._record = record
        self._names = tuple(read)
        self._get = operator.attrgetter(*attrs)
        self._convert = tuple((i, convert[n]) for i, n in enumerate(read) if n in convert)
        self._given = given

    def __call__(self, row: Any, **given: Any) -> R:
        values = list(self._get(row))
        for i, fn in self._convert:
            values[i] = fn(values[i])
        if set(given) != set(self._given):
            raise TypeError(f"{self._record.__name__}: pass exactly {list(self._given)}")
        if not given:
            return self._record(*values)
        return self._record(**dict(zip(self._names, values, strict=True)), **given)


def _or_empty(value: str | None) -> str:
    return value or ""


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value or ())


team_record = RowReader(TeamRecord, Team)
job_record = RowReader(
    JobRecord,
    Job,
    convert={
        "state": JobState,
        "spec": dict,
        "placement": dict,
        "run_time_s": lambda v: v or 0.0,
    },
)
attempt_record = RowReader(
    AttemptRecord,
    Attempt,
    convert={"handle": dict, "attempt_key": _or_empty, "nodes": _tuple},
)
event_record = RowReader(EventRecord, Event, convert={"replica": _or_empty})
metric_record = RowReader(MetricRecord, Metric, convert={"values": dict})
checkpoint_record = RowReader(CheckpointRecord, Checkpoint)
member_record = RowReader(MemberRecord, Membership, columns={"user": "user_name"})
token_record = RowReader(
    TokenRecord, ApiToken, columns={"user": "user_name"}, convert={"scopes": _tuple}
)
audit_record = RowReader(AuditRecord, AuditEntry)
_user_record = RowReader(UserRecord, User, given=("teams",))


def user_record(u: User, teams: dict[str, str]) -> UserRecord:
    return _user_record(u, teams=dict(teams))
