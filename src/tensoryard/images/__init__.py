"""Base images, compatible by construction: the matrix, the compatibility table, references,
the daemonless builder and the in-image check. Imports: stdlib, PyYAML, ``tensoryard.errors``;
the builder calls debootstrap, umoci and skopeo as programs.

The names below are imported on first use, so a module of this package that needs only the
standard library (``preflight``, the first thing a training pod runs) starts fast."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensoryard.images.compat import Combination, incompatibilities
    from tensoryard.images.matrix import ImageEntry, Matrix, default_matrix, load_matrix
    from tensoryard.images.refs import (
        ImageRefError,
        image_ref_for,
        resolve_image,
        validate_image_ref,
    )

__all__ = [
    "Combination",
    "ImageEntry",
    "ImageRefError",
    "Matrix",
    "default_matrix",
    "image_ref_for",
    "incompatibilities",
    "load_matrix",
    "resolve_image",
    "validate_image_ref",
]

_HOME = {
    "Combination": "compat",
    "incompatibilities": "compat",
    "ImageEntry": "matrix",
    "Matrix": "matrix",
    "default_matrix": "matrix",
    "load_matrix": "matrix",
    "ImageRefError": "refs",
    "image_ref_for": "refs",
    "resolve_image": "refs",
    "validate_image_ref": "refs",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tensoryard.images.{module}"), name)
    globals()[name] = value
    return value
