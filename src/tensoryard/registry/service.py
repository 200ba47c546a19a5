"""The model registry as a service: push the bytes, then record the version in one transaction.

Used by the control plane's routes (promotion of a job's checkpoint, registration of pushed
artifacts) and by tests. The order is the crash-safety rule: artifact chunks and manifest first
(content-addressed, idempotent, harmless if orphaned: GC takes them), the database rows last
and all together, so a version is never half-registered.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from blake3 import blake3

from tensoryard import envvars
from tensoryard.errors import DataError, FieldIssue, NotFound, SpecError
from tensoryard.registry.artifacts import ArtifactStore, GcResult
from tensoryard.registry.pruning import CheckpointPruner, job_paths
from tensoryard.registry.retention import RetentionPlan, RetentionPolicy
from tensoryard.spec.redact import redact_spec
from tensoryard.store import AuditContext, ModelVersionRecord, Store

__all__ = ["ModelRegistry", "data_manifest_hash", "detect_format", "lineage_from_spec"]

CODE_REVISION_ENV = envvars.CODE_REVISION.name
DATA_MANIFEST_ENV = envvars.DATA_MANIFEST.name


def detect_format(path: Path) -> str:
    """The checkpoint format of a file or directory (see docs/artifacts.md)."""
    if path.is_file():
        if path.suffix == ".safetensors":
            return "safetensors"
        return "state-dict" if path.suffix in (".pt", ".pth", ".bin") else "files"
    names = {p.name for p in path.rglob("*") if p.is_file()}
    suffixes = {Path(n).suffix for n in names}
    if "metadata.json" in names and "common.pt" in names:  # torch_dist: a DCP dir and more
        return "megatron-dist"
    if ".metadata" in names and ".distcp" in suffixes:
        return "dcp"
    if "config.json" in names and ".safetensors" in suffixes:
        return "hf"
    if ".safetensors" in suffixes:
        return "safetensors"
    if "state.pt" in names or suffixes & {".pt", ".pth"}:
        return "state-dict"
    return "files"


def data_manifest_hash(path: Path) -> str:
    """``blake3:<hex>`` of a prepared dataset's manifest.json (``tyard data prepare --out``),
    the value to record as a version's data manifest."""
    manifest = path / "manifest.json" if path.is_dir() else path
    try:
        return "blake3:" + blake3(manifest.read_bytes()).hexdigest()
    except OSError as exc:
        raise DataError(
            f"cannot read the dataset manifest {manifest}: {exc.strerror} (fix: pass the "
            "directory written by `tyard data prepare --out`, or the hash itself)"
        ) from exc


def lineage_from_spec(spec: dict[str, Any]) -> dict[str, str]:
    """Code revision and data manifest a job declared in its env (TYARD_CODE_REVISION,
    TYARD_DATA_MANIFEST); empty strings when it did not."""
    env = spec.get("env") or {}
    return {
        "code_revision": str(env.get(CODE_REVISION_ENV, "")),
        "data_manifest": str(env.get(DATA_MANIFEST_ENV, "")),
    }


class ModelRegistry:
    """Registers versions from pushed artifacts or from a job's checkpoints."""

    def __init__(
        self, store: Store, artifacts: ArtifactStore, *, protected: Sequence[Path] = ()
    ) -> None:
        self.store = store
        self.artifacts = artifacts
        # The control plane's own state directory: no checkpoint is ever read from there.
        self.protected = tuple(protected)

    def register_artifact(
        self, team: str, model: str, artifact: str, *, created_by: str, **fields: Any
    ) -> ModelVersionRecord:
        """Record a version for an artifact already pushed to this registry's store."""
        manifest = self.artifacts.manifest(artifact)  # NotFound names the store
        return self.store.register_version(
            team,
            model,
            artifact=artifact,
            size_bytes=manifest.total_bytes,
            created_by=created_by,
            **fields,
        )

    def register_checkpoint(
        self,
        team: str,
        model: str,
        job_id: int,
        *,
        created_by: str,
        step: int | None = None,
        metrics: dict[str, Any] | None = None,
        audit: AuditContext | None = None,
        **fields: Any,
    ) -> ModelVersionRecord:
        """Promote a job's checkpoint (``step``, default the newest) to a model version.

        Lineage comes from the job: its id, spec, code revision and data manifest (from its
        env), the checkpoint's step and the metrics reported at that step."""
        job = self.store.get_job(job_id)
        if job.team != team:
            raise SpecError(
                [
                    FieldIssue(
                        "job_id",
                        f"job {job_id} belongs to team {job.team!r}, not {team!r}",
                        f"register it under team {job.team!r}",
                    )
                ]
            )
        ckpt = self._checkpoint(job_id, step)
        # Checked again here (the report checked it too): a symlink may have appeared since.
        path = job_paths(job, self.protected).check(ckpt.path)
        if not path.exists():
            raise NotFound(
                f"checkpoint of step {ckpt.step} of job {job_id} is gone from {path} "
                "(fix: pick another step: `tyard jobs show` lists them)"
            )
        pushed = self.artifacts.push(path)
        lineage = {**lineage_from_spec(job.spec), **fields}
        return self.store.register_version(
            team,
            model,
            artifact=pushed.manifest.digest,
            size_bytes=pushed.bytes_total,
            created_by=created_by,
            format=fields.pop("format", None) or detect_format(path),
            source="checkpoint",
            job_id=job_id,
            checkpoint_step=ckpt.step,
            spec=redact_spec(job.spec),  # the registry keeps no secret (issue: lineage)
            metrics={**self._metrics_at(job_id, ckpt.step), **(metrics or {})},
            audit=audit,
            **{k: v for k, v in lineage.items() if k != "format"},
        )

    def apply_retention(
        self, job_id: int, policy: RetentionPolicy, *, dry_run: bool = False
    ) -> RetentionPlan:
        """Delete the job's checkpoints the policy does not keep (rows, then directories).

        Steps promoted to a model version and the newest checkpoint are always kept. The rows
        go first, in one transaction with a removal intent for each, so the database never
        points at a deleted directory and a crash before the directories are removed is
        finished by `CheckpointPruner.finish_pending` (see registry/pruning.py)."""
        return CheckpointPruner(self.store).apply(job_id, policy, dry_run=dry_run).plan

    def gc(self, *, dry_run: bool = False) -> GcResult:
        """One artifact GC pass keeping everything a registered version references
        (``dry_run``: count only, change nothing)."""
        return self.artifacts.gc(keep=self.store.registry_artifacts(), dry_run=dry_run)

    def _checkpoint(self, job_id: int, step: int | None) -> Any:
        checkpoints = self.store.list_checkpoints(job_id)
        if not checkpoints:
            raise NotFound(f"job {job_id} has reported no checkpoint yet (fix: wait for one)")
        if step is None:
            return max(checkpoints, key=lambda c: (c.step, c.ts))
        for ckpt in reversed(checkpoints):
            if ckpt.step == step:
                return ckpt
        steps = ", ".join(str(c.step) for c in checkpoints)
        raise NotFound(f"job {job_id} has no checkpoint at step {step} (it has: {steps})")

    def _metrics_at(self, job_id: int, step: int) -> dict[str, Any]:
        rows = [m for m in self.store.list_metrics(job_id) if m.step == step]
        return dict(rows[-1].values) if rows else {}
