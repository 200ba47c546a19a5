"""Registry references to files on this machine: MODEL[:VERSION|@ALIAS] -> a GGUF path.

The deployment's team owns the model (``tyard models register TEAM/MODEL file.gguf``). The
version's artifact is pulled from the artifact store (every chunk verified) once into
``cache/<digest>/``, written under a temporary name and renamed when complete, so a pull cut
short is never served; later deployments of the same version reuse it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tensoryard.errors import FieldIssue, NotFound, SpecError
from tensoryard.registry import ArtifactStore
from tensoryard.serving.source import ModelSource
from tensoryard.store import ModelVersionRecord, Store

__all__ = ["RegistryWeights", "ResolvedWeights"]


@dataclass(frozen=True)
class ResolvedWeights:
    path: Path
    ref: str  # the reference as given, with the version it resolved to: smollm2@prod -> v3
    pull_s: float  # 0 when the cache had it


class RegistryWeights:
    """Resolve registry references through the store and the artifact store."""

    def __init__(self, store: Store, artifacts: ArtifactStore, cache: Path) -> None:
        self.store = store
        self.artifacts = artifacts
        self.cache = cache

    def version(self, team: str, source: ModelSource) -> ModelVersionRecord:
        """The registry version a reference names (the newest when it names none); SpecError
        on the ``model`` field when the model, version or alias does not exist."""
        assert source.name is not None
        ref: str | int = source.version if source.version is not None else source.alias or ""
        if ref == "":
            ref = self._latest(team, source.name)
        try:
            return self.store.get_version(team, source.name, ref)
        except NotFound as exc:
            raise SpecError(
                [
                    FieldIssue(
                        "model",
                        str(exc),
                        f"`tyard models show {team}/{source.name}` lists its versions and "
                        "aliases; register one with `tyard models register`",
                    )
                ]
            ) from exc

    def resolve(self, team: str, source: ModelSource) -> ResolvedWeights:
        if source.path is not None:
            return ResolvedWeights(source.resolve(), source.ref, 0.0)
        version = self.version(team, source)
        manifest = self.artifacts.manifest(version.artifact)
        ggufs = [f.path for f in manifest.files if f.path.endswith(".gguf")]
        if len(ggufs) != 1:
            raise SpecError(
                [
                    FieldIssue(
                        "model",
                        f"{team}/{source.name}:{version.version} holds "
                        f"{len(ggufs)} .gguf files (llama.cpp serves exactly one)",
                        "register a version whose artifact is one GGUF file",
                    )
                ]
            )
        dest = self.cache / version.artifact
        started = time.monotonic()
        pulled = 0.0
        if self.artifacts.pull_into(version.artifact, dest):
            pulled = time.monotonic() - started
        return ResolvedWeights(
            dest / ggufs[0], f"{source.ref} (version {version.version})", round(pulled, 3)
        )

    def _latest(self, team: str, model: str) -> int:
        try:
            versions = self.store.list_versions(team, model)
        except NotFound as exc:
            raise SpecError(
                [
                    FieldIssue(
                        "model",
                        str(exc),
                        f"register it: `tyard models register {team}/{model} FILE.gguf`",
                    )
                ]
            ) from exc
        if not versions:
            raise SpecError([FieldIssue("model", f"{team}/{model} has no versions", "")])
        return max(v.version for v in versions)
