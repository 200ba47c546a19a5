"""Response models are projections of the store's records: each record field is shown or
named internal, and a model field that is not the record's must be named as added."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from tensoryard.server.schemas import FromRecord, JobOut
from tensoryard.store.records import JobRecord


@dataclass(frozen=True)
class _Rec:
    a: int
    b: str
    secret: str


def test_a_projection_that_names_every_field_is_accepted() -> None:
    class Out(FromRecord, record=_Rec, internal=("secret",), added=("extra",)):
        a: int
        b: str
        extra: int = 0

    assert Out.model_validate(_Rec(1, "x", "s")).model_dump() == {"a": 1, "b": "x", "extra": 0}


def test_a_record_field_neither_shown_nor_internal_fails_the_import() -> None:
    with pytest.raises(TypeError, match=r"_Rec fields \['secret'\] are neither shown nor"):

        class Out(FromRecord, record=_Rec):
            a: int
            b: str


def test_a_field_the_record_lacks_must_be_named_as_added() -> None:
    with pytest.raises(TypeError, match=r"fields \['c'\] are not _Rec's"):

        class Out(FromRecord, record=_Rec, internal=("secret",)):
            a: int
            b: str
            c: int


def test_a_shown_field_listed_as_internal_and_a_misspelt_name_are_refused() -> None:
    with pytest.raises(TypeError, match=r"shown and also listed as internal"):

        class Shown(FromRecord, record=_Rec, internal=("secret", "a")):
            a: int
            b: str

    with pytest.raises(TypeError, match=r"internal/added names \['secrte'\] are wrong"):

        class Typo(FromRecord, record=_Rec, internal=("secret", "secrte")):
            a: int
            b: str


def test_the_job_api_shows_every_job_field_but_the_internal_two() -> None:
    hidden = {f.name for f in dataclasses.fields(JobRecord)} - set(JobOut.model_fields)
    assert hidden == {"run_time_s", "changed_at"}
