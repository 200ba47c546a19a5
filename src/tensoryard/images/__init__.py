"""Base images, compatible by construction: the matrix, the compatibility table, references,
the daemonless builder and the in-image check. Imports: stdlib, PyYAML, ``tensoryard.errors``;
the builder calls debootstrap, umoci and skopeo as programs."""

from tensoryard.images.compat import Combination, incompatibilities
from tensoryard.images.matrix import ImageEntry, Matrix, default_matrix, load_matrix
from tensoryard.images.refs import ImageRefError, image_ref_for, resolve_image, validate_image_ref

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
