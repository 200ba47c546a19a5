"""Response models as projections of the store's records (docs/contracts.md, Store API)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["FromRecord", "check_projection"]


class FromRecord(BaseModel):
    """Built from a store record with `model_validate(record)` (attributes, not a dict).

    A response model names the record it shows, e.g. ``class JobOut(FromRecord,
    record=JobRecord, internal=("run_time_s", "changed_at"))``. The record declares the
    fields; this class picks which the API shows and how (types, descriptions). Every field
    of the record is either shown here or listed as ``internal``, and every field here is the
    record's or listed as ``added``: otherwise the module fails to import, so a field added
    to a record is a decision about the API, not a silent gap. (Generating these classes from
    the records would leave FastAPI's routes and mypy without static types; this check keeps
    one source of truth.)"""

    model_config = ConfigDict(from_attributes=True)

    def __init_subclass__(
        cls,
        *,
        record: type | None = None,
        internal: tuple[str, ...] = (),
        added: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)

    @classmethod
    def __pydantic_init_subclass__(
        cls,
        *,
        record: type | None = None,
        internal: tuple[str, ...] = (),
        added: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if record is not None:
            check_projection(cls, record, internal, added)


def check_projection(
    model: type[BaseModel], record: type, internal: tuple[str, ...], added: tuple[str, ...]
) -> None:
    """Raise TypeError unless ``model`` shows each field of the dataclass ``record`` or lists
    it in ``internal``, and has no field that is neither the record's nor in ``added``."""
    fields = {f.name for f in dataclasses.fields(record)}
    shown = set(model.model_fields)
    problems = []
    if unknown := sorted((set(internal) - fields) | (set(added) & fields)):
        problems.append(f"internal/added names {unknown} are wrong for {record.__name__}")
    if unshown := sorted(fields - shown - set(internal)):
        problems.append(
            f"{record.__name__} fields {unshown} are neither shown nor listed as internal"
        )
    if extra := sorted(shown - fields - set(added)):
        problems.append(f"fields {extra} are not {record.__name__}'s and not listed as added")
    if both := sorted(shown & set(internal)):
        problems.append(f"fields {both} are shown and also listed as internal")
    if problems:
        raise TypeError(f"{model.__name__}: " + "; ".join(problems))
