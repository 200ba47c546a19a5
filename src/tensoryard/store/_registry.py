"""The model registry's rows: models per team, immutable versions with lineage, tags, aliases.

A mixin of :class:`tensoryard.store.Store` (same transactions, clock and error translation).
Registering a version is one transaction: the model (created on first use), the version row
with its lineage, its tags and its aliases land together or not at all. The artifact bytes are
pushed to the artifact store *before* (content-addressed and idempotent), so a failed
registration leaves at most unreferenced chunks, which GC collects.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tensoryard.errors import FieldIssue, NotFound, SpecError
from tensoryard.spec.job import NAME_PATTERN
from tensoryard.store._rows import RowReader
from tensoryard.store.models import Checkpoint, Job, Model, ModelAlias, ModelTag, ModelVersion, Team
from tensoryard.store.records import AuditContext

if TYPE_CHECKING:
    from tensoryard.store.models import AuditEntry

__all__ = [
    "ModelRecord",
    "ModelVersionRecord",
    "RegistryMixin",
    "VersionLineage",
    "version_payload",
]

_NAME = re.compile(NAME_PATTERN)
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
FORMATS = ("state-dict", "dcp", "megatron-dist", "safetensors", "hf", "files")
SOURCES = ("checkpoint", "files", "hf-import")
MAX_TAG_VALUE = 256


@dataclass(frozen=True)
class ModelVersionRecord:
    team: str
    model: str
    version: int
    artifact: str
    size_bytes: int
    format: str
    source: str
    job_id: int | None
    checkpoint_step: int | None
    spec: dict[str, Any] | None
    code_revision: str
    data_manifest: str
    parent: str | None  # "model:version" in the same team
    metrics: dict[str, Any]
    description: str
    created_at: datetime
    created_by: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.team}/{self.model}:{self.version}"


@dataclass(frozen=True)
class ModelRecord:
    team: str
    name: str
    description: str
    created_at: datetime
    created_by: str
    latest_version: int | None
    aliases: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class VersionLineage:
    """How a version was made (its ancestors, nearest first) and what was made from it."""

    version: ModelVersionRecord
    ancestors: tuple[ModelVersionRecord, ...]
    children: tuple[ModelVersionRecord, ...]


class RegistryMixin:
    """Models, versions, tags, aliases and lineage. Needs ``_tx``, ``_now`` and ``_audit``."""

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

        def _audit(
            self,
            s: Session,
            audit: AuditContext | None,
            action: str,
            obj: str,
            *,
            outcome: str = "ok",
            detail: str = "",
        ) -> AuditEntry | None: ...

        def _enqueue_event(self, s: Session, event: str, payload: dict[str, Any]) -> None: ...

    # -- models ------------------------------------------------------------------------------

    def list_models(self, teams: list[str] | None = None) -> list[ModelRecord]:
        """Models of ``teams`` (None: every team), by team and name."""
        query = select(Model).order_by(Model.team, Model.name)
        if teams is not None:
            query = query.where(Model.team.in_(teams))
        with self._tx("list models", write=False) as s:
            return [_model_record(s, m) for m in s.scalars(query)]

    def get_model(self, team: str, name: str) -> ModelRecord:
        with self._tx(f"read model {team}/{name}", write=False) as s:
            return _model_record(s, _model(s, team, name))

    # -- versions ----------------------------------------------------------------------------

    def register_version(
        self,
        team: str,
        model: str,
        *,
        artifact: str,
        size_bytes: int,
        created_by: str,
        format: str = "files",
        source: str = "files",
        job_id: int | None = None,
        checkpoint_step: int | None = None,
        spec: dict[str, Any] | None = None,
        code_revision: str = "",
        data_manifest: str = "",
        parent: str | None = None,
        metrics: dict[str, Any] | None = None,
        description: str = "",
        tags: dict[str, str] | None = None,
        aliases: list[str] | None = None,
        audit: AuditContext | None = None,
    ) -> ModelVersionRecord:
        """Add the next version of ``team/model`` (creating the model on first use).

        ``parent`` is ``VERSION`` of the same model or ``MODEL:VERSION`` of the same team.
        Everything is checked before anything is written; one transaction writes it all."""
        _check_register(team, model, artifact, format, source, tags or {}, aliases or [])
        with self._tx(f"register a version of {team}/{model}", write=True) as s:
            if s.get(Team, team) is None:
                raise NotFound(f"team {team!r} does not exist (fix: `tyard teams create {team}`)")
            row = self._ensure_model(s, team, model, created_by)
            if job_id is not None and s.get(Job, job_id) is None:
                raise NotFound(f"job {job_id} does not exist (fix: pass the id of a real job)")
            parent_row = _parent(s, team, model, parent) if parent else None
            latest = s.scalar(
                select(func.max(ModelVersion.version)).where(ModelVersion.model_id == row.id)
            )
            version = ModelVersion(
                model_id=row.id,
                version=(latest or 0) + 1,
                artifact=artifact,
                size_bytes=size_bytes,
                format=format,
                source=source,
                job_id=job_id,
                checkpoint_step=checkpoint_step,
                spec=spec,
                code_revision=code_revision,
                data_manifest=data_manifest,
                parent_id=parent_row.id if parent_row else None,
                metrics=dict(metrics or {}),
                description=description,
                created_at=self._now(),
                created_by=created_by,
            )
            s.add(version)
            s.flush()
            for key, value in (tags or {}).items():
                s.add(ModelTag(version_id=version.id, key=key, value=value))
            for alias in aliases or []:
                _point_alias(s, row.id, alias, version.id, self._now())
            s.flush()
            self._audit(
                s,
                audit,
                "model.register",
                f"model/{team}/{model}:{version.version}",
                detail=f"artifact={artifact}",
            )
            record = _version_record(s, version, team, model)
            self._enqueue_event(s, "model.version.created", version_payload(record))
            for alias in aliases or []:
                self._enqueue_event(
                    s, "model.alias.moved", _alias_payload(team, model, alias, record.version)
                )
            return record

    def _ensure_model(self, s: Session, team: str, name: str, created_by: str) -> Model:
        query = select(Model).where(Model.team == team, Model.name == name).with_for_update()
        row = s.scalars(query).first()
        if row is None:
            row = Model(
                team=team,
                name=name,
                description="",
                created_at=self._now(),
                created_by=created_by,
            )
            s.add(row)
            s.flush()
        return row

    def get_version(self, team: str, model: str, ref: str | int) -> ModelVersionRecord:
        """A version by number, or by alias (``production``)."""
        with self._tx(f"read {team}/{model}:{ref}", write=False) as s:
            row = _model(s, team, model)
            return _version_record(s, _resolve(s, row, ref), team, model)

    def list_versions(self, team: str, model: str) -> list[ModelVersionRecord]:
        with self._tx(f"list versions of {team}/{model}", write=False) as s:
            row = _model(s, team, model)
            query = (
                select(ModelVersion)
                .where(ModelVersion.model_id == row.id)
                .order_by(ModelVersion.version)
            )
            return [_version_record(s, v, team, model) for v in s.scalars(query)]

    def set_alias(
        self,
        team: str,
        model: str,
        alias: str,
        version: int,
        *,
        audit: AuditContext | None = None,
    ) -> ModelVersionRecord:
        """Point ``alias`` at ``version`` (moving it from wherever it was) in one transaction."""
        _check_alias(alias, "alias")
        with self._tx(f"move alias {alias} of {team}/{model}", write=True) as s:
            row = _model(s, team, model, lock=True)
            target = _by_number(s, row, version)
            _point_alias(s, row.id, alias, target.id, self._now())
            s.flush()
            obj = f"model/{team}/{model}@{alias}"
            self._audit(s, audit, "model.alias", obj, detail=f"-> {version}")
            payload = _alias_payload(team, model, alias, version)
            self._enqueue_event(s, "model.alias.moved", payload)
            return _version_record(s, target, team, model)

    def delete_alias(
        self, team: str, model: str, alias: str, *, audit: AuditContext | None = None
    ) -> None:
        with self._tx(f"delete alias {alias} of {team}/{model}", write=True) as s:
            row = _model(s, team, model, lock=True)
            found = s.get(ModelAlias, (row.id, alias))
            if found is None:
                raise NotFound(f"{team}/{model} has no alias {alias!r}")
            s.delete(found)
            self._audit(s, audit, "model.alias", f"model/{team}/{model}@{alias}", detail="deleted")
            self._enqueue_event(
                s, "model.alias.deleted", {"team": team, "model": model, "alias": alias}
            )

    def set_tags(
        self,
        team: str,
        model: str,
        version: int,
        tags: dict[str, str],
        *,
        remove: list[str] | None = None,
        audit: AuditContext | None = None,
    ) -> ModelVersionRecord:
        """Add or change tags (and drop ``remove``) on a version."""
        _raise(_tag_issues(tags))
        with self._tx(f"tag {team}/{model}:{version}", write=True) as s:
            row = _model(s, team, model, lock=True)
            target = _by_number(s, row, version)
            for key in remove or []:
                found = s.get(ModelTag, (target.id, key))
                if found is not None:
                    s.delete(found)
            for key, value in tags.items():
                found = s.get(ModelTag, (target.id, key))
                if found is None:
                    s.add(ModelTag(version_id=target.id, key=key, value=value))
                else:
                    found.value = value
            s.flush()
            self._audit(s, audit, "model.tag", f"model/{team}/{model}:{version}")
            record = _version_record(s, target, team, model)
            self._enqueue_event(
                s,
                "model.version.tagged",
                {"team": team, "model": model, "version": version, "tags": record.tags},
            )
            return record

    # -- lineage -----------------------------------------------------------------------------

    def find_versions(
        self,
        *,
        teams: list[str] | None = None,
        job_id: int | None = None,
        data_manifest: str | None = None,
        artifact: str | None = None,
        tag: tuple[str, str] | None = None,
    ) -> list[ModelVersionRecord]:
        """Versions made by a job, from a dataset, holding an artifact or carrying a tag."""
        query = select(ModelVersion, Model).join(Model, Model.id == ModelVersion.model_id)
        if teams is not None:
            query = query.where(Model.team.in_(teams))
        if job_id is not None:
            query = query.where(ModelVersion.job_id == job_id)
        if data_manifest is not None:
            query = query.where(ModelVersion.data_manifest == data_manifest)
        if artifact is not None:
            query = query.where(ModelVersion.artifact == artifact)
        if tag is not None:
            query = query.join(ModelTag, ModelTag.version_id == ModelVersion.id).where(
                ModelTag.key == tag[0], ModelTag.value == tag[1]
            )
        query = query.order_by(Model.team, Model.name, ModelVersion.version)
        with self._tx("find model versions", write=False) as s:
            return [_version_record(s, v, m.team, m.name) for v, m in s.execute(query).all()]

    def lineage(self, team: str, model: str, ref: str | int) -> VersionLineage:
        """A version, its ancestors (parent first) and the versions derived from it."""
        with self._tx(f"read the lineage of {team}/{model}:{ref}", write=False) as s:
            row = _model(s, team, model)
            target = _resolve(s, row, ref)
            ancestors = []
            seen = {target.id}
            current = target
            while current.parent_id is not None and current.parent_id not in seen:
                parent = s.get(ModelVersion, current.parent_id)
                if parent is None:
                    break
                seen.add(parent.id)
                ancestors.append(_version_record_any(s, parent))
                current = parent
            kids = s.scalars(
                select(ModelVersion)
                .where(ModelVersion.parent_id == target.id)
                .order_by(ModelVersion.id)
            )
            return VersionLineage(
                version=_version_record(s, target, team, model),
                ancestors=tuple(ancestors),
                children=tuple(_version_record_any(s, k) for k in kids),
            )

    def forget_checkpoints(self, job_id: int, checkpoints: list[tuple[int, str]]) -> int:
        """Delete the rows of a job's checkpoints given as (step, path); returns how many."""
        removed = 0
        with self._tx(f"forget checkpoints of job {job_id}", write=True) as s:
            for step, path in checkpoints:
                row = s.scalars(
                    select(Checkpoint).where(
                        Checkpoint.job_id == job_id,
                        Checkpoint.step == step,
                        Checkpoint.path == path,
                    )
                ).first()
                if row is not None:
                    s.delete(row)
                    removed += 1
        return removed

    def registry_artifacts(self) -> set[str]:
        """Every artifact digest a version references: the roots of artifact GC."""
        with self._tx("list registry artifacts", write=False) as s:
            return set(s.scalars(select(ModelVersion.artifact).distinct()))


