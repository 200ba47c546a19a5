"""Artifacts, checkpoints as artifacts, and the model registry's storage side.

``ArtifactStore`` keeps content-defined, BLAKE3-named chunks and manifests on a ``BlobStore``
(a local directory through fsspec by default, ``s3://`` through boto3). The model registry's
rows (models, versions, aliases, tags, lineage) live in the tensoryard database
(:mod:`tensoryard.store`); versions point at artifact manifests by digest.
"""

from tensoryard.registry.artifacts import (
    ArtifactConfig,
    ArtifactStore,
    ChunkRef,
    FileEntry,
    GcResult,
    IntegrityError,
    Manifest,
    PushResult,
)
from tensoryard.registry.blobs import BlobInfo, BlobStore, FsspecBlobs, S3Blobs, open_blobs

__all__ = [
    "ArtifactConfig",
    "ArtifactStore",
    "BlobInfo",
    "BlobStore",
    "ChunkRef",
    "FileEntry",
    "FsspecBlobs",
    "GcResult",
    "IntegrityError",
    "Manifest",
    "PushResult",
    "S3Blobs",
    "open_blobs",
]
