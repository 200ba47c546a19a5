"""One declaration per row shape: records are read from ORM rows by field name, so a record
field without a column is an import-time error naming the fix, not a silent default."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from tensoryard.spec.states import JobState
from tensoryard.store._rows import (
    RowReader,
    _user_record,
    job_record,
    token_record,
    user_record,
)
from tensoryard.store.models import ApiToken, Job, User


@dataclass(frozen=True)
class _Short:
    name: str
    not_a_column: int


def test_a_record_field_without_a_column_is_refused_naming_the_fix() -> None:
    with pytest.raises(TypeError, match=r"User has no columns \['not_a_column'\].*migration"):
        RowReader(_Short, User)


def test_a_conversion_for_a_field_the_record_lacks_is_refused() -> None:
    with pytest.raises(TypeError, match=r"_Short has no fields \['nme'\]"):
        RowReader(_Short, User, convert={"nme": str}, given=("not_a_column",))


def test_fields_given_by_the_caller_must_all_be_passed() -> None:
    user = User(
        name="ada",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        platform_admin=False,
        description="",
    )
    with pytest.raises(TypeError, match=r"UserRecord: pass exactly \['teams'\]"):
        _user_record(user)
    assert user_record(user, {"ml": "member"}).teams == {"ml": "member"}


def test_rows_become_records_with_their_stored_types_converted() -> None:
    now = datetime(2026, 12, 6, 12, tzinfo=UTC)
    row = Job(
        id=7,
        name="train",
        team="ml",
        user="ada",
        priority=0,
        state="PENDING",
        spec={"name": "train"},
        created_at=now,
        updated_at=now,
        admitted_at=None,
        started_at=None,
        finished_at=None,
        attempts=0,
        restarts=0,
        reason="",
        pending_reason="waiting",
        pending_eta=None,
        cancel_requested=False,
        run_dir="runs/7",
        placement={},
        last_heartbeat=None,
        run_time_s=None,
        changed_at=now,
    )
    rec = job_record(row)
    assert rec.state is JobState.PENDING
    assert rec.run_time_s == 0.0
    assert rec.spec == {"name": "train"} and rec.spec is not row.spec  # a copy, not the row's
    token = ApiToken(
        id="t1",
        user_name="ada",
        name="laptop",
        scopes=["read", "write"],
        created_at=now,
        expires_at=None,
        revoked_at=None,
        last_used_at=None,
    )
    got = token_record(token)
    assert got.user == "ada" and got.scopes == ("read", "write")