# -- helpers ---------------------------------------------------------------------------------


def version_payload(v: ModelVersionRecord) -> dict[str, Any]:
    """The JSON data of a ``model.version.created`` event: the version without its spec."""
    data = {k: val for k, val in v.__dict__.items() if k != "spec"}
    data["created_at"] = v.created_at.isoformat()
    data["aliases"] = list(v.aliases)
    return data


def _alias_payload(team: str, model: str, alias: str, version: int) -> dict[str, Any]:
    return {"team": team, "model": model, "alias": alias, "version": version}


def _model(s: Session, team: str, name: str, *, lock: bool = False) -> Model:
    query = select(Model).where(Model.team == team, Model.name == name)
    if lock:
        query = query.with_for_update()
    row = s.scalars(query).first()
    if row is None:
        raise NotFound(
            f"model {team}/{name} does not exist (fix: `tyard models list --team {team}`; a "
            "model is created by registering its first version)"
        )
    return row


def _by_number(s: Session, model: Model, version: int) -> ModelVersion:
    row = s.scalars(
        select(ModelVersion).where(
            ModelVersion.model_id == model.id, ModelVersion.version == version
        )
    ).first()
    if row is None:
        latest = s.scalar(
            select(func.max(ModelVersion.version)).where(ModelVersion.model_id == model.id)
        )
        raise NotFound(
            f"{model.team}/{model.name} has no version {version} (its versions are 1.."
            f"{latest or 0}; fix: `tyard models show {model.team}/{model.name}`)"
        )
    return row


