"""Routes of the model registry under /api/v1/models: models, versions, aliases, tags, lineage.

Models belong to teams and follow the team rules of ``access.py``: viewers read, members
register versions, move aliases and tag. Artifact bytes never travel through the API: a client
pushes them to the artifact store (``GET /artifacts`` names it) and registers the digest, or asks
the control plane to promote a job's checkpoint, which it pushes itself.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request
from pydantic import BaseModel, Field

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import INT32, Guard
from tensoryard.errors import FieldIssue, SpecError
from tensoryard.registry.service import ModelRegistry
from tensoryard.server.schemas import FromRecord, RedactedSpec
from tensoryard.spec.job import NAME_PATTERN
from tensoryard.store import ModelRecord, ModelVersionRecord

__all__ = ["add_model_routes"]

TeamName = Annotated[str, Path(pattern=NAME_PATTERN, description="Team name.")]
ModelName = Annotated[str, Path(pattern=NAME_PATTERN, description="Model name.")]
VersionRef = Annotated[
    str, Path(pattern=r"^([0-9]{1,9}|[a-z][a-z0-9-]{0,62})$", description="Version or alias.")
]
AliasName = Annotated[str, Path(pattern=NAME_PATTERN, description="Alias name.")]
VersionNo = Annotated[int, Path(ge=1, le=INT32, description="Version number.")]
DIGEST = r"^[0-9a-f]{64}$"


class VersionOut(FromRecord, record=ModelVersionRecord):
    team: str
    model: str
    version: int
    artifact: str
    size_bytes: int
    format: str
    source: str
    job_id: int | None
    checkpoint_step: int | None
    spec: RedactedSpec | None = Field(
        description="The training job's spec at promotion; env values are shown as ***."
    )
    code_revision: str
    data_manifest: str
    parent: str | None
    metrics: dict[str, Any] = Field(
        json_schema_extra={"x-not-secret": "numbers the job reported at the checkpoint's step"}
    )
    description: str
    created_at: datetime
    created_by: str
    tags: dict[str, str]
    aliases: list[str]

    @classmethod
    def of(cls, v: ModelVersionRecord) -> VersionOut:
        return cls(**{**v.__dict__, "aliases": list(v.aliases)})


class ModelOut(FromRecord, record=ModelRecord):
    team: str
    name: str
    description: str
    created_at: datetime
    created_by: str
    latest_version: int | None
    aliases: dict[str, int]

    @classmethod
    def of(cls, m: ModelRecord) -> ModelOut:
        return cls(**m.__dict__)


class ModelDetailOut(ModelOut):
    versions: list[VersionOut]


class LineageOut(BaseModel):
    version: VersionOut
    ancestors: list[VersionOut] = Field(description="Parent first, then its parent...")
    children: list[VersionOut] = Field(description="Versions whose parent is this one.")


class RegisterIn(BaseModel):
    """A new version: from an artifact already pushed (`artifact`) or from a job's checkpoint
    (`job_id`, optional `step`; the control plane pushes it). Lineage fields are optional."""

    artifact: str | None = Field(None, pattern=DIGEST, description="Manifest digest.")
    job_id: int | None = Field(None, ge=1, le=INT32)
    step: int | None = Field(None, ge=0, le=INT32, description="Checkpoint step (job_id).")
    format: str | None = Field(None, max_length=32)
    source: Literal["files", "hf-import"] = Field("files", description="For `artifact` only.")
    code_revision: str = Field("", max_length=128)
    data_manifest: str = Field("", max_length=128)
    parent: str | None = Field(None, max_length=140, description="VERSION or MODEL:VERSION.")
    metrics: dict[str, float] = Field(default_factory=dict, max_length=256)
    description: str = Field("", max_length=4096)
    tags: dict[str, str] = Field(default_factory=dict, max_length=64)
    aliases: list[str] = Field(default_factory=list, max_length=16)


class AliasIn(BaseModel):
    version: int = Field(..., ge=1, le=INT32)


class TagsIn(BaseModel):
    tags: dict[str, str] = Field(default_factory=dict, max_length=64)
    remove: list[str] = Field(default_factory=list, max_length=64)


class ArtifactsOut(BaseModel):
    url: str = Field(description="The artifact store clients push to before registering.")


class GcOut(BaseModel):
    """One artifact GC pass (registry/artifacts.py): what it kept and freed."""

    dry_run: bool = Field(description="True: counted only, nothing was changed.")
    chunks_kept: int = Field(
        description="Chunks a registered version, a young manifest or a "
        "running upload still references."
    )
    bytes_kept: int
    chunks_freed: int = Field(description="Chunks deleted: unreferenced for a grace period.")
    bytes_freed: int
    chunks_condemned: int = Field(description="Chunks newly found unreferenced.")
    chunks_waiting: int = Field(
        description="Unreferenced chunks inside their grace period; "
        "a pass after it frees them unless an upload uses them again."
    )
    manifests_deleted: int
    leases_expired: int = Field(description="Upload leases that had lapsed (crashed uploads).")
    grace_s: float = Field(description="The grace period between condemning and freeing.")


def add_model_routes(
    app: FastAPI,
    *,
    registry: ModelRegistry,
    guard: Guard,
    prefix: str,
    kick_webhooks: Callable[[], None] = lambda: None,
) -> None:
    """Register /models, /model-versions and /artifacts under `prefix`. The store writes each
    change's webhook events in its transaction; `kick_webhooks` wakes the delivery loop after
    the commit, so they go out at once."""
    store = registry.store

    tags: list[str | Enum] = ["models"]

    def can_read(request: Request, who: Principal, team: str, obj: str) -> None:
        store.get_team(team)
        guard.check(request, who, Action.MODEL_READ, team=team, obj=obj)

    @app.get(f"{prefix}/artifacts", tags=tags)
    def artifacts(request: Request, who: Principal = Depends(guard.user)) -> ArtifactsOut:
        """Where to push artifacts before registering them (any signed-in user)."""
        return ArtifactsOut(url=registry.artifacts.blobs.url)

    @app.post(f"{prefix}/artifacts/gc", tags=tags)
    def gc_artifacts(
        request: Request, dry_run: bool = False, who: Principal = Depends(guard.user)
    ) -> GcOut:
        """One garbage-collection pass over the artifact store, keeping every registered
        version's artifact (platform admins). Safe while uploads run: a chunk is freed only
        after staying unreferenced for the grace period, and never while an upload claims it."""
        guard.check(request, who, Action.ARTIFACT_GC, obj="artifacts")
        result = registry.gc(dry_run=dry_run)
        if not dry_run:
            detail = f"freed {result.chunks_deleted} chunks ({result.bytes_deleted} bytes)"
            store.record_audit(
                guard.context(request, who), str(Action.ARTIFACT_GC), "artifacts", detail=detail
            )
        return GcOut(
            dry_run=dry_run,
            chunks_kept=result.chunks_kept,
            bytes_kept=result.bytes_kept,
            chunks_freed=result.chunks_deleted,
            bytes_freed=result.bytes_deleted,
            chunks_condemned=result.chunks_condemned,
            chunks_waiting=result.chunks_waiting,
            manifests_deleted=result.manifests_deleted,
            leases_expired=result.leases_expired,
            grace_s=registry.artifacts.config.gc_grace_s,
        )

    @app.get(f"{prefix}/models", tags=tags)
    def list_models(
        request: Request,
        team: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
        who: Principal = Depends(guard.user),
    ) -> list[ModelOut]:
        """Models of the teams the caller can see (or of one team)."""
        if team is not None:
            can_read(request, who, team, f"team/{team}/models")
            teams: list[str] | None = [team]
        else:
            teams = who.visible_teams()
        return [ModelOut.of(m) for m in store.list_models(teams)]

    @app.get(f"{prefix}/models/{{team}}/{{name}}", tags=tags)
    def show_model(
        team: TeamName, name: ModelName, request: Request, who: Principal = Depends(guard.user)
    ) -> ModelDetailOut:
        """A model with its versions and aliases."""
        can_read(request, who, team, f"model/{team}/{name}")
        model = ModelOut.of(store.get_model(team, name))
        versions = [VersionOut.of(v) for v in store.list_versions(team, name)]
        return ModelDetailOut(**model.model_dump(), versions=versions)

    @app.post(f"{prefix}/models/{{team}}/{{name}}/versions", status_code=201, tags=tags)
    def register(
        team: TeamName,
        name: ModelName,
        body: RegisterIn,
        request: Request,
        who: Principal = Depends(guard.user),
    ) -> VersionOut:
        """Register the next version (team members). All of it is stored, or none."""
        store.get_team(team)
        guard.check(request, who, Action.MODEL_WRITE, team=team, obj=f"model/{team}/{name}")
        fields = body.model_dump(exclude={"artifact", "job_id", "step"}, exclude_defaults=True)
        audit = guard.context(request, who)
        if body.job_id is not None and body.artifact is None:
            fields.pop("source", None)  # a promoted checkpoint's source is "checkpoint"
            version = registry.register_checkpoint(
                team,
                name,
                body.job_id,
                step=body.step,
                created_by=who.name,
                audit=audit,
                **fields,
            )
        elif body.artifact is not None and body.job_id is None:
            version = registry.register_artifact(
                team, name, body.artifact, created_by=who.name, audit=audit, **fields
            )
        else:
            raise SpecError(
                [
                    FieldIssue(
                        "artifact",
                        "give exactly one of artifact and job_id",
                        "push files and pass their digest, or name the job to promote",
                    )
                ]
            )
        kick_webhooks()
        return VersionOut.of(version)

    @app.get(f"{prefix}/models/{{team}}/{{name}}/versions/{{ref}}", tags=tags)
    def show_version(
        team: TeamName,
        name: ModelName,
        ref: VersionRef,
        request: Request,
        who: Principal = Depends(guard.user),
    ) -> VersionOut:
        """One version, by number or alias."""
        can_read(request, who, team, f"model/{team}/{name}:{ref}")
        return VersionOut.of(store.get_version(team, name, ref))

    @app.get(f"{prefix}/models/{{team}}/{{name}}/versions/{{ref}}/lineage", tags=tags)
    def lineage(
        team: TeamName,
        name: ModelName,
        ref: VersionRef,
        request: Request,
        who: Principal = Depends(guard.user),
    ) -> LineageOut:
        """How a version was made (job, spec, code, data, ancestors) and what came of it."""
        can_read(request, who, team, f"model/{team}/{name}:{ref}")
        found = store.lineage(team, name, ref)
        return LineageOut(
            version=VersionOut.of(found.version),
            ancestors=[VersionOut.of(v) for v in found.ancestors],
            children=[VersionOut.of(v) for v in found.children],
        )

    @app.put(f"{prefix}/models/{{team}}/{{name}}/aliases/{{alias}}", tags=tags)
    def set_alias(
        team: TeamName,
        name: ModelName,
        alias: AliasName,
        body: AliasIn,
        request: Request,
        who: Principal = Depends(guard.user),
    ) -> VersionOut:
        """Point an alias at a version, moving it atomically (team members)."""
        store.get_team(team)
        guard.check(request, who, Action.MODEL_WRITE, team=team, obj=f"model/{team}/{name}")
        audit = guard.context(request, who)
        out = VersionOut.of(store.set_alias(team, name, alias, body.version, audit=audit))
        kick_webhooks()
        return out

    @app.delete(f"{prefix}/models/{{team}}/{{name}}/aliases/{{alias}}", status_code=204, tags=tags)
    def delete_alias(
        team: TeamName,
        name: ModelName,
        alias: AliasName,
        request: Request,
        who: Principal = Depends(guard.user),
    ) -> None:
        """Remove an alias (team members)."""
        store.get_team(team)
        guard.check(request, who, Action.MODEL_WRITE, team=team, obj=f"model/{team}/{name}")
        store.delete_alias(team, name, alias, audit=guard.context(request, who))
        kick_webhooks()

    @app.put(f"{prefix}/models/{{team}}/{{name}}/versions/{{version}}/tags", tags=tags)
    def set_tags(
        team: TeamName,
        name: ModelName,
        version: VersionNo,
        body: TagsIn,
        request: Request,
        who: Principal = Depends(guard.user),
    ) -> VersionOut:
        """Add, change or remove tags of a version (team members)."""
        store.get_team(team)
        guard.check(request, who, Action.MODEL_WRITE, team=team, obj=f"model/{team}/{name}")
        audit = guard.context(request, who)
        record = store.set_tags(team, name, version, body.tags, remove=body.remove, audit=audit)
        kick_webhooks()
        return VersionOut.of(record)

    @app.get(f"{prefix}/model-versions", tags=tags)
    def find_versions(
        request: Request,
        job_id: Annotated[int | None, Query(ge=1, le=INT32)] = None,
        data_manifest: Annotated[str | None, Query(max_length=128)] = None,
        artifact: Annotated[str | None, Query(pattern=DIGEST)] = None,
        who: Principal = Depends(guard.user),
    ) -> list[VersionOut]:
        """Versions made by a job, from a dataset (data manifest hash) or holding an artifact,
        in the teams the caller can see."""
        if job_id is None and data_manifest is None and artifact is None:
            raise SpecError(
                [
                    FieldIssue(
                        "query", "nothing to search by", "pass job_id, data_manifest or artifact"
                    )
                ]
            )
        found = store.find_versions(
            teams=who.visible_teams(), job_id=job_id, data_manifest=data_manifest, artifact=artifact
        )
        return [VersionOut.of(v) for v in found]
