"""The image matrix (``matrix.yaml`` beside this module; ``images/matrix.yaml`` in the repo).

Each entry names one image: its flavour, Python, torch, CUDA and the pins that go with them.
``load_matrix()`` parses and validates the file once; every entry is checked against the
compatibility table (:mod:`tensoryard.images.compat`), so an impossible image is refused with
its reasons before anything is built.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tensoryard import envvars
from tensoryard.errors import ConfigError
from tensoryard.images.compat import Combination, incompatibilities

__all__ = [
    "DEFAULT_MATRIX",
    "FLAVOURS",
    "LAYERS",
    "MATRIX_ENV",
    "ImageEntry",
    "Matrix",
    "default_matrix",
    "load_matrix",
]

DEFAULT_MATRIX = Path(__file__).with_name("matrix.yaml")
FLAVOURS = ("train", "control-plane")
# Optional layers and the PyPI distribution each installs.
LAYERS = {
    "megatron-core": "megatron-core",
    "transformer-engine": "transformer-engine[pytorch]",
    "sglang": "sglang",
}
_KNOWN_FIELDS = {
    "description",
    "flavour",
    "python",
    "torch",
    "cuda",
    "cudnn",
    "nccl",
    "min_driver",
    "extras",
    "gpu",
    "layers",
    "prune",
    "prune_unlinked",
}


@dataclass(frozen=True)
class ImageEntry:
    """One image of the matrix. ``cuda=None`` with ``torch`` set: torch on the CPU."""

    name: str
    flavour: str
    python: str
    torch: str | None
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    min_driver: str | None = None
    extras: tuple[str, ...] = ()
    gpu: bool = False
    layers: dict[str, str] = field(default_factory=dict)
    prune: tuple[str, ...] = ()
    prune_unlinked: bool = False
    description: str = ""

    def combination(self) -> Combination | None:
        if self.torch is None:
            return None
        return Combination(
            torch=self.torch,
            python=self.python,
            cuda=self.cuda,
            cudnn=self.cudnn,
            nccl=self.nccl,
            min_driver=self.min_driver,
        )

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["extras"] = list(self.extras)
        data["prune"] = list(self.prune)
        return data

    def digest(self) -> str:
        """sha256 of the entry's canonical JSON (part of the build's cache key)."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Matrix:
    debian: str
    entries: dict[str, ImageEntry]

    def get(self, name: str) -> ImageEntry:
        try:
            return self.entries[name]
        except KeyError:
            known = ", ".join(self.entries)
            raise ConfigError(
                f"no image {name!r} in the matrix (known: {known}); "
                "pick one of those or add an entry to images/matrix.yaml"
            ) from None


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _entry(name: str, raw: Any, where: str) -> ImageEntry:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: an entry must be a mapping of fields")
    unknown = sorted(set(raw) - _KNOWN_FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    flavour = str(raw.get("flavour", "train"))
    if flavour not in FLAVOURS:
        raise ConfigError(f"{where}.flavour: {flavour!r}; use one of {', '.join(FLAVOURS)}")
    layers = {str(k): str(v) for k, v in (raw.get("layers") or {}).items()}
    bad_layers = sorted(set(layers) - set(LAYERS))
    if bad_layers:
        raise ConfigError(
            f"{where}.layers: unknown {', '.join(bad_layers)}; known: {', '.join(LAYERS)}"
        )
    entry = ImageEntry(
        name=name,
        flavour=flavour,
        python=str(raw.get("python", "3.11")),
        torch=_str_or_none(raw.get("torch")),
        cuda=_str_or_none(raw.get("cuda")),
        cudnn=_str_or_none(raw.get("cudnn")),
        nccl=_str_or_none(raw.get("nccl")),
        min_driver=_str_or_none(raw.get("min_driver")),
        extras=tuple(str(x) for x in raw.get("extras") or ()),
        gpu=bool(raw.get("gpu", False)),
        layers=layers,
        prune=tuple(str(x) for x in raw.get("prune") or ()),
        prune_unlinked=bool(raw.get("prune_unlinked", False)),
        description=str(raw.get("description", "")),
    )
    _check_entry(entry, where)
    return entry


def _check_entry(entry: ImageEntry, where: str) -> None:
    if entry.flavour == "train" and entry.torch is None:
        raise ConfigError(f"{where}.torch: a train image needs torch; set a version")
    if entry.prune_unlinked and entry.cuda is not None:
        raise ConfigError(
            f"{where}.prune_unlinked: only for CPU images (it drops CUDA files a GPU needs); "
            "remove it or set cuda: null"
        )
    if entry.gpu and entry.cuda is None:
        raise ConfigError(f"{where}.gpu: true needs a CUDA image; set cuda or gpu: false")
    combo = entry.combination()
    reasons = incompatibilities(combo) if combo else []
    if reasons:
        raise ConfigError(
            f"{where}: impossible combination:\n" + "\n".join(f"  - {r}" for r in reasons)
        )


def parse_matrix(data: Any, source: str = "matrix") -> Matrix:
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ConfigError(f"{source}: expected a mapping with 'entries:'")
    entries = {
        str(name): _entry(str(name), raw, f"{source}: entries.{name}")
        for name, raw in data["entries"].items()
    }
    return Matrix(debian=str(data.get("debian", "bookworm")), entries=entries)


def load_matrix(path: Path | str = DEFAULT_MATRIX) -> Matrix:
    """Read and validate a matrix file; raises ConfigError naming the entry and the fix."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the image matrix {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    return parse_matrix(data, str(path))


MATRIX_ENV = envvars.IMAGE_MATRIX.name


@cache
def default_matrix() -> Matrix:
    """The site's matrix (the file `$TYARD_IMAGE_MATRIX` names: its own registry's images and
    pins), else the one shipped with this tensoryard; read once."""
    site = os.environ.get(MATRIX_ENV)
    if site:
        try:
            return load_matrix(site)
        except ConfigError as exc:
            raise ConfigError(f"{MATRIX_ENV}: {exc}") from exc
    return load_matrix(DEFAULT_MATRIX)