def _resolve(s: Session, model: Model, ref: str | int) -> ModelVersion:
    if isinstance(ref, int) or str(ref).isdigit():
        return _by_number(s, model, int(ref))
    alias = s.get(ModelAlias, (model.id, str(ref)))
    if alias is None:
        raise NotFound(
            f"{model.team}/{model.name} has no alias {ref!r} (fix: use a version number or "
            f"set it: `tyard models alias {model.team}/{model.name} {ref} VERSION`)"
        )
    return s.get(ModelVersion, alias.version_id)  # type: ignore[return-value]


def _parent(s: Session, team: str, model: str, parent: str) -> ModelVersion:
    name, _, number = parent.rpartition(":")
    name = name or model
    if not number.isdigit():
        raise SpecError(
            [FieldIssue("parent", f"{parent!r} is not a version", "write VERSION or MODEL:VERSION")]
        )
    return _by_number(s, _model(s, team, name), int(number))


def _point_alias(s: Session, model_id: int, alias: str, version_id: int, now: datetime) -> None:
    found = s.get(ModelAlias, (model_id, alias))
    if found is None:
        s.add(ModelAlias(model_id=model_id, alias=alias, version_id=version_id, updated_at=now))
    else:
        found.version_id = version_id
        found.updated_at = now


def _model_record(s: Session, m: Model) -> ModelRecord:
    latest = s.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.model_id == m.id))
    aliases = {
        a: v
        for a, v in s.execute(
            select(ModelAlias.alias, ModelVersion.version)
            .join(ModelVersion, ModelVersion.id == ModelAlias.version_id)
            .where(ModelAlias.model_id == m.id)
            .order_by(ModelAlias.alias)
        ).all()
    }
    return _model_row(m, latest_version=latest, aliases=aliases)


