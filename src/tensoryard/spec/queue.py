"""QueueSpec and CohortSpec: how a shared cluster is divided among teams.

A queue belongs to one team. It owns a *nominal* quota of GPUs per GPU model (and optionally
CPU cores), may lend what it does not use to the other queues of its cohort (up to
``lending_limit``) and may borrow their unused quota (up to ``borrowing_limit``). Cohorts may
nest: a cohort with a ``parent`` lends and borrows inside its parent the same way.

A quota file is either a list of queues (cohorts they name are created as top-level cohorts) or
a mapping ``{queues: [...], cohorts: [...]}``; in the second form every cohort must be declared.

    queues:
      - {name: nlp, cohort: research, nominal: {H100: 16}, weight: 2, lending_limit: 8}
      - {name: vision, cohort: research, nominal: {H100: 16}, borrowing_limit: 16}
    cohorts:
      - {name: research}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from tensoryard.errors import ConfigError, FieldIssue, SpecError
from tensoryard.spec._common import (
    StrictModel,
    load_yaml_text,
    read_spec_file,
    spec_error_from_validation,
)

__all__ = [
    "CPU_RESOURCE",
    "CohortSpec",
    "QueueSpec",
    "QuotaConfig",
    "load_quota_config",
    "parse_quota_config",
]

NAME_PATTERN = r"^[a-z][a-z0-9-]{0,62}$"
MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
CPU_RESOURCE = "cpu"
"""Resource name under which CPU cores are accounted (GPU models use their own names)."""

MAX_QUOTA = 1_000_000

Limit = int | dict[str, int] | None


def _check_quota_map(value: dict[str, int], what: str) -> dict[str, int]:
    for model, amount in value.items():
        if model == CPU_RESOURCE:
            raise ValueError(
                f"{what} uses the reserved name 'cpu' as a GPU model "
                "(fix: give CPU cores in the 'cpu' field instead)"
            )
        if amount < 0:
            raise ValueError(f"{what} for {model} is {amount} (fix: use 0 or a positive number)")
        if amount > MAX_QUOTA:
            raise ValueError(f"{what} for {model} is {amount} (fix: use at most {MAX_QUOTA})")
    return value


def _check_limit(value: Limit, what: str) -> Limit:
    if value is None:
        return None
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} is {value} (fix: use 0 or a positive number, or omit it)")
        return value
    return _check_quota_map(value, what)


def _limit_for(limit: Limit, model: str) -> int | None:
    if limit is None or isinstance(limit, int):
        return limit
    return limit.get(model)


class _QuotaOwner(StrictModel):
    """Fields shared by queues and cohorts."""

    nominal: dict[str, int] = Field(
        default_factory=dict, description="GPUs owned per GPU model, like {H100: 16}."
    )
    cpu: float | None = Field(
        None, ge=0, description="CPU cores owned; omit for no CPU quota (capacity only)."
    )
    borrowing_limit: Limit = Field(
        None,
        description="Most GPUs borrowed above nominal: one number for every model or a "
        "mapping per model; omit for no limit.",
    )
    lending_limit: Limit = Field(
        None,
        description="Most unused GPUs lent to the cohort: one number or a mapping per model; "
        "omit to lend everything unused.",
    )

    @field_validator("nominal")
    @classmethod
    def _nominal_ok(cls, value: dict[str, int]) -> dict[str, int]:
        return _check_quota_map(value, "nominal quota")

    @field_validator("borrowing_limit")
    @classmethod
    def _borrow_ok(cls, value: Limit) -> Limit:
        return _check_limit(value, "borrowing_limit")

    @field_validator("lending_limit")
    @classmethod
    def _lend_ok(cls, value: Limit) -> Limit:
        return _check_limit(value, "lending_limit")

    @model_validator(mode="after")
    def _lend_at_most_owned(self) -> _QuotaOwner:
        if isinstance(self.lending_limit, dict):
            for model, amount in self.lending_limit.items():
                owned = self.nominal.get(model, 0)
                if amount > owned:
                    raise ValueError(
                        f"lending_limit for {model} is {amount} but only {owned} are owned "
                        f"(fix: lend at most {owned})"
                    )
        elif isinstance(self.lending_limit, int):
            for model, owned in self.nominal.items():
                if self.lending_limit > owned:
                    raise ValueError(
                        f"lending_limit is {self.lending_limit} but only {owned} {model} are "
                        f"owned (fix: lend at most {owned}, or give a limit per model)"
                    )
        return self

    def borrowing_limit_for(self, model: str) -> int | None:
        """Most GPUs of `model` borrowed above nominal (None: unlimited)."""
        return _limit_for(self.borrowing_limit, model)

    def lending_limit_for(self, model: str) -> int | None:
        """Most unused GPUs of `model` lent out (None: everything unused)."""
        return _limit_for(self.lending_limit, model)


class QueueSpec(_QuotaOwner):
    """One team's queue: nominal quota per GPU model, fair-share weight, cohort membership."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Queue name (usually the team).")
    cohort: str | None = Field(
        None, pattern=NAME_PATTERN, description="Cohort whose queues lend to each other."
    )
    weight: float = Field(1.0, gt=0, le=1000, description="Fair-share weight (higher: more).")