def _version_record_any(s: Session, v: ModelVersion) -> ModelVersionRecord:
    m = s.get(Model, v.model_id)
    assert m is not None
    return _version_record(s, v, m.team, m.name)


def _version_record(s: Session, v: ModelVersion, team: str, model: str) -> ModelVersionRecord:
    rows = s.execute(
        select(ModelTag.key, ModelTag.value)
        .where(ModelTag.version_id == v.id)
        .order_by(ModelTag.key)
    ).all()
    tags = {str(k): str(value) for k, value in rows}
    aliases = tuple(
        s.scalars(
            select(ModelAlias.alias).where(ModelAlias.version_id == v.id).order_by(ModelAlias.alias)
        )
    )
    parent = None
    if v.parent_id is not None:
        p = s.get(ModelVersion, v.parent_id)
        pm = s.get(Model, p.model_id) if p else None
        parent = f"{pm.name}:{p.version}" if p and pm else None
    return _version_row(v, team=team, model=model, parent=parent, tags=tags, aliases=aliases)


def _check_alias(alias: str, path: str) -> list[FieldIssue]:
    issues = []
    if not _NAME.match(alias):
        issues.append(
            FieldIssue(path, f"{alias!r} is not a valid alias", "use lowercase letters, digits, -")
        )
    if path == "alias":
        _raise(issues)
    return issues


def _tag_issues(tags: dict[str, str]) -> list[FieldIssue]:
    issues = []
    for key, value in tags.items():
        if not _NAME.match(key):
            issues.append(
                FieldIssue(f"tags.{key}", "tag keys are lowercase names", "e.g. stage=sft")
            )
        if len(value) > MAX_TAG_VALUE:
            issues.append(
                FieldIssue(f"tags.{key}", f"longer than {MAX_TAG_VALUE}", "shorten the value")
            )
    return issues


def _check_register(
    team: str,
    model: str,
    artifact: str,
    format: str,
    source: str,
    tags: dict[str, str],
    aliases: list[str],
) -> None:
    issues = []
    if not _NAME.match(model):
        issues.append(
            FieldIssue("model", f"{model!r} is not a valid model name", "use e.g. tiny-gpt")
        )
    if not _DIGEST.match(artifact):
        issues.append(FieldIssue("artifact", "not a 64-hex-digit digest", "push the files first"))
    if format not in FORMATS:
        issues.append(FieldIssue("format", f"unknown format {format!r}", f"one of {FORMATS}"))
    if source not in SOURCES:
        issues.append(FieldIssue("source", f"unknown source {source!r}", f"one of {SOURCES}"))
    issues += _tag_issues(tags)
    for i, alias in enumerate(aliases):
        issues += _check_alias(alias, f"aliases[{i}]")
    _raise(issues)


def _raise(issues: list[FieldIssue]) -> None:
    if issues:
        raise SpecError(issues)


_model_row = RowReader(ModelRecord, Model, given=("latest_version", "aliases"))
_version_row = RowReader(
    ModelVersionRecord,
    ModelVersion,
    convert={"metrics": dict},
    given=("team", "model", "parent", "tags", "aliases"),
)