class CohortSpec(_QuotaOwner):
    """A group of queues (and child cohorts) that lend unused quota to each other."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Cohort name.")
    parent: str | None = Field(
        None, pattern=NAME_PATTERN, description="Enclosing cohort, for nested cohorts."
    )


@dataclass(frozen=True, eq=False)
class QuotaConfig:
    """A validated set of queues and cohorts: names unique, cohorts known, no cycles.

    Build it with :meth:`build`; the scheduler trusts it afterwards.
    """

    queues: tuple[QueueSpec, ...]
    cohorts: tuple[CohortSpec, ...] = ()
    _by_name: Mapping[str, QueueSpec] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        queues: Iterable[QueueSpec],
        cohorts: Iterable[CohortSpec] | None = None,
    ) -> QuotaConfig:
        """Validate queues and cohorts together; raises ConfigError naming the fix.

        With ``cohorts=None`` every cohort a queue names is created as a top-level cohort;
        with an explicit list, a queue or cohort naming an undeclared cohort is an error.
        """
        queue_list = tuple(queues)
        cohort_list = _implicit_cohorts(queue_list) if cohorts is None else tuple(cohorts)
        _check_unique(queue_list, cohort_list)
        _check_references(queue_list, cohort_list)
        _check_no_cycles(cohort_list)
        by_name = {q.name: q for q in queue_list}
        return cls(queues=queue_list, cohorts=cohort_list, _by_name=by_name)

    def queue(self, name: str) -> QueueSpec | None:
        """The queue called `name`, or None."""
        return self._by_name.get(name)

    @property
    def gpu_models(self) -> tuple[str, ...]:
        """Every GPU model any queue or cohort has quota for, in first-seen order."""
        seen: dict[str, None] = {}
        for owner in (*self.queues, *self.cohorts):
            for model in owner.nominal:
                seen.setdefault(model, None)
        return tuple(seen)


def _implicit_cohorts(queues: tuple[QueueSpec, ...]) -> tuple[CohortSpec, ...]:
    names = dict.fromkeys(q.cohort for q in queues if q.cohort)
    return tuple(CohortSpec(name=n) for n in names if n)


def _check_unique(queues: tuple[QueueSpec, ...], cohorts: tuple[CohortSpec, ...]) -> None:
    seen: set[str] = set()
    for kind, name in [("queue", q.name) for q in queues] + [("cohort", c.name) for c in cohorts]:
        if name in seen:
            raise ConfigError(
                f"{kind} name {name!r} is used twice (fix: queue and cohort names must be unique)"
            )
        seen.add(name)


def _check_references(queues: tuple[QueueSpec, ...], cohorts: tuple[CohortSpec, ...]) -> None:
    known = {c.name for c in cohorts}
    for q in queues:
        if q.cohort is not None and q.cohort not in known:
            raise ConfigError(
                f"queue {q.name!r} is in cohort {q.cohort!r}, which is not declared "
                f"(fix: add '- name: {q.cohort}' under cohorts, or correct the name)"
            )
    for c in cohorts:
        if c.parent is not None and c.parent not in known:
            raise ConfigError(
                f"cohort {c.name!r} has parent {c.parent!r}, which is not declared "
                f"(fix: declare cohort {c.parent!r} or remove the parent)"
            )


def _check_no_cycles(cohorts: tuple[CohortSpec, ...]) -> None:
    parent = {c.name: c.parent for c in cohorts}
    for start in parent:
        path = [start]
        node = parent[start]
        while node is not None:
            if node in path:
                loop = " -> ".join([*path[path.index(node) :], node])
                raise ConfigError(
                    f"cohorts form a cycle: {loop} (fix: remove the parent of one of them)"
                )
            path.append(node)
            node = parent.get(node)


def parse_quota_config(data: Any, *, source: str = "") -> QuotaConfig:
    """Validate a list of queues, or a mapping with `queues` and `cohorts`, into a QuotaConfig."""
    if isinstance(data, list):
        raw_queues, raw_cohorts = data, None
    elif isinstance(data, dict) and "queues" in data:
        unknown = set(data) - {"queues", "cohorts"}
        if unknown:
            raise SpecError(
                [FieldIssue(sorted(unknown)[0], "unknown section", "use 'queues' and 'cohorts'")],
                source=source,
            )
        raw_queues, raw_cohorts = data["queues"], data.get("cohorts") or []
    else:
        raise SpecError(
            [
                FieldIssue(
                    "",
                    "a quota file must be a list of queues or a mapping with 'queues'",
                    "start with '- name: my-team' or 'queues:'",
                )
            ],
            source=source,
        )
    queues = [
        _parse_one(QueueSpec, item, f"queues.{i}", source)
        for i, item in enumerate(raw_queues or [])
    ]
    cohorts = None
    if raw_cohorts is not None:
        cohorts = [
            _parse_one(CohortSpec, item, f"cohorts.{i}", source)
            for i, item in enumerate(raw_cohorts)
        ]
    try:
        return QuotaConfig.build(queues, cohorts)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}" if source else str(exc)) from exc


def _parse_one(
    model: type[QueueSpec] | type[CohortSpec], item: Any, where: str, source: str
) -> Any:
    try:
        return model.model_validate(item)
    except ValidationError as exc:
        error = spec_error_from_validation(exc, source=source)
        issues = [
            FieldIssue(f"{where}.{i.path}".rstrip("."), i.message, i.fix) for i in error.issues
        ]
        raise SpecError(issues, source=source) from exc


def load_quota_config(path: str | Path) -> QuotaConfig:
    """Read a YAML or JSON quota file (see the module docstring) into a QuotaConfig."""
    file = Path(path)
    text = read_spec_file(file)
    if file.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(
                [FieldIssue("", f"malformed JSON at line {exc.lineno}: {exc.msg}", "fix the JSON")],
                source=str(file),
            ) from exc
    else:
        data = load_yaml_text(text, source=str(file))
    return parse_quota_config(data, source=str(file))
